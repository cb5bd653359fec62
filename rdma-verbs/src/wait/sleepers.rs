//! The threads and tasks asleep on a file descriptor that several readers share (a completion
//! channel, an rdma-cm event channel), and how a reader that took an event another awaits wakes
//! them (see [`CqWaiter`](crate::CqWaiter) and [`Sleepers`]).
//!
//! Each sleeping thread polls the shared fd and an `eventfd` of its own (one per thread, made on
//! its first sleep, for completion waits; one per [`Sleeper`] for the others). It registers that eventfd before its last step and removes it when it wakes; a
//! reader that took an event writes to every eventfd registered, so the thread the event was
//! for steps again. An async wait enables a `tokio::sync::Notify` wake-up instead.

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

/// The waits asleep on one file descriptor that several readers share, so that a reader that
/// takes an event another wait is waiting for can wake it.
///
/// Why it is needed: a wait that sleeps on a shared fd (`poll(2)`, or epoll through the tokio
/// reactor) is woken only if the event is still queued when the kernel looks; when another
/// reader takes it first, the sleeper learns nothing and sleeps until the next event, which may
/// never come. So every wait registers here before its last look at what it waits for, and every
/// reader that takes an event calls [`wake_all`](Self::wake_all): each wait then looks again.
///
/// - A blocking wait takes a [`Sleeper`] ([`sleeper`](Self::sleeper)) before its last look,
///   then [`Sleeper::sleep`]s on the fd: it wakes when the fd is readable or on a `wake_all`
///   since it registered.
/// - An async wait (feature `tokio`) makes a `Woken` (`Sleepers::woken`) before its last
///   look and awaits it beside the fd's readiness.
///
/// rdma-verbs' completion channels and rdma-cm's event channels each keep one.
///
/// ```
/// use rdma_verbs::wait::{Deadline, Sleepers};
/// use std::os::fd::AsFd;
/// use std::time::Duration;
///
/// let sleepers = Sleepers::new();
/// let (quiet, _writer) = std::os::unix::net::UnixStream::pair().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         let sleeper = sleepers.sleeper(); // before the last look at the shared state
///         // ... look; nothing there yet: sleep until the fd is readable or a reader wakes us
///         sleeper.sleep(quiet.as_fd(), Deadline::after(Duration::from_secs(5))).unwrap()
///     });
///     std::thread::sleep(Duration::from_millis(20));
///     sleepers.wake_all(); // a reader took an event: every waiter looks again
/// });
/// ```
#[derive(Debug)]
pub struct Sleepers {
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
    /// No sleeper yet.
    pub fn new() -> Self {
        Sleepers::default()
    }

    /// Registers the calling thread for the wake-ups of [`wake_all`](Self::wake_all) until the
    /// [`Sleeper`] is dropped: take it before the last look at what the wait waits for, then
    /// [`sleep`](Sleeper::sleep) if that found nothing. Each sleeper has an `eventfd` of its
    /// own, closed when it is dropped (two system calls: for waits that sleep rarely, such as
    /// connection-manager waits; the completion waits of this crate keep one per thread).
    pub fn sleeper(&self) -> Sleeper<'_> {
        use rustix::event::{eventfd, EventfdFlags};
        let kick = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC).ok().map(Arc::new);
        let registered = kick.as_ref().is_some_and(|k| self.add(k));
        Sleeper { sleepers: self, kick, registered }
    }

    /// A future that resolves at the first [`wake_all`](Self::wake_all) after it was made
    /// (feature `tokio`): make it before an async wait's last look at what it waits for, and
    /// await it beside the fd's readiness.
    #[cfg(feature = "tokio")]
    pub fn woken(&self) -> Woken<'_> {
        let mut notified = Box::pin(self.tasks.notified());
        notified.as_mut().enable();
        Woken { notified }
    }

    /// Wakes every thread and task asleep through these sleepers: what a reader that took an
    /// event from the shared fd calls, since the event (or what the reader recorded of it) may
    /// be what another wait waits for.
    pub fn wake_all(&self) {
        self.wake_all_but(None);
    }

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
    pub(crate) fn wake_all_but(&self, me: Option<&Kick>) {
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

/// A thread's registration with [`Sleepers`], from before its last look at what it waits for
/// until it wakes ([`Sleepers::sleeper`]); removed on drop.
#[derive(Debug)]
#[must_use = "the registration ends when it is dropped"]
pub struct Sleeper<'a> {
    sleepers: &'a Sleepers,
    kick: Option<Kick>,
    /// Whether the sleeper is registered: not when it has no eventfd (none could be made) or
    /// the table was full; its sleep is then sliced.
    registered: bool,
}

impl Sleeper<'_> {
    /// Sleeps until `fd` is readable (`true`; also when `poll(2)` reports it hung up or in
    /// error, which a read then tells), a [`Sleepers::wake_all`] since the registration
    /// (`true`), or `until` passes (`false`): `poll(2)` on `fd` and this thread's `eventfd`,
    /// again after `EINTR`. A thread that could not register (more than 16 asleep at once)
    /// sleeps at most [`SHARED_CHANNEL_SLICE`](crate::SHARED_CHANNEL_SLICE) and returns
    /// `true`: it must look again.
    ///
    /// # Errors
    /// `poll(2)`'s, but `EINTR`.
    ///
    /// # References
    /// - [`poll(2)`](https://man7.org/linux/man-pages/man2/poll.2.html)
    #[doc(alias = "poll")]
    pub fn sleep(&self, fd: std::os::fd::BorrowedFd<'_>, until: crate::Deadline) -> std::io::Result<bool> {
        use std::os::fd::AsFd;
        let (kick, slice) = match (&self.kick, self.registered) {
            (Some(kick), true) => (Some(kick), until),
            _ => (None, until.min(crate::Deadline::after(crate::SHARED_CHANNEL_SLICE))),
        };
        let mut readable = [false; 2];
        let woke = match kick {
            Some(kick) => crate::wait::poll_fds(&[fd, kick.as_fd()], slice, &mut readable)?,
            None => crate::wait::poll_fds(&[fd], slice, &mut readable)?,
        };
        if let (Some(kick), true) = (kick, readable[1]) {
            take_kick(kick);
        }
        // A slice that ended before the wait's deadline: look again.
        Ok(woke || !until.has_passed())
    }
}

impl Drop for Sleeper<'_> {
    fn drop(&mut self) {
        if let (Some(kick), true) = (&self.kick, self.registered) {
            self.sleepers.remove(kick);
        }
    }
}

/// A wake-up of the async waits asleep through [`Sleepers`]: resolves at the first
/// [`Sleepers::wake_all`] after it was made ([`Sleepers::woken`], feature `tokio`). Any
/// runtime, or none, may poll it.
#[cfg(feature = "tokio")]
#[must_use = "futures do nothing unless polled"]
pub struct Woken<'a> {
    notified: std::pin::Pin<Box<tokio::sync::futures::Notified<'a>>>,
}

#[cfg(feature = "tokio")]
impl std::fmt::Debug for Woken<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Woken").finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
impl std::future::Future for Woken<'_> {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.notified.as_mut().poll(cx)
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
