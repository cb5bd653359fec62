//! [`Flag`]: a switch one thread or task sets and a session's wait hears at once; and `Bell`,
//! the driver's own wake-up of a waiting loop by another.
//!
//! A session sleeps until a completion, its connection's CM event, one of these, or its
//! machine's next deadline: no periodic wake-up looks at them ([`docs/protocol.md`, "Speed, and
//! the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a loop looks at a flag or bell that has no `eventfd` (the process ran out of file
/// descriptors when it was made): it cannot wake a sleep, so the sleep is this long at most.
pub(crate) const UNWAKEABLE_CHECK: Duration = Duration::from_millis(100);

/// An `eventfd` that one side writes to wake a loop asleep on it (`poll(2)`, or the tokio
/// reactor), and the loop reads to hear it: a counter of rings not heard yet.
#[derive(Debug)]
pub(crate) struct Bell {
    /// `None` when no eventfd could be made: the loop then looks every [`UNWAKEABLE_CHECK`].
    fd: Option<OwnedFd>,
}

impl Bell {
    /// A new bell (non-blocking, close-on-exec).
    pub(crate) fn new() -> Self {
        use rustix::event::{eventfd, EventfdFlags};
        let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC);
        if let Err(e) = &fd {
            tracing::warn!(error = %e, "no eventfd for a wake-up: its loop looks every 100 ms instead");
        }
        Bell { fd: fd.ok() }
    }

    /// Wakes the loop: its fd is readable until [`heard`](Self::heard).
    pub(crate) fn ring(&self) {
        if let Some(fd) = &self.fd {
            // Only a counter at its maximum refuses (EAGAIN), and that one is readable already.
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }

    /// Takes the rings so far: the fd is quiet again until the next [`ring`](Self::ring).
    pub(crate) fn heard(&self) {
        if let Some(fd) = &self.fd {
            let mut count = [0u8; 8];
            let _ = rustix::io::read(fd, &mut count);
        }
    }

    /// The fd a loop sleeps on, or `None` when the bell has none (see [`UNWAKEABLE_CHECK`]).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }
}

/// A switch set once, from any thread, task or signal-handling thread, to end what waits on it:
/// [`SendOptions::cancel`](super::SendOptions::cancel) and
/// [`ReceiveOptions::stop`](super::ReceiveOptions::stop). Setting it wakes the sessions (and
/// the accept loop) asleep on it at once. Clones share the switch; it cannot be reset. A flag
/// belongs to one process: after `fork`, the child shares its `eventfd` but not its switch, so
/// make the child's flags anew.
///
/// ```
/// use rdma_proto::driver::Flag;
///
/// let stop = Flag::new();
/// let seen = stop.clone();
/// std::thread::spawn(move || stop.set()).join().unwrap();
/// assert!(seen.is_set());
/// ```
#[derive(Debug, Clone)]
pub struct Flag(Arc<FlagState>);

#[derive(Debug)]
struct FlagState {
    set: AtomicBool,
    /// Rung when set, and never heard: readable from then on.
    bell: Bell,
}

impl Flag {
    /// A flag not set. It holds an `eventfd` (without one, when the process has no file
    /// descriptor left, the loops that wait on it look at it every 100 ms instead).
    pub fn new() -> Self {
        Flag(Arc::new(FlagState { set: AtomicBool::new(false), bell: Bell::new() }))
    }

    /// Sets the flag, and wakes whatever waits on it. Setting it again does nothing more.
    pub fn set(&self) {
        if !self.0.set.swap(true, Ordering::AcqRel) {
            self.0.bell.ring();
        }
    }

    /// Whether the flag was set.
    pub fn is_set(&self) -> bool {
        self.0.set.load(Ordering::Acquire)
    }

    /// The fd that turns readable when the flag is set (and stays so), or `None`.
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.0.bell.fd()
    }
}

impl Default for Flag {
    fn default() -> Self {
        Flag::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable now (a deadline already passed: one look).
    fn readable(fd: BorrowedFd<'_>) -> bool {
        let now = rdma_verbs::Deadline::after(Duration::ZERO);
        rdma_verbs::wait::poll_readable(fd, now).unwrap()
    }

    #[test]
    fn a_flag_set_anywhere_is_seen_and_its_fd_stays_readable() {
        let flag = Flag::new();
        let fd = flag.fd().expect("an eventfd");
        assert!(!flag.is_set() && !readable(fd));
        let other = flag.clone();
        std::thread::spawn(move || other.set()).join().unwrap();
        assert!(flag.is_set());
        assert!(readable(fd) && readable(fd), "set for good");
        flag.set();
        assert!(flag.is_set());
    }

    #[test]
    fn a_bell_is_readable_from_its_ring_until_heard() {
        let bell = Bell::new();
        let fd = bell.fd().expect("an eventfd");
        assert!(!readable(fd));
        bell.ring();
        bell.ring();
        assert!(readable(fd));
        bell.heard();
        assert!(!readable(fd), "both rings heard at once");
        bell.heard();
        bell.ring();
        assert!(readable(fd));
    }
}
