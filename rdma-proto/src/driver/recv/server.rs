//! [`Server`]: listening, admission (places, per-address limits, knocks, lanes routed to their
//! sessions), and the one accept loop of `serve` (a thread per session) and `serve_async` (a
//! task per session).

use super::{ReceiveOptions, ReceiveReport};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rdma_cm::{ConnectRequest, Listener};
use rdma_verbs::Deadline;

use crate::driver::files::DirFd;
#[cfg(feature = "tokio")]
use crate::driver::io::Tokio;
use crate::driver::io::Wakes;
use crate::driver::io::{block_on, Blocking, Io};
use crate::driver::partials::{Ledger, Reserve};
use crate::driver::Error;
use crate::policy::knock::Knocks;
use crate::policy::places::{self, PerAddress};
use crate::policy::seats::{self, BUSY_HINT};
use crate::wire::{self, Ack, Message};
use crate::Status;

use super::session::receive;
use super::shared::*;

/// A listening receiver.
#[must_use = "dropping it at once releases what was just made"]
pub struct Server {
    listener: Listener,
    opts: Arc<ReceiveOptions>,
    /// Sessions past their HELLO: `max_sessions` seats, which a slow session gives to a
    /// newer one when they are all taken ([`crate::policy::seats`]).
    active: Arc<Seats>,
    /// Connections with a thread: [`places::limit`] places, and those leaving
    /// after giving theirs to a newer connection.
    places: Arc<ConnectionPlaces>,
    /// Wrong proofs of the secret, by address.
    attempts: Arc<Attempts>,
    /// Connections, by address.
    per_address: Arc<PerAddress>,
    /// The knocks taken lately ([`crate::policy::knock`]): each vouches for one request.
    knocks: Knocks,
    /// The live sessions that granted lanes, by token: where an extra lane's connection
    /// request goes.
    routes: Arc<Routes>,
    /// The destination directory, open (`opts.dir`): every file is made relative to it.
    dest: Option<DirFd>,
    /// The partials kept for resumes, within their caps.
    partials: Arc<Ledger>,
}

impl Server {
    /// Listens on `addr` (an address of an RDMA device, or a wildcard).
    ///
    /// # Errors
    /// [`Error::Usage`] for options no session could be served with (a `max_chunk` of 0),
    /// before anything is bound; [`Error::Cm`] when binding or listening fails.
    pub fn bind(addr: SocketAddr, opts: ReceiveOptions) -> Result<Self, Error> {
        crate::driver::link::check_ack_timeout(opts.ack_timeout)?;
        if opts.max_chunk == 0 {
            return Err(Error::Usage("max_chunk 0: a chunk holds at least one byte".into()));
        }
        let dest = match &opts.dir {
            Some(dir) => Some(crate::driver::files::open_destination(dir).map_err(Error::Destination)?),
            None => None,
        };
        let reserve = Reserve { bytes: opts.min_free, percent: opts.min_free_percent };
        let partials = Ledger::new(opts.max_partials, opts.max_partial_bytes);
        let partials = Arc::new(partials.with_space(reserve, opts.max_partial_bytes_per_address));
        if let Some(dir) = &dest {
            // Swept now: the sessions' opens sweep it again a minute from now at the earliest.
            partials.sweep_due(dir);
            partials.found(dir, crate::driver::files::sweep_partials(dir, opts.partial_ttl));
        }
        let places = ConnectionPlaces::new(places::limit(opts.max_sessions), opts.preempt_after);
        let seats = Seats::new(opts.max_sessions, seats::floor(opts.min_rate));
        Ok(Server {
            listener: Listener::bind(addr, 64)?,
            opts: Arc::new(opts),
            active: Arc::new(seats),
            places: Arc::new(places),
            attempts: Arc::new(Attempts::default()),
            per_address: Arc::new(PerAddress::default()),
            knocks: Knocks::new(SystemTime::now()),
            routes: Arc::new(Routes::default()),
            dest,
            partials,
        })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }

    /// Serves senders, each connection on its own thread, until `sessions` transfers were asked
    /// for (forever with `None`); `report` is called (from that thread) as each session ends.
    /// A transfer is asked for when a connection's HELLO arrives and, with a secret, its sender
    /// proved the secret, whatever its outcome then (a refusal, a failure and a success count
    /// alike); a connection that sends none, one rejected as busy, and one that cannot prove
    /// the secret do not count ([`ReceiveReport::authorized`]): a peer without the secret
    /// cannot use up a count meant for those with it. Once the count is reached no connection is accepted
    /// (a request is rejected as busy; only the extra lanes of the striped sessions in
    /// progress are still taken), those still without a HELLO end, and `serve` returns when
    /// the transfers in progress ended (HELLOs that raced the count are served too, so more
    /// may end than `sessions`).
    ///
    /// A connection counts toward `max_sessions` from its valid HELLO on; connections past
    /// `max_sessions` and a small slack take the place of one that proved nothing within
    /// [`ReceiveOptions::preempt_after`], or are rejected at once (the sender sees
    /// [`Status::Busy`]). Returns when [`ReceiveOptions::stop`] is set, once the sessions in
    /// progress ended.
    ///
    /// # Errors
    /// [`Error::Cm`] when the listener fails (its device went away, or reading its channel
    /// failed); a failed session is only reported, and a request that could not be set up (no
    /// file descriptor left for its channel, say) is rejected and logged, and the others served.
    pub fn serve(
        &self,
        sessions: Option<usize>,
        report: impl Fn(ReceiveReport) + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let report: Arc<dyn Fn(ReceiveReport) + Send + Sync> = Arc::new(report);
        let tally = Arc::new(Tally::default());
        std::thread::scope(|scope| {
            let spawn = |req: ConnectRequest, place: Places, shared: Shared| {
                let report = report.clone();
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || {
                        let r = block_on(receive(&Blocking, req, &shared, &place.0));
                        drop(place);
                        report(r);
                    })
                    .map(drop)
            };
            block_on(self.accept_loop(&Blocking, sessions, &report, &tally, spawn))
        })
    }
}

#[cfg(feature = "tokio")]
impl Server {
    /// [`serve`](Self::serve) for async code (feature `tokio`): each session is a task on the
    /// current runtime instead of a thread (the same sessions, their waits awaited on the
    /// reactor; no thread is started). `report` is called from the session's task as each ends.
    /// Returns when `sessions` sessions ended, or [`ReceiveOptions::stop`] is set and the
    /// sessions in progress ended.
    ///
    /// What still blocks a task: writing each chunk (`pwrite`), committing the file (`fsync`,
    /// rename), and hashing what a resumed partial holds (up to a third of
    /// [`ReceiveOptions::timeout`], read from disk; at most three times in a row for a
    /// partial that no resume adds to). Run the server on a multi-thread runtime when other tasks must not
    /// wait for a commit.
    ///
    /// Cancellation: dropping the future stops accepting and aborts the sessions' tasks (each
    /// discards its temporary file; its queues are dropped in place, which may block the thread
    /// for the drain timeout).
    ///
    /// # Errors
    /// As `serve`; [`Error::Cm`] with `NoRuntime` outside a tokio runtime.
    ///
    /// # Panics
    /// In a runtime without IO enabled, as tokio's own types. (Its deadlines and pauses are
    /// `timerfd`s on the reactor, not tokio timers: a runtime built without time works.)
    pub async fn serve_async(
        &self,
        sessions: Option<usize>,
        report: impl Fn(ReceiveReport) + Send + Sync + 'static,
    ) -> Result<(), Error> {
        let report: Arc<dyn Fn(ReceiveReport) + Send + Sync> = Arc::new(report);
        let tally = Arc::new(Tally::default());
        let mut tasks = tokio::task::JoinSet::new();
        let spawn = |req: ConnectRequest, place: Places, shared: Shared| {
            while tasks.try_join_next().is_some() {}
            let report = report.clone();
            tasks.spawn(async move {
                let r = receive(&Tokio, req, &shared, &place.0).await;
                drop(place);
                report(r);
            });
            Ok(())
        };
        let result = self.accept_loop(&Tokio, sessions, &report, &tally, spawn).await;
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        }
        result
    }
}

impl Server {
    /// The accept loop of [`serve`](Self::serve) and `serve_async`: takes connection requests
    /// until the server is closed and its sessions ended, hands extra lanes to their sessions,
    /// and gives each admitted request to `spawn` with its places and what it shares with the
    /// server (`Err` when no thread could be started for it: the request went with the
    /// closure, rejected, and its place given back).
    async fn accept_loop<I: Io>(
        &self,
        io: &I,
        sessions: Option<usize>,
        report: &Arc<dyn Fn(ReceiveReport) + Send + Sync>,
        tally: &Arc<Tally>,
        mut spawn: impl FnMut(ConnectRequest, Places, Shared) -> std::io::Result<()>,
    ) -> Result<(), Error> {
        let r = loop {
            let closed = self.closed(tally, sessions);
            if closed && self.places.alive() == 0 {
                break Ok(());
            }
            let req = match self.listener.try_recv_request() {
                Ok(Some(r)) => r,
                Ok(None) => {
                    // Asleep until a request, the stop flag, or a session's news (a transfer
                    // asked for, a connection ended): nothing else changes what the loop does.
                    // Once closed, not the stop flag: set, it stays readable for good, and the
                    // loop would spin while its last sessions end.
                    let fds = Wakes::new(self.listener.as_fd()).and(tally.changed.fd()).and(self.places.ended().fd());
                    let fds = if closed { fds } else { fds.and(self.opts.stop.fd()) };
                    io.readable(fds.fds(), fds.until(Deadline::never())).await;
                    tally.changed.heard();
                    self.places.ended().heard();
                    continue;
                }
                Err(e) if ends_listening(&e) => break Err(e.into()),
                Err(e) => {
                    if lost_request(&e) {
                        io.sleep(RESOURCE_PAUSE).await;
                    }
                    continue;
                }
            };
            let Some(req) = self.route_lane(req, &**report) else { continue };
            if closed {
                report(reject(req, Status::Busy, "the receiver takes no more transfers".into(), None));
                continue;
            }
            let Some((req, place)) = self.admit(req, &**report) else { continue };
            if let Err(e) = spawn(req, place, self.shared(tally)) {
                tracing::warn!(error = %e, "no thread for a connection: its request is rejected");
                io.sleep(RESOURCE_PAUSE).await;
            }
        };
        tally.closing.set();
        r
    }
}

/// Whether an error taking a connection request is the listener's own, after which it cannot
/// go on: anything but the failures of one request's own set-up (no fd left for its event
/// channel, `rdma_migrate_id` refused, librdmacm left out its addresses), which rdma-cm answers
/// by rejecting that request, so that the others can be served (were one such request to end
/// `serve`, and with it `rdma-copy recv`, a peer could bring that about by holding connections
/// until the receiver ran out of file descriptors). An error that consumed no
/// request (the device went away, the channel or the runtime failed) ends the loop, which
/// would otherwise meet it again at once.
fn ends_listening(e: &rdma_cm::Error) -> bool {
    !matches!(
        e,
        rdma_cm::Error::Cm { verb: "rdma_create_event_channel" | "fcntl(O_NONBLOCK)" | "rdma_migrate_id", .. }
            | rdma_cm::Error::Incomplete { .. }
            // librdmacm allocates each event it reads: under memory pressure the event stays
            // queued, and is read again after the pause.
            | rdma_cm::Error::Cm { verb: "rdma_get_cm_event", errno: libc::ENOMEM | libc::ENOBUFS, .. }
    )
}

/// Logs a request lost to `e` (not [`ends_listening`]); whether the process ran out of a
/// resource (file descriptors, memory), when the accept loop pauses [`RESOURCE_PAUSE`] rather
/// than spin while it lasts.
fn lost_request(e: &rdma_cm::Error) -> bool {
    tracing::warn!(error = %e, "a connection request could not be taken: it is rejected");
    matches!(e.errno(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::ENOBUFS))
}

/// How long an accept loop pauses after a request lost to an exhausted resource.
const RESOURCE_PAUSE: Duration = Duration::from_millis(20);

impl Server {
    /// Whether the accept loop takes no more transfers (`sessions` were asked for, or the
    /// server stops); then connections still without a HELLO end. The loop still runs while
    /// sessions are in progress, to hand their extra lanes over (any other request is then
    /// rejected as busy).
    /// What a session of this server shares with it and the others.
    fn shared(&self, tally: &Arc<Tally>) -> Shared {
        Shared {
            opts: self.opts.clone(),
            active: self.active.clone(),
            tally: tally.clone(),
            routes: self.routes.clone(),
            dest: self.dest.clone(),
            attempts: self.attempts.clone(),
            partials: self.partials.clone(),
        }
    }

    fn closed(&self, tally: &Tally, sessions: Option<usize>) -> bool {
        let closed = tally.enough(sessions) || self.opts.stop.is_set();
        if closed {
            tally.closing.set();
        }
        closed
    }

    /// A connection request whose private data is a LANE message is an extra lane of a
    /// session: handed to it when its token names a live session that granted that lane, else
    /// rejected (reported; nothing allocated; with a secret, counted as a wrong proof of its
    /// address).
    /// Any other request is returned, to be served as a session of its own.
    fn route_lane(&self, req: ConnectRequest, report: &dyn Fn(ReceiveReport)) -> Option<ConnectRequest> {
        let Ok((h, Message::Lane(lane))) = wire::decode(req.private_data()) else { return Some(req) };
        let peer = req.peer_addr();
        match self.routes.take(lane, h.session) {
            Ok((to, handed)) => match to.send((lane.lane, req)) {
                Ok(()) => {
                    handed.ring();
                    tracing::debug!(session = format_args!("{:016x}", h.session), lane = lane.lane, "lane handed over")
                }
                Err(std::sync::mpsc::SendError((_, req))) => {
                    report(reject(req, Status::NotAuthorized, "its session ended".into(), None));
                }
            },
            Err(why) => {
                // A guessed token, on a receiver with a secret, counts as a wrong proof (it slows
                // the address's next wrong proofs); without a secret it costs only the connection.
                if self.opts.secret.is_some() {
                    let _ = self.attempts.wrong_proof(
                        peer.ip(),
                        Instant::now(),
                        self.opts.auth_attempts,
                        self.opts.auth_window,
                    );
                }
                report(reject(req, Status::NotAuthorized, why, None));
            }
        }
        None
    }

    /// Takes a place for a connection request, or rejects it with `Busy` (reported): past its
    /// address's `max_per_address`, or past every connection limit. A request whose KNOCK
    /// proves the secret ([`crate::policy::knock`]) is proved from the start ([`crate::policy::places`]), and is
    /// counted but not held back by its address's limit: an address is what a request says,
    /// and anyone who can use the sender's (a co-tenant of its host) could fill that limit
    /// with connections that prove nothing, and so keep a secret holder out.
    fn admit(&self, req: ConnectRequest, report: &dyn Fn(ReceiveReport)) -> Option<(ConnectRequest, Places)> {
        let ip = req.peer_addr().ip();
        let secret = self.opts.secret.as_ref();
        let vouched = self.knocks.vouches(secret, req.private_data(), ip, req.local_addr(), SystemTime::now());
        let cap = if vouched { usize::MAX } else { self.opts.max_per_address.max(1) };
        let Some(mine) = self.per_address.enter(ip, cap) else {
            let why = format!("{} connections from this address already", self.opts.max_per_address.max(1));
            report(reject(req, Status::Busy, why, Some(BUSY_HINT)));
            return None;
        };
        match self.places.take(Instant::now(), ip, vouched) {
            Some(place) => Some((req, (place, mine))),
            None => {
                let why = format!("serving {} transfers", self.opts.max_sessions);
                report(reject(req, Status::Busy, why, Some(BUSY_HINT)));
                None
            }
        }
    }
}

/// Rejects a connection request with an ACK (session 0) as the rejection's private data,
/// `retry_after` its hint of when to ask again.
fn reject(req: ConnectRequest, status: Status, detail: String, retry_after: Option<Duration>) -> ReceiveReport {
    let peer = req.peer_addr();
    let retry_after_ms = retry_after.map_or(0, |d| u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
    let ack = Message::Ack(Ack { status, received: 0, detail: detail.clone(), retry_after_ms });
    let mut bytes = Vec::new();
    let result = match wire::encode(0, &ack, &mut bytes) {
        Ok(()) => match req.reject(&bytes) {
            Ok(()) => Err(Error::Refused { status, detail, retry_after }),
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(Error::Protocol(e.into())),
    };
    tracing::warn!(%peer, %status, "connection rejected");
    ReceiveReport { result, ..ReceiveReport::starting(peer) }
}
