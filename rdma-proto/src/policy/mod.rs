//! The receiver's and the sender's decisions, without I/O: who gets a connection place
//! ([`places`]) and a session seat ([`seats`]), which partials a receiver keeps and gives up
//! ([`partials`]), whose knock it takes ([`knock`]), when a failed send is tried again and
//! after how long ([`retry`]), and the embedder's own rule on each offer ([`Policy`]).
//!
//! Each takes its inputs and the time (an `Instant` or a `SystemTime` the caller read) and
//! says what to do; none reads a clock, a file or a device. So every rule here is tested
//! without a device, in unit tests and in the seeded simulation of `rdma-proto/tests`, and the
//! driver (`rdma_proto::driver`, feature `driver`) only carries the decisions out.

pub mod knock;
pub mod limits;
mod offer;
pub mod partials;
pub mod places;
pub mod proofs;
pub mod retry;
pub mod seats;

pub use offer::{Decision, Offer, Policy};

/// How a decision wakes the connection or session it concerns (a place given to a newer
/// connection, a seat handed over): the driver's is an `eventfd` the session's idle wait
/// sleeps on, so that no session looks at its state on a clock. `()` wakes nobody (tests that
/// look at the state instead).
pub trait Signal: Send + Sync {
    /// A signal not rung yet.
    fn new() -> Self
    where
        Self: Sized;
    /// Wakes whoever waits on it.
    fn ring(&self);
}

impl Signal for () {
    fn new() {}
    fn ring(&self) {}
}
