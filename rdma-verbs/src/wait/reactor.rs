//! Waiting for a verbs file descriptor on the tokio reactor (feature `tokio`): the completion
//! channel's and the async-event fd's, and deadlines ([`Alarm`]).
//!
//! One rule for all of them: each sleep registers its own duplicate of the fd with the reactor
//! of the runtime it runs on ([`Watch`]), and deregisters (and closes) it when it ends. So a
//! channel is never bound to a runtime: a ring used from one runtime, then from another, or
//! after its first runtime was dropped, waits on the runtime it is awaited in. Duplicates make
//! concurrent sleeps on one fd separate registrations (one fd can be registered with an epoll
//! instance only once), and the deregistration can never hit another file that reused the
//! number: the duplicate is closed only after it.

use std::future::Future;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};
use tokio::io::Interest;

use crate::error::{Error, Result};
use crate::wait::deadline::{timespec, Deadline};

/// One wait's registration of a duplicate of a non-blocking file descriptor with the reactor of
/// the current tokio runtime, for readability (feature `tokio`): how every async wait of this
/// crate and of `rdma-cm` sleeps on a verbs or CM fd.
///
/// A registration per wait, of a duplicate (see the module docs of [`wait`](crate::wait)): the
/// fd is never bound to a runtime, concurrent waits on one fd are separate registrations, and
/// the duplicate is deregistered before it is closed, so no other file that reuses the number
/// can be hit.
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct Readiness {
    fd: AsyncFd<OwnedFd>,
}

impl Readiness {
    /// Registers a duplicate of `fd` (`fcntl(F_DUPFD_CLOEXEC)`, then `epoll_ctl`) with the
    /// current runtime's reactor, readable interest. The caller keeps `fd` itself.
    ///
    /// # Errors
    /// An error of kind `Other` outside a tokio runtime; the OS error when the fd cannot be
    /// duplicated or the reactor refuses it.
    ///
    /// # Panics
    /// As tokio's own IO types: in a runtime built without IO (`enable_io`).
    pub fn new(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(std::io::Error::other("not inside a tokio runtime"));
        }
        Ok(Readiness { fd: register(fd.try_clone_to_owned()?)? })
    }

    /// Resolves when the fd is readable (or was, and that was not cleared). Await it as often
    /// as the wait needs: the registration stays until the `Readiness` is dropped.
    ///
    /// # Errors
    /// The reactor's errors (the runtime shutting down).
    pub async fn ready(&self) -> std::io::Result<Ready<'_>> {
        self.fd.readable().await.map(Ready)
    }

    /// [`ready`](Self::ready) as a poll, for a future of one's own that waits for several
    /// things at once: `Ready` when the fd is readable, else `Pending`, and `cx`'s waker is
    /// woken when it becomes so (only the last waker polled is kept).
    ///
    /// # Errors
    /// The reactor's errors (the runtime shutting down).
    pub fn poll_ready(&self, cx: &mut std::task::Context<'_>) -> Poll<std::io::Result<Ready<'_>>> {
        self.fd.poll_read_ready(cx).map(|r| r.map(Ready))
    }
}

/// The fd was reported readable ([`Readiness::ready`]). [`clear`](Self::clear) it when a
/// non-blocking read then found nothing, so that the next `ready` waits for new readiness;
/// dropped without clearing, the readiness stays and the next `ready` returns at once.
#[must_use = "clear it when a read found nothing, or drop it to keep the readiness"]
#[derive(Debug)]
pub struct Ready<'a>(AsyncFdReadyGuard<'a, OwnedFd>);

impl Ready<'_> {
    /// Forgets the readiness this guard reported (not any that arrived since).
    pub fn clear(mut self) {
        self.0.clear_ready();
    }
}

/// Registers `fd` with the current runtime's reactor for readability:
/// `AsyncFd::with_interest`. Tokio 1.54 deprecates it as "unsound due to lack of I/O safety"
/// (an inner `AsRawFd` value could close its fd while registered); an `OwnedFd` cannot: it is
/// closed only when the `AsyncFd` drops it, after deregistering. The replacement,
/// `AsyncFd::register_with_interest`, needs tokio 1.54, which needs Rust 1.85, above this
/// workspace's MSRV.
#[allow(deprecated)]
fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd, Interest::READABLE)
}

/// One sleep's registration of a verbs fd with the current runtime's reactor, with errors named
/// for the verb whose event it waits for.
#[derive(Debug)]
pub(crate) struct Watch {
    readiness: Readiness,
    what: &'static str,
}

impl Watch {
    /// Registers a duplicate of `fd` (a non-blocking descriptor the caller keeps open for as
    /// long as the watch) with the current runtime, readable interest.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] (`what`, with the
    /// `errno`) when the fd cannot be duplicated or the reactor refuses it.
    ///
    /// # Panics
    /// As tokio's own IO types: in a runtime built without IO (`enable_io`).
    pub(crate) fn new(fd: BorrowedFd<'_>, what: &'static str, device: &str) -> Result<Self> {
        in_runtime(what)?;
        let readiness = Readiness::new(fd).map_err(|e| io_error(what, device, &e))?;
        Ok(Watch { readiness, what })
    }

    /// Resolves when the fd is readable (or was, and that was not cleared).
    pub(crate) async fn readable(&self) -> Result<Ready<'_>> {
        self.readiness.ready().await.map_err(|e| io_error(self.what, "", &e))
    }
}

/// A deadline on the reactor: a `timerfd` registered like a [`Watch`]. Every timed async wait of
/// this crate, of `rdma-cm` and of `rdma-proto`'s driver ends through one ([`timeout_at`]), not
/// through tokio's timers, which panic in a runtime built without its time driver; this needs
/// only the IO driver that every async wait needs anyway. (So a runtime's paused test clock does
/// not move these deadlines: they are real time.)
#[derive(Debug)]
pub(crate) struct Alarm {
    fd: AsyncFd<OwnedFd>,
    what: &'static str,
}

impl Alarm {
    /// A new alarm, not set, registered with the current runtime.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] (`what`, with the
    /// `errno`) when the timer cannot be made or registered.
    pub(crate) fn new(what: &'static str, device: &str) -> Result<Self> {
        in_runtime(what)?;
        let fd = new_timer().map_err(|e| io_error(what, device, &e))?;
        Ok(Alarm { fd, what })
    }

    /// Sets the alarm to ring at `at` (at once if that passed), replacing an earlier setting
    /// and forgetting a ring not yet taken.
    pub(crate) fn set(&self, at: Instant) -> Result<()> {
        set_timer(&self.fd, at).map_err(|e| io_error(self.what, "", &e))
    }

    /// Awaits `f` until the alarm rings: `None` when it rang first.
    pub(crate) async fn race<F: Future>(&self, f: F) -> Result<Option<F::Output>> {
        race(&self.fd, f).await.map_err(|e| io_error(self.what, "", &e))
    }
}

/// A non-blocking monotonic `timerfd`, not set, registered with the current runtime's reactor.
fn new_timer() -> std::io::Result<AsyncFd<OwnedFd>> {
    use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(std::io::Error::other("not inside a tokio runtime"));
    }
    register(timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?)
}

/// Sets `timer` to ring at `at` (at once if that passed), forgetting a ring not yet taken.
fn set_timer(timer: &AsyncFd<OwnedFd>, at: Instant) -> std::io::Result<()> {
    use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags};
    // A zero value would disarm the timer: a passed deadline rings after a nanosecond.
    let left = at.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
    let spec = Itimerspec { it_interval: timespec(Duration::ZERO), it_value: timespec(left) };
    timerfd_settime(timer.get_ref(), TimerfdTimerFlags::empty(), &spec).map(drop).map_err(Into::into)
}

/// Resolves when `timer` rings (at once if it rang since it was set).
async fn rung(timer: &AsyncFd<OwnedFd>) -> std::io::Result<()> {
    loop {
        let mut guard = timer.readable().await?;
        let mut ticks = [0u8; 8];
        match rustix::io::read(timer.get_ref(), &mut ticks) {
            Ok(8) => return Ok(()),
            // Readiness left from an earlier setting: the timer was re-armed since.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Awaits `f` until `timer` rings: `None` when it rang first.
async fn race<F: Future>(timer: &AsyncFd<OwnedFd>, f: F) -> std::io::Result<Option<F::Output>> {
    let mut f = std::pin::pin!(f);
    let mut rung = std::pin::pin!(rung(timer));
    std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Ok(Some(v)));
        }
        rung.as_mut().poll(cx).map(|r| r.map(|()| None))
    })
    .await
}

/// Awaits `f` until `until` passes (feature `tokio`): `Ok(Some(output))`, or `Ok(None)` when
/// the deadline came first (`f` is then dropped). How every async wait with a deadline of this
/// crate, `rdma-cm` and `rdma-proto` ends, and the way to bound the `*_async` waits that take
/// no deadline of their own.
///
/// The deadline is a `timerfd` registered with the reactor of the current runtime, not a tokio
/// timer: a runtime built without its time driver (no `enable_time`) works, as it does for
/// every other wait of these crates. `f` is polled first: one that is ready at once needs no
/// timer (and no runtime); [`Deadline::never`] awaits `f` as it is. A passed deadline gives `f`
/// that one poll. The deadline is real time: a paused test clock does not move it.
///
/// ```
/// use rdma_verbs::wait::{timeout_at, Deadline};
/// use std::time::Duration;
///
/// // IO only: no time driver.
/// let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
/// let never = std::future::pending::<()>();
/// let ended = rt.block_on(timeout_at(Deadline::after(Duration::from_millis(10)), never));
/// assert_eq!(ended.unwrap(), None);
/// ```
///
/// # Errors
/// An error of kind `Other` outside a tokio runtime (when `f` was not ready at once and there
/// is a deadline); the OS error when the `timerfd` cannot be made or registered.
///
/// # Panics
/// As tokio's own IO types: in a runtime built without IO (`enable_io`).
///
/// # References
/// - [`timerfd_create(2)`](https://man7.org/linux/man-pages/man2/timerfd_create.2.html)
#[doc(alias = "timerfd_create")]
pub async fn timeout_at<F: Future>(until: Deadline, f: F) -> std::io::Result<Option<F::Output>> {
    let Some(at) = until.instant() else { return Ok(Some(f.await)) };
    // `f` first: one that is ready at once (completions already in the CQ, a wait refused at
    // its first step) needs no alarm, so no fd and no reactor registration.
    let mut f = std::pin::pin!(f);
    if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await {
        return Ok(Some(v));
    }
    if until.has_passed() {
        return Ok(None);
    }
    let timer = new_timer()?;
    set_timer(&timer, at)?;
    race(&timer, f).await
}

/// [`timeout_at`] with this crate's errors for a wait for `what`.
///
/// # Errors
/// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] (`what`, with the `errno`)
/// when the timer cannot be made or registered.
pub(crate) async fn until<F: Future>(
    until: Deadline,
    f: F,
    what: &'static str,
    device: &str,
) -> Result<Option<F::Output>> {
    timeout_at(until, f).await.map_err(|e| io_error(what, device, &e))
}

/// `Ok` inside a tokio runtime, else [`Error::NoRuntime`]: checked by every async wait before
/// it touches the reactor or a timer (both panic without a runtime).
pub(crate) fn in_runtime(what: &'static str) -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::NoRuntime { what }),
    }
}

/// An error of the reactor while waiting for `what`: an OS error, or (none) the runtime going
/// away.
pub(crate) fn io_error(what: &'static str, device: &str, e: &std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(errno) => Error::from_errno(what, (!device.is_empty()).then_some(device), errno),
        None => Error::NoRuntime { what },
    }
}

/// Drops `value` on tokio's blocking pool and awaits it: for drops that wait for the device.
pub(crate) async fn drop_off_runtime<T: Send + 'static>(value: T) -> Result<()> {
    // A join error is a panic in the drop, which the pool caught: report it as one would
    // have been reported in place.
    tokio::task::spawn_blocking(move || drop(value)).await.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic())
        } else {
            Error::NoRuntime { what: "drop" }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime built without its time driver: tokio's timers would panic in it.
    fn io_only() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap()
    }

    /// An async deadline is a `timerfd` on the reactor: it ends a wait at its deadline in a
    /// runtime without time, and a wait that is ready at once needs neither timer nor runtime.
    #[test]
    fn an_async_deadline_ends_a_wait_in_a_runtime_without_time() {
        let rt = io_only();
        let start = Instant::now();
        let ended = rt.block_on(timeout_at(Deadline::after(Duration::from_millis(30)), std::future::pending::<()>()));
        assert_eq!(ended.unwrap(), None);
        let took = start.elapsed();
        assert!((Duration::from_millis(30)..Duration::from_secs(5)).contains(&took), "ended after {took:?}");
        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        r.set_nonblocking(true).unwrap();
        let ready = rt.block_on(async {
            let readiness = Readiness::new(std::os::fd::AsFd::as_fd(&r)).unwrap();
            let write_later = async {
                let _ = timeout_at(Deadline::after(Duration::from_millis(10)), std::future::pending::<()>()).await;
                std::io::Write::write_all(&mut &w, b"x").unwrap();
                std::future::pending::<()>().await
            };
            let readable = async { readiness.ready().await.map(drop) };
            let both = async {
                tokio::select! {
                    r = readable => r,
                    () = write_later => unreachable!(),
                }
            };
            timeout_at(Deadline::after(Duration::from_secs(5)), both).await
        });
        assert!(matches!(ready, Ok(Some(Ok(())))), "{ready:?}");
        let at_once = futures_ready(timeout_at(Deadline::after(Duration::ZERO), async { 7 }));
        assert_eq!(at_once.unwrap(), Some(7), "no runtime needed for a future ready at once");
        let outside = futures_ready(timeout_at(Deadline::after(Duration::from_secs(1)), std::future::pending::<()>()));
        assert_eq!(outside.unwrap_err().kind(), std::io::ErrorKind::Other, "outside a runtime: an error");
        let typed =
            futures_ready(until(Deadline::after(Duration::from_secs(1)), std::future::pending::<()>(), "x", ""));
        assert!(matches!(typed, Err(Error::NoRuntime { what: "x" })), "{typed:?}");
    }

    /// Runs a future that is ready when first polled.
    fn futures_ready<F: Future>(f: F) -> F::Output {
        crate::wait::ready_once(f).expect("ready at once")
    }
}
