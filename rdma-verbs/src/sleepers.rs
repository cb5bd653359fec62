//! The threads asleep on a completion channel, and how a wait that read an event for a CQ it
//! does not wait for wakes them (see [`CqWaiter`](crate::CqWaiter)).
//!
//! Each sleeping thread polls its channel's fd and its own `eventfd` (one per thread, made on
//! its first sleep). It registers that eventfd with the channel before its last poll of the
//! CQs and removes it when it wakes; a wait that reads a foreign event writes to every eventfd
//! registered, so the thread whose completion it was steps again.

use std::cell::OnceCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::waiter::Channels;

/// The most threads one channel registers at once; more sleep sliced instead
/// ([`SHARED_CHANNEL_SLICE`](crate::SHARED_CHANNEL_SLICE)).
const MAX_SLEEPERS: usize = 16;

/// The eventfds of the threads asleep on one channel.
#[derive(Debug)]
pub(crate) struct Sleepers {
    /// Taken only on the way into and out of a sleep, and by a wait that read a foreign event:
    /// never per request.
    fds: Mutex<[RawFd; MAX_SLEEPERS]>,
    /// How many are registered: a wake with none to wake takes no lock.
    count: AtomicUsize,
    /// The async waits asleep on the channel (feature `tokio`): an event read by a blocking
    /// wait, or by a task on another worker, before the reactor saw the fd readable is never
    /// reported to them (epoll is edge-triggered), so they are woken here too.
    #[cfg(feature = "tokio")]
    tasks: tokio::sync::Notify,
}

impl Default for Sleepers {
    fn default() -> Self {
        Sleepers {
            fds: Mutex::new([-1; MAX_SLEEPERS]),
            count: AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            tasks: tokio::sync::Notify::new(),
        }
    }
}

impl Sleepers {
    fn fds(&self) -> std::sync::MutexGuard<'_, [RawFd; MAX_SLEEPERS]> {
        self.fds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `fd`; `false` when the table is full.
    fn add(&self, fd: RawFd) -> bool {
        let mut fds = self.fds();
        let Some(free) = fds.iter_mut().find(|f| **f < 0) else { return false };
        *free = fd;
        self.count.fetch_add(1, Ordering::AcqRel);
        true
    }

    fn remove(&self, fd: RawFd) {
        let mut fds = self.fds();
        if let Some(f) = fds.iter_mut().find(|f| **f == fd) {
            *f = -1;
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The async waits' wake-up: a wait enables a `notified()` of it before its last step.
    #[cfg(feature = "tokio")]
    pub(crate) fn tasks(&self) -> &tokio::sync::Notify {
        &self.tasks
    }

    /// Wakes every registered sleeper but `me`, and every async wait asleep on the channel.
    pub(crate) fn wake_all(&self, me: Option<RawFd>) {
        #[cfg(feature = "tokio")]
        self.tasks.notify_waiters();
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        for &fd in self.fds().iter().filter(|&&f| f >= 0 && Some(f) != me) {
            let one = 1u64;
            // SAFETY: `fd` is the eventfd of a thread that is inside its sleep (it removes it,
            // under this lock, before it returns); 8 readable bytes.
            let _ = unsafe { libc::write(fd, std::ptr::addr_of!(one).cast(), 8) };
        }
    }
}

thread_local! {
    /// This thread's eventfd, made on its first sleep; closed when the thread ends.
    static KICK: OnceCell<Option<OwnedFd>> = const { OnceCell::new() };
}

/// This thread's eventfd (`None` if it cannot be made, or the thread is ending and its
/// thread-locals are gone, as in a queue dropped by a thread-local's destructor: the sleep is
/// then sliced).
pub(crate) fn this_threads_kick() -> Option<RawFd> {
    KICK.try_with(|k| {
        k.get_or_init(|| {
            // SAFETY: no pointers; returns a new fd or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            // SAFETY: a fresh descriptor nothing else owns.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .as_ref()
        .map(AsRawFd::as_raw_fd)
    })
    .ok()
    .flatten()
}

/// Reads (resets) this thread's eventfd; whether it had been written.
pub(crate) fn take_kick(fd: RawFd) -> bool {
    let mut n = 0u64;
    // SAFETY: `fd` is this thread's non-blocking eventfd; 8 writable bytes.
    unsafe { libc::read(fd, std::ptr::addr_of_mut!(n).cast(), 8) == 8 }
}

/// This thread's registration with the channels it is about to sleep on; removed on drop
/// (also when the step before the sleep panics).
pub(crate) struct Registered<'r, 'a> {
    channels: &'r Channels<'a>,
    fd: Option<RawFd>,
    complete: bool,
}

impl<'r, 'a> Registered<'r, 'a> {
    pub(crate) fn new(channels: &'r Channels<'a>, fd: Option<RawFd>) -> Self {
        let mut complete = fd.is_some();
        if let Some(fd) = fd {
            for ch in channels.iter() {
                complete &= ch.sleepers().add(fd);
            }
        }
        Registered { channels, fd, complete }
    }

    /// Whether every channel registered the thread (else its sleep must be sliced).
    pub(crate) fn complete(&self) -> bool {
        self.complete
    }
}

impl Drop for Registered<'_, '_> {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            for ch in self.channels.iter() {
                ch.sleepers().remove(fd);
            }
        }
    }
}
