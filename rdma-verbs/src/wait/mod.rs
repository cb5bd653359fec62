//! How every wait of this crate, and of `rdma-cm`, waits: the one home of the rules.
//!
//! - [`Deadline`]: a timeout turned into a point in time once; `Duration::MAX` is no deadline.
//! - [`WaitPolicy`]: how long a wait spins before it sleeps.
//! - [`CqWaiter`]: the steps of a wait for completions (spin, arm, poll once more, sleep on
//!   every completion channel of its CQs), blocking and async, and a polling loop's idle step.
//!   [`CompletionQueue::poll_wait`], [`RecvRing`], [`SendQueue`] and [`PostScope`] wait with one.
//! - [`poll_readable`]: a blocking wait on one non-blocking fd (`poll(2)`), and `Readiness`
//!   (feature `tokio`): one async wait's registration of a duplicate of the fd with the current
//!   runtime's reactor. Every other wait of this crate (the async-event fd, a completion channel
//!   read directly) and every wait of `rdma-cm` on its event channel goes through these two.
//! - [`Sleepers`]: the waits asleep on a fd several readers share, which a reader that took an
//!   event wakes, so that none misses an event another took (completion channels and rdma-cm's
//!   event channels keep one each).
//! - Deadlines of async waits are a `timerfd` on the reactor, not tokio timers: a runtime
//!   built without time works.
//!
//! Inside (the files of `src/wait/`): the threads and tasks asleep on a channel and how a wait
//! that read another's event wakes them (`sleepers.rs`). How a QP's requests are taken out of
//! the device's reach before it, or what it points at, goes away is the QP's (`qp/quiesce.rs`).
//!
//! [`CompletionQueue::poll_wait`]: crate::CompletionQueue::poll_wait
//! [`RecvRing`]: crate::RecvRing
//! [`SendQueue`]: crate::SendQueue
//! [`PostScope`]: crate::PostScope

pub(crate) mod deadline;
pub(crate) mod fd;
mod policy;
#[cfg(feature = "tokio")]
pub(crate) mod reactor;
pub(crate) mod sleepers;
mod waiter;

pub use deadline::Deadline;
pub use fd::poll_readable;
pub use policy::{WaitPolicy, SHARED_CHANNEL_SLICE};
#[cfg(feature = "tokio")]
pub use reactor::{Readiness, Ready};
#[cfg(feature = "tokio")]
pub use sleepers::Woken;
pub use sleepers::{Sleeper, Sleepers};
pub use waiter::{CqWaiter, Idle};
