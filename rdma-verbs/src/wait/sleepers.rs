//! The threads asleep on a completion channel, and how a wait that read an event for a CQ it
//! does not wait for wakes them (see [`CqWaiter`](crate::CqWaiter)).
//!
//! Each sleeping thread polls its channel's fd and its own `eventfd` (one per thread, made on
//! its first sleep). It registers that eventfd with the channel before its last poll of the
//! CQs and removes it when it wakes; a wait that reads a foreign event writes to every eventfd
//! registered, so the thread whose completion it was steps again.

use std::cell::OnceCell;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The most threads one channel registers at once; more sleep sliced instead
/// ([`SHARED_CHANNEL_SLICE`](crate::SHARED_CHANNEL_SLICE)).
const MAX_SLEEPERS: usize = 16;

/// A thread's eventfd, shared with the tables of the channels it sleeps on.
pub(crate) type Kick = Arc<OwnedFd>;

/// An empty place of the table (an array repeat of a non-`Copy` value needs a constant: inline
/// `const { }` blocks are Rust 1.79, above the MSRV).
const NO_KICK: Option<Kick> = None;

/// The eventfds of the threads asleep on one channel.
#[derive(Debug)]
pub(crate) struct Sleepers {
    /// Taken only on the way into and out of a sleep, and by a wait that read a foreign event:
    /// never per request.
    fds: Mutex<[Option<Kick>; MAX_SLEEPERS]>,
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
            fds: Mutex::new([NO_KICK; MAX_SLEEPERS]),
            count: AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            tasks: tokio::sync::Notify::new(),
        }
    }
}

impl Sleepers {
    fn fds(&self) -> std::sync::MutexGuard<'_, [Option<Kick>; MAX_SLEEPERS]> {
        self.fds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `kick`; `false` when the table is full.
    pub(crate) fn add(&self, kick: &Kick) -> bool {
        let mut fds = self.fds();
        let Some(free) = fds.iter_mut().find(|f| f.is_none()) else { return false };
        *free = Some(kick.clone());
        self.count.fetch_add(1, Ordering::AcqRel);
        true
    }

    pub(crate) fn remove(&self, kick: &Kick) {
        let mut fds = self.fds();
        if let Some(f) = fds.iter_mut().find(|f| f.as_ref().is_some_and(|f| Arc::ptr_eq(f, kick))) {
            *f = None;
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The async waits' wake-up: a wait enables a `notified()` of it before its last step.
    #[cfg(feature = "tokio")]
    pub(crate) fn tasks(&self) -> &tokio::sync::Notify {
        &self.tasks
    }

    /// Wakes every registered sleeper but `me`, and every async wait asleep on the channel.
    pub(crate) fn wake_all(&self, me: Option<&Kick>) {
        #[cfg(feature = "tokio")]
        self.tasks.notify_waiters();
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let others = self.fds();
        for kick in others.iter().flatten().filter(|k| !me.is_some_and(|me| Arc::ptr_eq(k, me))) {
            // A full counter (never, in practice) still leaves the eventfd readable: the
            // sleeper wakes either way.
            let _ = rustix::io::write(kick, &1u64.to_ne_bytes());
        }
    }
}

thread_local! {
    /// This thread's eventfd, made on its first sleep; closed when the thread ends.
    static KICK: OnceCell<Option<Kick>> = const { OnceCell::new() };
}

/// This thread's eventfd (`None` if it cannot be made, or the thread is ending and its
/// thread-locals are gone, as in a queue dropped by a thread-local's destructor: the sleep is
/// then sliced).
pub(crate) fn this_threads_kick() -> Option<Kick> {
    use rustix::event::{eventfd, EventfdFlags};
    KICK.try_with(|k| {
        k.get_or_init(|| eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).ok().map(Arc::new)).clone()
    })
    .ok()
    .flatten()
}

/// Reads (resets) this thread's eventfd; whether it had been written.
pub(crate) fn take_kick(kick: &Kick) -> bool {
    let mut n = [0u8; 8];
    rustix::io::read(kick, &mut n).is_ok_and(|read| read == 8)
}
