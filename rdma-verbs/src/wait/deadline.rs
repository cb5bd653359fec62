//! [`Deadline`]: the end of a wait, from a timeout that may be "forever".

use std::time::{Duration, Instant};

/// When a wait gives up: a timeout turned into a point in time once, at the start of the wait,
/// and handed down as that point to the `poll(2)` (or the `timerfd`) that sleeps until it.
///
/// Every blocking wait of this crate (and of `rdma-cm`) takes a [`Duration`] or a `Deadline`.
/// A timeout too large to be added to [`Instant::now`], such as [`Duration::MAX`], means **no
/// deadline**: the wait lasts until what it waits for happens. Nothing panics on such a
/// timeout.
///
/// A deadline remembers the timeout it was made from ([`timeout`](Self::timeout)): the wait
/// that finds it passed builds its `Timeout` error with that, so the error says the caller's
/// bound however many calls the deadline crossed, and no layer above rewrites it.
///
/// ```
/// use std::time::Duration;
/// use rdma_verbs::Deadline;
///
/// assert_eq!(Deadline::after(Duration::MAX).remaining(), Duration::MAX);
/// assert!(Deadline::after(Duration::ZERO).has_passed());
/// assert_eq!(Deadline::after(Duration::from_secs(5)).timeout(), Duration::from_secs(5));
/// ```
///
/// Two deadlines are equal when they end at the same instant (or both never end), whatever
/// timeouts they remember.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Option<Instant>,
    /// The timeout it was made from; [`Duration::MAX`] without a deadline.
    timeout: Duration,
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Deadline {}

impl Deadline {
    /// `timeout` from now; no deadline when `now + timeout` cannot be represented.
    pub fn after(timeout: Duration) -> Self {
        match Instant::now().checked_add(timeout) {
            Some(at) => Deadline { at: Some(at), timeout },
            None => Deadline::never(),
        }
    }

    /// At `instant` (its [`timeout`](Self::timeout) is the time from now until then).
    pub fn at(instant: Instant) -> Self {
        Deadline { at: Some(instant), timeout: instant.saturating_duration_since(Instant::now()) }
    }

    /// No deadline at all.
    pub fn never() -> Self {
        Deadline { at: None, timeout: Duration::MAX }
    }

    /// The instant, or `None` for no deadline.
    pub fn instant(&self) -> Option<Instant> {
        self.at
    }

    /// The timeout the deadline was made from: what a wait that ran out of it reports
    /// ([`Duration::MAX`] without a deadline).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same deadline `by` later, reporting the same [`timeout`](Self::timeout): for a wait
    /// that gives a timer of its own (the kernel's) the chance to end it first.
    #[must_use]
    pub fn extended(self, by: Duration) -> Deadline {
        match self.at.and_then(|at| at.checked_add(by)) {
            Some(at) => Deadline { at: Some(at), timeout: self.timeout },
            None => Deadline::never(),
        }
    }

    /// The time left: zero once passed, [`Duration::MAX`] without a deadline.
    pub fn remaining(&self) -> Duration {
        self.at.map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed (never, without one).
    pub fn has_passed(&self) -> bool {
        self.at.is_some_and(|d| Instant::now() >= d)
    }

    /// The earlier of two deadlines (no deadline is the latest), with its own timeout.
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        match (self.at, other.at) {
            (Some(a), Some(b)) if b < a => other,
            (Some(_), _) => self,
            (None, _) => other,
        }
    }

    /// The time left as the timeout of `poll(2)` through rustix: `None` (wait forever) without a
    /// deadline.
    pub(crate) fn poll_timeout(&self) -> Option<rustix::event::Timespec> {
        self.at.map(|_| timespec(self.remaining()))
    }

    /// The time left as a `poll(2)` timeout: milliseconds rounded up, `-1` (wait forever)
    /// without a deadline, at most `c_int::MAX`.
    pub fn poll_timeout_ms(&self) -> libc::c_int {
        match self.at {
            None => -1,
            Some(_) => {
                let left = self.remaining();
                let ms = left.as_millis() + u128::from(left.subsec_nanos() % 1_000_000 != 0);
                libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX)
            }
        }
    }
}

impl From<Duration> for Deadline {
    /// [`Deadline::after`]: a call that takes `impl Into<Deadline>` takes a timeout or a
    /// deadline.
    fn from(timeout: Duration) -> Self {
        Deadline::after(timeout)
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
            assert_eq!(d.timeout(), Duration::MAX);
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
        assert_eq!(soon.min(late).timeout(), Duration::from_secs(1), "the earlier one's timeout");
    }

    /// Deadlines ending at one instant are equal, whatever timeout each remembers.
    #[test]
    fn deadlines_at_one_instant_are_equal() {
        let i = Instant::now() + Duration::from_secs(10);
        let first = Deadline::at(i);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(first, Deadline::at(i));
        assert_ne!(first, Deadline::at(i + Duration::from_nanos(1)));
    }

    /// The timeout a deadline reports is the one it was made from, however late it is asked
    /// and however far it is extended.
    #[test]
    fn a_deadline_reports_the_timeout_it_was_made_from() {
        let d = Deadline::after(Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(d.timeout(), Duration::from_millis(30));
        let later = d.extended(Duration::from_millis(50));
        assert_eq!(later.timeout(), Duration::from_millis(30));
        assert_eq!(later.instant(), d.instant().map(|i| i + Duration::from_millis(50)));
        assert_eq!(Deadline::never().extended(Duration::from_secs(1)), Deadline::never());
        let at = Deadline::at(Instant::now() + Duration::from_secs(2));
        assert!(at.timeout() <= Duration::from_secs(2) && at.timeout() > Duration::from_secs(1));
    }
}
