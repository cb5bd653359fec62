//! [`Deadline`]: the end of a wait, from a timeout that may be "forever".

use std::time::{Duration, Instant};

/// When a wait gives up: a timeout turned into a point in time once, at the start of the wait.
///
/// Every wait of this crate (and of `rdma-cm`) takes a [`Duration`]. A timeout too large to be
/// added to [`Instant::now`], such as [`Duration::MAX`], means **no deadline**: the wait lasts
/// until what it waits for happens. Nothing panics on such a timeout.
///
/// ```
/// use std::time::Duration;
/// use rdma_verbs::Deadline;
///
/// assert_eq!(Deadline::after(Duration::MAX).remaining(), Duration::MAX);
/// assert!(Deadline::after(Duration::ZERO).has_passed());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now; no deadline when `now + timeout` cannot be represented.
    pub fn after(timeout: Duration) -> Self {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// At `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(Some(instant))
    }

    /// No deadline at all.
    pub fn never() -> Self {
        Deadline(None)
    }

    /// The instant, or `None` for no deadline.
    pub fn instant(&self) -> Option<Instant> {
        self.0
    }

    /// The time left: zero once passed, [`Duration::MAX`] without a deadline.
    pub fn remaining(&self) -> Duration {
        self.0.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed (never, without one).
    pub fn has_passed(&self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }

    /// The earlier of two deadlines (no deadline is the latest).
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Deadline(Some(a.min(b))),
            (a, b) => Deadline(a.or(b)),
        }
    }

    /// The time left as the timeout of `poll(2)` through rustix: `None` (wait forever) without a
    /// deadline.
    pub(crate) fn poll_timeout(&self) -> Option<rustix::event::Timespec> {
        self.0.map(|_| timespec(self.remaining()))
    }

    /// The time left as a `poll(2)` timeout: milliseconds rounded up, `-1` (wait forever)
    /// without a deadline, at most `c_int::MAX`.
    pub fn poll_timeout_ms(&self) -> libc::c_int {
        match self.0 {
            None => -1,
            Some(_) => {
                let left = self.remaining();
                let ms = left.as_millis() + u128::from(left.subsec_nanos() % 1_000_000 != 0);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
        }
    }
}

/// `d` as a `struct timespec` (saturating at `i64::MAX` seconds).
pub(crate) fn timespec(d: Duration) -> rustix::event::Timespec {
    rustix::event::Timespec { tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX), tv_nsec: d.subsec_nanos().into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_timeouts_mean_no_deadline() {
        for t in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let d = Deadline::after(t);
            assert_eq!(d, Deadline::never());
            assert!(!d.has_passed());
            assert_eq!(d.poll_timeout_ms(), -1);
        }
    }

    #[test]
    fn finite_timeouts_round_up_to_milliseconds() {
        let d = Deadline::after(Duration::from_micros(1500));
        assert!((1..=2).contains(&d.poll_timeout_ms()), "{}", d.poll_timeout_ms());
        let d = Deadline::after(Duration::from_secs(60 * 60 * 24 * 365 * 100));
        assert_eq!(d.poll_timeout_ms(), libc::c_int::MAX);
        assert!(Deadline::after(Duration::ZERO).has_passed());
        assert_eq!(Deadline::after(Duration::ZERO).poll_timeout_ms(), 0);
    }

    #[test]
    fn min_is_the_earlier_and_never_is_the_latest() {
        let (soon, late) = (Deadline::after(Duration::from_secs(1)), Deadline::after(Duration::from_secs(9)));
        assert_eq!(soon.min(late), soon);
        assert_eq!(late.min(soon), soon);
        assert_eq!(Deadline::never().min(late), late);
        assert_eq!(late.min(Deadline::never()), late);
        assert_eq!(Deadline::never().min(Deadline::never()), Deadline::never());
    }
}
