//! Where a session waits: the one place the blocking driver and the async one differ.
//!
//! Every session, send and serve loop of the driver is written once, as an `async fn` generic
//! over [`Io`]. Its waits (resolving, connecting, accepting, an idle round, the teardown, a
//! pause) are the trait's calls, each bounded by a [`Deadline`] that goes down as it is to
//! `rdma-cm` and `rdma-verbs`:
//!
//! - [`Blocking`] makes each call a blocking call of `rdma-cm` and `rdma-verbs` until the
//!   deadline, so its futures are ready the first time they are polled: [`block_on`] polls the
//!   body once, on the caller's thread (rdma-verbs' `wait::ready_once`).
//! - `Tokio` (feature `tokio`) awaits the `wait_async` and `*_async` forms on the reactor, each
//!   deadline a `timerfd` on the same reactor (`rdma_verbs::wait::timeout_at`): a runtime built
//!   without tokio's time driver works.
//!
//! A wait that reaches its deadline is the [`rdma_cm::Error::Timeout`] that `rdma-cm` built
//! where the time ran out (naming the call it waited for and the deadline's timeout), from
//! both forms, passed on as it is.

use std::future::Future;
use std::os::fd::BorrowedFd;
#[cfg(feature = "tokio")]
use std::task::Poll;
use std::time::Duration;

use rdma_cm::{Accepting, Connection, Pending};
use rdma_verbs::qp::state::Rc;
use rdma_verbs::{CompletionQueue, CqWaiter, Deadline, Idle, RecvRing, SendQueue};

use super::flag::UNWAKEABLE_CHECK;

/// How often an accept that may be given up ([`Io::accept`]'s `keep`) asks whether to go on.
pub(crate) const KEEP_CHECK: Duration = Duration::from_millis(20);

/// A pending `rdma-cm` operation both forms finish: [`Pending::wait`], or (feature `tokio`)
/// `Pending::wait_async`.
pub(crate) trait CmOp: Pending {}
impl<P: Pending> CmOp for P {}

/// The waits of a session, blocking or async. Each ends by its deadline at the latest.
pub(crate) trait Io {
    /// Finishes `op`, a pending `rdma-cm` operation (resolving, connecting, accepting,
    /// disconnecting), by `until`: [`Pending::wait`], or `op.wait_async(until)`. A timeout is
    /// `rdma-cm`'s, naming the call waited for.
    async fn finish<P: CmOp>(&self, op: P, until: Deadline) -> rdma_cm::Result<P::Value>;

    /// Finishes `op` as [`finish`](Io::finish) does; with `keep`, gives up within
    /// [`KEEP_CHECK`] once it says no ([`rdma_cm::Error::Cancelled`]).
    async fn accept(
        &self,
        op: Accepting<'static>,
        until: Deadline,
        keep: Option<&(dyn Fn() -> bool + Sync)>,
    ) -> rdma_cm::Result<Connection<'static>>;

    /// One idle step over `cqs` beside `quiet` ([`CqWaiter::idle_quiet_with`]): spins, arms,
    /// or sleeps on their channel until a completion, one of `wakes` ([`Idle::Signalled`]), or
    /// `until`. `registrations` keeps what the async form registered with the reactor across
    /// the steps of one loop.
    async fn idle(
        &self,
        waiter: &mut CqWaiter,
        cqs: &[&CompletionQueue<'static>],
        quiet: &[&CompletionQueue<'static>],
        until: Deadline,
        wakes: &Wakes<'_>,
        registrations: &mut Registrations,
    ) -> rdma_verbs::Result<Idle>;

    /// Waits until one of `fds` is readable, or `until`.
    async fn readable(&self, fds: &[BorrowedFd<'_>], until: Deadline);

    /// Whether the peer's disconnect arrives by `until` (reading the connection's events).
    async fn peer_leaves(&self, conn: &Connection<'static>, until: Deadline) -> bool;

    /// Lets `sq`'s requests complete until `until`, then destroys it (the async form off the
    /// runtime's threads).
    async fn close_queue(&self, sq: SendQueue<'static, Rc>, until: Deadline);

    /// Destroys `ring` (the async form off the runtime's threads).
    async fn close_ring(&self, ring: RecvRing<'static>);

    /// Pauses for `wait`.
    async fn sleep(&self, wait: Duration);

    /// Lets the runtime's other tasks run: a session that keeps progressing awaits nothing
    /// else, and on a runtime of one thread would hold it. Nothing to do for a thread.
    async fn yield_now(&self);
}

/// Most file descriptors an idle step wakes for, besides its CQs' channel.
pub(crate) const MOST_WAKES: usize = 5;

/// What an idle session wakes for besides its completions, gathered on the stack: its
/// connection's CM events, and the flags and bells that stop, displace or call it. A flag or
/// bell without an fd cannot wake a sleep: the sleep then lasts [`UNWAKEABLE_CHECK`] at most.
pub(crate) struct Wakes<'a> {
    fds: Option<[BorrowedFd<'a>; MOST_WAKES]>,
    len: usize,
    unwakeable: bool,
}

impl<'a> Wakes<'a> {
    /// Wakes for `first` (a session's connection).
    pub(crate) fn new(first: BorrowedFd<'a>) -> Self {
        Wakes::none().and(Some(first))
    }

    /// Wakes for nothing yet.
    pub(crate) fn none() -> Self {
        Wakes { fds: None, len: 0, unwakeable: false }
    }

    /// Wakes for `fd` too (`None`: a flag or bell without one). Past [`MOST_WAKES`], looked at
    /// as one without.
    pub(crate) fn and(mut self, fd: Option<BorrowedFd<'a>>) -> Self {
        match fd {
            Some(fd) if self.len < MOST_WAKES => {
                self.fds.get_or_insert([fd; MOST_WAKES])[self.len] = fd;
                self.len += 1;
            }
            _ => self.unwakeable = true,
        }
        self
    }

    /// The fds.
    pub(crate) fn fds(&self) -> &[BorrowedFd<'a>] {
        self.fds.as_ref().map_or(&[], |f| &f[..self.len])
    }

    /// `until`, or sooner when something cannot wake the sleep.
    pub(crate) fn until(&self, until: Deadline) -> Deadline {
        match self.unwakeable {
            true => until.min(Deadline::after(UNWAKEABLE_CHECK)),
            false => until,
        }
    }
}

/// What an async loop registered with the reactor for its [`Wakes`], kept across its idle
/// steps (a registration is a `dup` and two `epoll_ctl` calls: not one per sleep). The fds it
/// names outlive the loop, so a number names one file for as long as this lives.
#[derive(Default)]
pub(crate) struct Registrations {
    #[cfg(feature = "tokio")]
    kept: Vec<(std::os::fd::RawFd, rdma_verbs::wait::Readiness)>,
}

#[cfg(feature = "tokio")]
impl Registrations {
    /// The registrations of `fds`, made for those not registered yet, in their order.
    fn of(&mut self, fds: &[BorrowedFd<'_>]) -> Registered<'_> {
        use std::os::fd::AsRawFd;
        let mut complete = true;
        for fd in fds {
            if !self.kept.iter().any(|(n, _)| *n == fd.as_raw_fd()) {
                match rdma_verbs::wait::Readiness::new(*fd) {
                    Ok(r) => self.kept.push((fd.as_raw_fd(), r)),
                    Err(e) => {
                        tracing::warn!(error = %e, "a wake-up could not be registered: looking every 100 ms");
                        complete = false;
                    }
                }
            }
        }
        let mut out = Registered { refs: None, len: 0, complete };
        for fd in fds.iter().take(MOST_WAKES) {
            if let Some((_, r)) = self.kept.iter().find(|(n, _)| *n == fd.as_raw_fd()) {
                out.refs.get_or_insert([r; MOST_WAKES])[out.len] = r;
                out.len += 1;
            }
        }
        out
    }
}

/// Registrations of one step's [`Wakes`], on the stack.
#[cfg(feature = "tokio")]
struct Registered<'r> {
    refs: Option<[&'r rdma_verbs::wait::Readiness; MOST_WAKES]>,
    len: usize,
    /// Whether every fd is registered (else the sleep must not outlast [`UNWAKEABLE_CHECK`]).
    complete: bool,
}

#[cfg(feature = "tokio")]
impl<'r> Registered<'r> {
    fn as_slice(&self) -> &[&'r rdma_verbs::wait::Readiness] {
        self.refs.as_ref().map_or(&[], |r| &r[..self.len])
    }
}

/// The blocking waits: each call blocks the thread, so every future is ready when polled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocking;

impl Io for Blocking {
    async fn finish<P: CmOp>(&self, op: P, until: Deadline) -> rdma_cm::Result<P::Value> {
        op.wait(until)
    }

    async fn accept(
        &self,
        op: Accepting<'static>,
        until: Deadline,
        keep: Option<&(dyn Fn() -> bool + Sync)>,
    ) -> rdma_cm::Result<Connection<'static>> {
        match keep {
            Some(keep) => op.wait_while(until, KEEP_CHECK, keep),
            None => self.finish(op, until).await,
        }
    }

    async fn idle(
        &self,
        waiter: &mut CqWaiter,
        cqs: &[&CompletionQueue<'static>],
        quiet: &[&CompletionQueue<'static>],
        until: Deadline,
        wakes: &Wakes<'_>,
        _: &mut Registrations,
    ) -> rdma_verbs::Result<Idle> {
        waiter.idle_quiet_with(cqs, quiet, wakes.until(until), wakes.fds())
    }

    async fn readable(&self, fds: &[BorrowedFd<'_>], until: Deadline) {
        // An error of poll(2) is a wake-up like any other: the caller looks again.
        let _ = rdma_verbs::wait::poll_fds(fds, until, &mut []);
    }

    async fn peer_leaves(&self, conn: &Connection<'static>, until: Deadline) -> bool {
        while !conn.peer_disconnected() {
            let left = until.remaining();
            if left.is_zero() || conn.recv_event(left).is_err() {
                break;
            }
        }
        conn.peer_disconnected()
    }

    async fn close_queue(&self, mut sq: SendQueue<'static, Rc>, until: Deadline) {
        let _ = sq.drain(until.remaining(), drop);
    }

    async fn close_ring(&self, ring: RecvRing<'static>) {
        drop(ring);
    }

    async fn sleep(&self, wait: Duration) {
        std::thread::sleep(wait);
    }

    async fn yield_now(&self) {}
}

/// Runs a body over [`Blocking`] on this thread with rdma-verbs' ready-once executor: polled
/// once, it is ready, its every wait having blocked inside its call.
///
/// # Panics
/// If `body` is not ready when polled once: it awaited something other than [`Blocking`]'s
/// calls (a bug of the driver's).
pub(crate) fn block_on<F: Future>(body: F) -> F::Output {
    rdma_verbs::wait::ready_once(body).expect("a blocking body waits inside its calls: it is ready when polled")
}

/// The async waits, on the current tokio runtime: each awaits an `*_async` call, bounded by a
/// `timerfd` on the runtime's reactor (no tokio timer).
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tokio;

/// `wait` until `until` (rdma-verbs' `timerfd` deadline on the reactor): `None` when the
/// deadline came first. Without a `timerfd` (the process is out of file descriptors) a thread
/// of the runtime's blocking pool sleeps to the deadline instead: still no tokio timer.
#[cfg(feature = "tokio")]
async fn until<T>(until: Deadline, wait: impl Future<Output = T>) -> Option<T> {
    let mut wait = std::pin::pin!(wait);
    match rdma_verbs::wait::timeout_at(until, wait.as_mut()).await {
        Ok(done) => done,
        Err(e) => {
            tracing::warn!(error = %e, "no timerfd for a wait's deadline: a blocking-pool thread keeps it");
            let left = until.remaining();
            let mut slept = std::pin::pin!(tokio::task::spawn_blocking(move || std::thread::sleep(left)));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(done) = wait.as_mut().poll(cx) {
                    return Poll::Ready(Some(done));
                }
                slept.as_mut().poll(cx).map(|_| None)
            })
            .await
        }
    }
}

#[cfg(feature = "tokio")]
impl Io for Tokio {
    async fn finish<P: CmOp>(&self, op: P, until: Deadline) -> rdma_cm::Result<P::Value> {
        op.wait_async(until).await
    }

    async fn accept(
        &self,
        op: Accepting<'static>,
        until: Deadline,
        keep: Option<&(dyn Fn() -> bool + Sync)>,
    ) -> rdma_cm::Result<Connection<'static>> {
        match keep {
            None => self.finish(op, until).await,
            Some(keep) => op.wait_while_async(until, KEEP_CHECK, keep).await,
        }
    }

    async fn idle(
        &self,
        waiter: &mut CqWaiter,
        cqs: &[&CompletionQueue<'static>],
        quiet: &[&CompletionQueue<'static>],
        until: Deadline,
        wakes: &Wakes<'_>,
        registrations: &mut Registrations,
    ) -> rdma_verbs::Result<Idle> {
        let also = registrations.of(wakes.fds());
        let until = match also.complete {
            true => wakes.until(until),
            false => until.min(Deadline::after(UNWAKEABLE_CHECK)),
        };
        let recheck = until.instant().map(|_| until.remaining());
        waiter.idle_async_quiet_with(cqs, quiet, recheck, also.as_slice()).await
    }

    async fn readable(&self, fds: &[BorrowedFd<'_>], until: Deadline) {
        let mut registrations = Registrations::default();
        let also = registrations.of(fds);
        let until = match also.complete {
            true => until,
            false => until.min(Deadline::after(UNWAKEABLE_CHECK)),
        };
        let also = also.as_slice();
        let ready = std::future::poll_fn(|cx| match also.iter().any(|r| r.poll_ready(cx).is_ready()) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        });
        let _ = self::until(until, ready).await;
    }

    async fn peer_leaves(&self, conn: &Connection<'static>, until: Deadline) -> bool {
        let left = self::until(until, conn.disconnected_async()).await;
        matches!(left, Some(Ok(()))) || conn.peer_disconnected()
    }

    async fn close_queue(&self, mut sq: SendQueue<'static, Rc>, until: Deadline) {
        let _ = self::until(until, sq.drain_async(drop)).await;
        let _ = sq.close_async().await;
    }

    async fn close_ring(&self, ring: RecvRing<'static>) {
        let _ = ring.close_async().await;
    }

    async fn sleep(&self, wait: Duration) {
        self::until(Deadline::after(wait), std::future::pending::<()>()).await;
    }

    async fn yield_now(&self) {
        tokio::task::yield_now().await;
    }
}

/// The async driver's futures can move between a runtime's threads (`tokio::spawn`): checked
/// when this crate compiles, for the one body over [`Tokio`].
#[cfg(feature = "tokio")]
const _: fn() = || {
    fn send<T: Send>(_: &T) {}
    let opts = super::SendOptions::new(std::net::SocketAddr::from(([127, 0, 0, 1], 1)));
    let path = std::path::Path::new("f");
    send(&super::send_file_async(path, &opts, |_, _| {}));
    send(&super::send_files_async(&[], &opts, |_, _| {}));
    let serve = |server: &super::Server| send(&server.serve_async(None, |_| {}));
    let _ = serve;
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

    #[test]
    fn a_blocking_body_runs_to_its_end_in_one_poll() {
        let io = Blocking;
        let t = std::time::Instant::now();
        let out = block_on(async {
            io.sleep(Duration::from_millis(5)).await;
            io.sleep(Duration::from_millis(5)).await;
            7
        });
        assert_eq!(out, 7);
        assert!(t.elapsed() >= Duration::from_millis(10));
    }

    /// The async form's pauses and deadlines are `timerfd`s on the reactor: they work on a
    /// runtime built without tokio's time driver.
    #[cfg(feature = "tokio")]
    #[test]
    fn async_pauses_and_deadlines_work_on_a_runtime_without_time() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        let t = std::time::Instant::now();
        rt.block_on(Tokio.sleep(Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(20));
        let (quiet, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        quiet.set_nonblocking(true).unwrap();
        let t = std::time::Instant::now();
        let fd = std::os::fd::AsFd::as_fd(&quiet);
        rt.block_on(Tokio.readable(&[fd], Deadline::after(Duration::from_millis(20))));
        assert!(t.elapsed() >= Duration::from_millis(20), "woke for nothing after {:?}", t.elapsed());
        let ended = rt.block_on(until(Deadline::after(Duration::from_millis(5)), std::future::pending::<()>()));
        assert_eq!(ended, None);
    }

    #[test]
    #[should_panic(expected = "ready when polled")]
    fn a_body_that_waits_elsewhere_is_a_bug_that_says_so() {
        let mut first = true;
        block_on(std::future::poll_fn(|_| if std::mem::take(&mut first) { Poll::Pending } else { Poll::Ready(()) }));
    }
}
