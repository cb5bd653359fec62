//! How long a wait spins before it sleeps: [`WaitPolicy`]; and how long one sleep on a shared
//! channel lasts at most ([`SHARED_CHANNEL_SLICE`]).

use std::time::Duration;

/// How a blocking wait of this crate waits for completions: it spins (polls without a system
/// call) for a budget, then sleeps on the completion channel (see [`CqWaiter`](crate::CqWaiter)).
///
/// The spin budget trades CPU for latency: a completion that comes within it is taken at once;
/// one that comes later costs a wake-up (tens of microseconds on hardware, more under
/// emulation). A waiting thread burns a core for at most the budget, then sleeps.
///
/// ```
/// use std::time::Duration;
/// use rdma_verbs::WaitPolicy;
///
/// assert_eq!(WaitPolicy::default().spin(), WaitPolicy::DEFAULT_SPIN);
/// assert_eq!(WaitPolicy::sleep_at_once().spin(), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    spin: Duration,
}

impl WaitPolicy {
    /// The default spin budget: 50 µs, about one round trip of a small message on a RoCE NIC,
    /// so that a ping-pong on hardware is answered while spinning, while an idle wait sleeps
    /// after a twenty-thousandth of a second.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

    /// Spins for `spin` before sleeping. [`Duration::MAX`] spins until the deadline: the
    /// lowest latency, a whole core per waiting thread.
    pub const fn spin_then_sleep(spin: Duration) -> Self {
        WaitPolicy { spin }
    }

    /// Sleeps as soon as a poll finds nothing (arming first, then polling once more), as
    /// rdma-core's `ibv_rc_pingpong -e` does.
    pub const fn sleep_at_once() -> Self {
        WaitPolicy { spin: Duration::ZERO }
    }

    /// The spin budget.
    pub const fn spin(&self) -> Duration {
        self.spin
    }
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::spin_then_sleep(Self::DEFAULT_SPIN)
    }
}

/// The longest one sleep of [`CqWaiter::idle`](crate::CqWaiter::idle) lasts on a channel that CQs outside the loop
/// also report to (their waits may read its events), and of a [`CqWaiter::wait`](crate::CqWaiter::wait) that could not
/// register with its channel.
pub const SHARED_CHANNEL_SLICE: Duration = Duration::from_millis(10);
