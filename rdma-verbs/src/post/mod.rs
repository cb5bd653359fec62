//! The posting engine: what every posting layer ([`PostScope`](crate::PostScope),
//! [`WrBatch`](crate::WrBatch), [`SendQueue`](crate::SendQueue), [`RecvRing`](crate::RecvRing),
//! the raw posts of [`QueuePair`](crate::QueuePair) and
//! [`SharedReceiveQueue`](crate::SharedReceiveQueue)) hands its requests to the provider
//! through. The layers differ in who owns the buffers (borrowed for a scope, owned by slots);
//! the calls and what a refused post leaves posted are the same for all:
//! - [`op`]: the operations, as plain data, and the one map from an operation to
//!   [`SendOps`];
//! - [`raw`]: the only calls of `ibv_wr_*` and of the `ibv_post_*` chains, each returning a
//!   [`Posted`](raw::Posted), and the rule of what may still be posted after a refusal.

pub(crate) mod op;
pub(crate) mod raw;

pub use op::SendOps;
