//! How every wait of this crate waits: the one home of the rules.
//!
//! - [`Deadline`] (`deadline.rs`): a timeout turned into a point in time once; `Duration::MAX`
//!   is no deadline.
//! - [`WaitPolicy`] (`policy.rs`): how long a wait spins before it sleeps.
//! - [`CqWaiter`] (`waiter.rs`): the steps of a wait for completions (spin, arm, poll once more,
//!   sleep on the completion channels), blocking and async, and a polling loop's idle step.
//! - `sleepers.rs`: the threads and tasks asleep on a channel, and how a wait that read another's
//!   event wakes them.
//! - `reactor.rs` (feature `tokio`): a verbs fd's registration with the tokio reactor, one per
//!   sleep, and deadlines as a `timerfd` on the reactor (no tokio timer needed).
//! - `fd.rs`: blocking waits on a single verbs fd (the async-event fd, a channel read directly)
//!   and the non-blocking flag every such fd gets.
//! - `quiesce.rs`: how a QP's requests are taken out of the device's reach before it, or what it
//!   points at, goes away.
//!
//! The resources wait through these and nothing else: [`CompletionChannel`] holds its sleepers,
//! [`CompletionQueue::poll_wait`], [`RecvRing`], [`SendQueue`] and [`PostScope`] wait with a
//! [`CqWaiter`].
//!
//! [`CompletionChannel`]: crate::CompletionChannel
//! [`CompletionQueue::poll_wait`]: crate::CompletionQueue::poll_wait
//! [`RecvRing`]: crate::RecvRing
//! [`SendQueue`]: crate::SendQueue
//! [`PostScope`]: crate::PostScope

pub(crate) mod deadline;
pub(crate) mod fd;
mod policy;
pub(crate) mod quiesce;
#[cfg(feature = "tokio")]
pub(crate) mod reactor;
pub(crate) mod sleepers;
mod waiter;

pub use deadline::Deadline;
pub use policy::{WaitPolicy, SHARED_CHANNEL_SLICE};
pub use waiter::{CqWaiter, Idle};
