//! How every wait of this crate, of `rdma-cm` and of `rdma-proto`'s driver waits: the one home
//! of the rules.
//!
//! - [`Deadline`]: a timeout turned into a point in time once, at the start of a wait, and
//!   handed down as that point through every call to the `poll(2)` or `timerfd` that sleeps
//!   until it; `Duration::MAX` is no deadline. The wait that finds it passed builds the
//!   `Timeout` error, naming what it waited for and the deadline's timeout; no layer above
//!   rewrites it.
//! - [`WaitPolicy`]: how long a wait spins before it sleeps.
//! - [`CqWaiter`]: the steps of a wait for completions (spin, arm, poll once more, sleep on
//!   every completion channel of its CQs), blocking and async, and a polling loop's idle step.
//!   [`CompletionQueue::poll_wait`], [`RecvRing`], [`SendQueue`] and [`PostScope`] wait with one.
//! - [`poll_fds`]: the one function that sleeps on file descriptors (`poll(2)`); every blocking
//!   fd wait of these crates is a call of it ([`poll_readable`] for one fd, [`Sleeper::sleep`]).
//! - `Readiness` (feature `tokio`): one async wait's registration of a duplicate of a fd with
//!   the current runtime's reactor; every async fd wait of these crates is one.
//! - `timeout_at` (feature `tokio`): an async deadline, as a `timerfd` on the reactor, not a
//!   tokio timer: a runtime built without its time driver works everywhere. Every async wait
//!   with a deadline ends through it.
//! - [`ready_once`]: the executor of a body written once as an `async fn` for a blocking and an
//!   async form, run in its blocking form (`rdma-cm`'s pending operations, `rdma-proto`'s
//!   driver): every wait blocks inside its call, so one poll finishes it.
//! - [`Sleepers`]: the waits asleep on a fd several readers share, which a reader that took an
//!   event wakes, so that none misses an event another took (completion channels and rdma-cm's
//!   event channels keep one each).
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
mod ready_once;
pub(crate) mod sleepers;
mod waiter;

pub use deadline::Deadline;
pub use fd::{poll_fds, poll_readable};
pub use policy::{WaitPolicy, SHARED_CHANNEL_SLICE};
#[cfg(feature = "tokio")]
pub use reactor::{timeout_at, Readiness, Ready};
pub use ready_once::ready_once;
#[cfg(feature = "tokio")]
pub use sleepers::Woken;
pub use sleepers::{Sleeper, Sleepers};
pub use waiter::{CqWaiter, Idle};
