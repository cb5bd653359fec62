//! One receiver session, from accepting its connection to its teardown: its rounds (the
//! machine's actions, arrivals, completions, lanes) and its idle waits. What it does with the
//! files is in `store.rs`.

use super::{EntryReport, ReceiveOptions, ReceiveReport, REPORTED_ENTRIES};
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rdma_cm::ConnectRequest;
use rdma_verbs::{AccessFlags, AlignedBuffer, Deadline, Rc, RecvRing, SendQueue, Slot, SlotPool};

use crate::driver::digest::Hasher;
use crate::driver::files::{DirFd, Incoming, MadeDirs};
use crate::driver::flag::Bell;
use crate::driver::io::Io;
use crate::driver::io::Wakes;
use crate::driver::link::{
    conn_params, explain_loss, peer_left, send_control, take_arrivals, Endpoint, EndpointParts, LaneBase, Pacer,
    SessionCqs, Side, CONTROL_WR_ID, DISCONNECT_WAIT, DRAIN,
};
use crate::driver::partials::{Ledger, Owner};
use crate::driver::probe::Prober;
use crate::driver::Error;
use crate::policy::limits;
use crate::policy::seats::{DISPLACED_HINT, HEIR_WAIT};
use crate::receiver::{Action, Input, Receiver, ReceiverConfig};
#[cfg(feature = "fault-injection")]
use crate::wire::Message;
use crate::wire::{self, Entry, EntryKind};
use crate::{Digest, Outcome, Status};

use super::shared::*;

mod store;

/// Serves one connection request to its end.
pub(super) async fn receive<I: Io>(io: &I, req: ConnectRequest, shared: &Shared, place: &Place) -> ReceiveReport {
    let start = Instant::now();
    let mut report = ReceiveReport::starting(req.peer_addr());
    let result = session(io, req, shared, place, &mut report, start).await;
    report.ended(result, start)
}

/// A session, from accepting its connection to its teardown: the one body of the blocking
/// and the async server.
async fn session<I: Io>(
    io: &I,
    req: ConnectRequest,
    shared: &Shared,
    place: &Place,
    report: &mut ReceiveReport,
    start: Instant,
) -> Result<(), Error> {
    let opts = &*shared.opts;
    let ctx = req.open_context()?;
    let ep = Endpoint::new(ctx, 0, ring_depth(opts), |qp| req.init_qp(qp, GRANTED_ACCESS))?;
    let (qp, parts) = ep.split();
    // A connection displaced before it is established ends now, not at the end of its accept:
    // a never-completed request lingering `hello_timeout` among the connections leaving would
    // hold back knocked requests.
    let params = conn_params(opts.ack_timeout);
    let keep = || !place.displaced();
    let conn = io
        .accept(
            req.accept(qp, &params),
            Deadline::after(limits::hello_bound(opts.accept_timeout, opts.hello_timeout)),
            Some(&keep),
        )
        .await
        .map_err(|e| displaced_or(e, place))?;
    let mut s = ReceiveSession::new(shared, place, report, parts, &conn, start)?;
    let outcome = loop {
        match s.drive_round(&conn) {
            Ok(ControlFlow::Break(o)) => break Ok(o),
            Ok(ControlFlow::Continue(progressed)) => {
                if let Err(e) = s.accept_lanes(io).await {
                    break Err(e);
                }
                if let Err(e) = s.drive_timers(io, progressed, &conn).await {
                    break Err(s.after_disconnect(e));
                }
            }
            Err(e) => break Err(e),
        }
    };
    // The sender's CANCEL may be read in the round whose next completion is a receive flushed
    // by its disconnect (the round then fails): the CANCEL says what happened.
    let outcome = match outcome {
        Err(Error::ConnectionLost { .. } | Error::PeerDisconnected) if s.finish_cancelled() => Err(Error::Cancelled),
        o => o,
    };
    let outcome = match outcome {
        Err(e) => Err(explain_loss(io, e, Side::Receiver, &conn, s.pd.context()).await),
        ok => ok,
    };
    let acked = s.machine.acked();
    let (sq, ring, slots, lanes, admitted) = s.end(&outcome);
    // One bound for the whole teardown, not one per lane: a peer that never disconnects holds
    // it `limits::TEARDOWN_WAIT` at most, however many lanes it opened (the disconnects without an
    // ACK too, which would otherwise each add 1 s, 17 s with 16 lanes).
    let gave_way = admitted.as_ref().is_some_and(Seat::displaced);
    let teardown = Deadline::after(limits::teardown_wait(place.displaced(), gave_way, opts.timeout));
    // An ACK must reach the sender before the connection goes: the sender reads it, then
    // disconnects. Without one there is nothing to wait for.
    let leave = |conn: rdma_cm::Connection<'static>| async {
        if acked {
            let _ = io.finish(conn.peer_disconnect(), teardown).await;
        } else {
            let _ = io.finish(conn.disconnect(), teardown.min(Deadline::after(DISCONNECT_WAIT))).await;
        }
    };
    for RecvLane { conn, ring } in lanes {
        leave(conn).await;
        io.close_ring(ring).await;
    }
    // The disconnect goes first and flushes the QP; the send queue is drained after it. With
    // an ACK sent, `leave` waits for the peer's disconnect before it flushes, and the peer
    // disconnects once it has read the ACK (or died): nothing sent must still arrive then.
    // Sends still in flight to a peer that is gone (a killed sender, or an ACK whose own
    // acknowledgement the peer never sent because it flushed its QP as it read it) answer
    // none of their retries, so they complete at the flush instead of holding the teardown
    // until its bound.
    leave(conn).await;
    io.close_queue(sq, teardown).await;
    // The ring holds the QP's last handle now: closed, it destroys the QP; only then may the
    // peer-writable slots go, and only then is their memory free for another session.
    io.close_ring(ring).await;
    drop(slots);
    drop(admitted);
    status_of(outcome)
}

/// An accept's error, as [`Error::Preempted`] when its connection was displaced meanwhile.
fn displaced_or(e: rdma_cm::Error, place: &Place) -> Error {
    if place.displaced() {
        Error::Preempted
    } else {
        e.into()
    }
}

/// The receive ring's depth: a receive for every granted slot's chunk, and room for control.
fn ring_depth(opts: &ReceiveOptions) -> u32 {
    opts.max_slots.saturating_add(16)
}

/// A session's outcome as the report gives it.
fn status_of(outcome: Result<Outcome, Error>) -> Result<(), Error> {
    match outcome? {
        Outcome::Acked { status: Status::Ok, .. } => Ok(()),
        Outcome::Acked { status, detail } => Err(Error::Refused { status, detail, retry_after: None }),
        // The sender said its send was cancelled (a CANCEL): as the sender reports it.
        Outcome::Failed(crate::ProtocolError::Cancelled) => Err(Error::Cancelled),
        Outcome::Failed(e) => Err(e.into()),
    }
}

/// One session's share of [`ReceiveOptions::memory_budget`] ([`limits::session_memory`]): the
/// largest chunk it may be granted and the budget of its ring.
fn session_memory(opts: &ReceiveOptions) -> (u32, u64) {
    limits::session_memory(opts.memory_budget, opts.max_sessions, opts.max_chunk)
}

/// What a session's teardown releases, in order: its send queue, its receive ring (the QP's
/// last handle), the peer-writable slots (after the QP is gone), and its extra lanes.
/// What a session's teardown releases, in order: the queues, then the granted slots, then its
/// place among `max_sessions` (whose memory share the slots are).
type Teardown = (SendQueue<'static, Rc>, RecvRing<'static>, Vec<Slot<'static>>, Vec<RecvLane>, Option<Seat>);

/// What a session does once it has its seat: open its file and register its ring
/// (`Action::Open`), or register the ring of its batch (`Action::Reserve`).
#[derive(Debug)]
enum Admitted {
    Open { name: String, size: u64, slot_size: u32, slot_count: u32 },
    Reserve { slot_size: u32, slot_count: u32 },
}

/// A lane's request handed over, ready to accept: its number, the request, its QP and
/// receive ring.
type PendingLane =
    (u16, ConnectRequest, rdma_verbs::QueuePair<'static, Rc, rdma_verbs::qp::state::Init>, Option<RecvRing<'static>>);

/// An extra lane of a session: its connection, and the receives its WRITEs with immediate
/// take.
struct RecvLane {
    conn: rdma_cm::Connection<'static>,
    ring: RecvRing<'static>,
}

/// What the receiver lets the sender do to its slots.
const GRANTED_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// One receive in progress: the machine, the file, the granted slots and the connection's
/// queues. Each `drive_*` method does one part of a round; `session`'s loop calls them in turn.
struct ReceiveSession<'a> {
    opts: &'a ReceiveOptions,
    /// The destination directory, open.
    dest: Option<&'a DirFd>,
    /// Wrong proofs of the secret, by address, and the peer's.
    attempts: &'a Attempts,
    /// The partials kept for resumes.
    partials: &'a Ledger,
    peer: std::net::IpAddr,
    /// The answer to a wrong proof, held back until then ([`crate::policy::proofs::WrongProofs::wrong_proof`]); set once
    /// the wrong proof was counted.
    tarpit: Option<Option<Instant>>,
    /// This connection's place among all connections: proved at admission, and until then
    /// one a newer connection may take ([`Place::displaced`]).
    place: &'a Place,
    active: &'a Arc<Seats>,
    tally: &'a Tally,
    routes: &'a Arc<Routes>,
    /// What extra lanes are made on (this connection's PD and channel).
    lane_base: LaneBase,
    /// This session's registration for its extra lanes, and where they are handed over.
    route: Option<(RouteGuard, std::sync::mpsc::Receiver<(u16, ConnectRequest)>)>,
    /// The extra lanes accepted, by number (lane `n` at `n - 1`).
    lanes: Vec<Option<RecvLane>>,
    report: &'a mut ReceiveReport,
    machine: Receiver,
    pd: Arc<rdma_verbs::ProtectionDomain<'static>>,
    control: SlotPool<'static>,
    sq: SendQueue<'static, Rc>,
    ring: RecvRing<'static>,
    /// This session's seat among `max_sessions`, from its valid HELLO on.
    admitted: Option<Seat>,
    /// Waiting for the seat of a session displaced for this one: the claim, until when it
    /// waits, and the open to do then.
    waiting: Option<(Ticket, Instant, Admitted)>,
    file: Option<Incoming>,
    /// The batch's entry in progress, and the directory its file is in.
    entry: Option<(Entry, Option<DirFd>)>,
    /// The directories this batch made (only those take a directory entry's mode and time).
    made_dirs: MadeDirs,
    /// The ring's address and rkey, once registered.
    ring_at: Option<(u64, u32)>,
    /// The slots granted to the sender (writable by it), by index.
    slots: Vec<Slot<'static>>,
    /// Where a chunk is copied out of its slot before it is hashed and stored: mapped for the
    /// session and unmapped with it (`AlignedBuffer`), not taken from the thread's malloc
    /// arena, which kept chunk-sized buffers resident after their sessions (`device_soak`).
    copy: Option<AlignedBuffer>,
    hasher: Hasher,
    data_start: Option<Instant>,
    data_end: Option<Instant>,
    /// When the last chunk was stored.
    last_stored: Option<Instant>,
    pacer: Pacer,
    /// When the connection probes for a lost tail ([`Prober`]).
    prober: Prober,
    /// The control message being sent: the machine writes each into it (no allocation per
    /// message).
    out: Vec<u8>,
    /// The test hook `test_never_ack`: since when the receiver floods old CREDITs.
    #[cfg(feature = "fault-injection")]
    flood: Option<Instant>,
}

impl<'a> ReceiveSession<'a> {
    fn new(
        shared: &'a Shared,
        place: &'a Place,
        report: &'a mut ReceiveReport,
        parts: EndpointParts,
        conn: &rdma_cm::Connection<'static>,
        start: Instant,
    ) -> Result<Self, Error> {
        report.phases.connect = start.elapsed();
        let Shared { opts, active, tally, routes, dest, attempts, partials } = shared;
        let EndpointParts { pd, lane_base, ring, control } = parts;
        let sq = SendQueue::new(conn.qp(), DRAIN)?;
        let cfg = ReceiverConfig {
            max_size: opts.max_size,
            max_session_bytes: opts.max_session_bytes,
            max_chunk: session_memory(opts).0,
            memory_budget: session_memory(opts).1,
            max_slots: opts.max_slots,
            timeout: opts.timeout,
            hello_timeout: opts.hello_timeout,
            min_rate: opts.min_rate,
            secret: opts.secret.clone(),
            resume: opts.resume && dest.is_some(),
            batch: true,
            max_entries: opts.max_entries,
            max_lanes: opts.max_lanes.clamp(1, wire::MAX_LANES),
            digest: opts.digest.unwrap_or_else(crate::driver::fastest_digest),
        };
        let peer = report.peer.ip();
        Ok(ReceiveSession {
            opts,
            dest: dest.as_ref(),
            attempts,
            partials,
            peer,
            tarpit: None,
            place,
            active,
            tally,
            routes,
            lane_base,
            route: None,
            lanes: Vec::new(),
            report,
            // The HELLO's clock runs from the connection's request on, not from its accept.
            machine: Receiver::new(cfg, start)
                .with_nonce(crate::driver::random_bytes())
                .with_lane_token(crate::driver::random_bytes()),
            pd,
            control,
            sq,
            ring,
            admitted: None,
            waiting: None,
            file: None,
            entry: None,
            made_dirs: MadeDirs::default(),
            ring_at: None,
            slots: Vec::new(),
            copy: None,
            hasher: Hasher::new(Digest::default(), None),
            data_start: None,
            data_end: None,
            last_stored: None,
            pacer: Pacer::new(opts.wait),
            prober: Prober::new(Instant::now()),
            out: Vec::new(),
            #[cfg(feature = "fault-injection")]
            flood: None,
        })
    }

    /// One round: the test hooks, the machine's actions, then the arrivals and completions.
    /// `Break` with the outcome once the session is over, else `Continue` saying whether
    /// anything progressed.
    fn drive_round(&mut self, conn: &rdma_cm::Connection<'static>) -> Result<ControlFlow<Outcome, bool>, Error> {
        self.drive_faults()?;
        if let Some(Some(until)) = self.tarpit {
            if Instant::now() < until {
                return Ok(ControlFlow::Continue(false));
            }
            self.tarpit = Some(None);
            send_control(&mut self.sq, &self.control, &self.out, self.opts.timeout, drop)?;
        }
        let admitted = self.drive_waiting(conn);
        let acted = match self.drive_actions(conn)? {
            ControlFlow::Break(o) => return Ok(ControlFlow::Break(o)),
            ControlFlow::Continue(acted) => acted,
        };
        let arrived = self.drive_arrivals()?;
        let completed = self.drive_completions()?;
        Ok(ControlFlow::Continue(admitted || acted || arrived || completed))
    }

    /// Ends the session: an uncommitted temporary is removed, the report filled in; the
    /// queues, the granted slots and the place among `max_sessions` are returned for the
    /// teardown, which must release the slots after the QP is destroyed, and the place only
    /// after the slots (a new session's share must not overlap a ring still registered).
    fn end(self, outcome: &Result<Outcome, Error>) -> Teardown {
        let ReceiveSession {
            report,
            machine,
            sq,
            ring,
            file,
            admitted,
            slots,
            data_start,
            data_end,
            last_stored,
            lanes,
            route,
            partials,
            opts,
            peer,
            ..
        } = self;
        // No lane is taken any more.
        drop(route);
        let lanes = lanes.into_iter().flatten().collect();
        // A partial outlives a session that ended in a way a resume can follow: the peer or the
        // path went, the peer went silent, the receiver stopped, a message was changed on the
        // path (as a cut connection, not a violation: someone on the path could otherwise make
        // the receiver throw the partial away). One that broke the rules or failed its digest
        // goes (as does everything of a session that was not resumable).
        let resumable = matches!(
            outcome,
            Err(Error::PeerDisconnected | Error::ConnectionLost { .. } | Error::Stopped | Error::Cancelled)
                | Ok(Outcome::Failed(
                    crate::ProtocolError::Timeout { .. }
                        | crate::ProtocolError::TooSlow { .. }
                        | crate::ProtocolError::Displaced
                        | crate::ProtocolError::CompletedTwice { .. }
                        | crate::ProtocolError::Unsealed
                        | crate::ProtocolError::Cancelled
                ))
        );
        let midway = file.is_some();
        // Whose the partial is: a sender that proved no secret is counted by its address.
        let authenticated = opts.secret.is_some() && machine.authorized();
        let owner = Owner { peer: (!authenticated).then_some(peer), authenticated };
        if let Some(mut f) = file {
            // A partial that holds nothing is worth nothing: it goes.
            if resumable && machine.bytes_stored() > 0 {
                // A session that added no byte to what it resumed from leaves the sidecar as it
                // was: rewritten, its time would keep a partial that no attempt gets past from
                // ever expiring.
                let added = machine.bytes_stored() > machine.resumed_from();
                partials.keep_for(&mut f, machine.bytes_stored(), added, owner);
            } else if resumable && f.vouched() > 0 {
                // Ended before its hash found anything to resume from (a stop, a read error):
                // the partial stays as its sidecar left it, however much it holds.
                let vouched = f.vouched();
                partials.keep_for(&mut f, vouched, false, owner);
            }
        }
        // A HELLO refused before anything was opened still named its session.
        report.session = machine.session();
        report.hello = machine.hello_received();
        report.authorized = machine.authorized();
        report.auth_failed = machine.auth_failed();
        report.bytes = if machine.is_batch() || report.entry_counts.ended > 0 {
            // The entries that ended, and the one in progress when the session ended midway.
            let midway = if midway { machine.bytes_stored() } else { 0 };
            report.entry_counts.bytes + midway
        } else {
            machine.bytes_stored()
        };
        // A session that failed midway reports the time to its last chunk stored, so that its
        // rate is that of the bytes it did store.
        if let (Some(a), Some(b)) = (data_start, data_end.or(last_stored)) {
            report.phases.data = b - a;
        }
        (sq, ring, slots, lanes, admitted)
    }

    /// Does what the machine asks: `Break` with the outcome once it finished, else `Continue`
    /// saying whether there was anything to do.
    fn drive_actions(&mut self, conn: &rdma_cm::Connection<'static>) -> Result<ControlFlow<Outcome, bool>, Error> {
        let mut acted = false;
        while let Some(action) = self.machine.poll_action() {
            acted = true;
            match action {
                Action::Open { name, size, slot_size, slot_count } => {
                    self.open(name, size, slot_size, slot_count, conn)
                }
                Action::Reserve { slot_size, slot_count } => self.reserve(slot_size, slot_count),
                Action::OpenEntry(e) => self.open_entry(e, conn),
                Action::EntryDone { path, status, detail, bytes, .. } => {
                    // A file not committed (its digest did not match, its open failed) goes.
                    self.file = None;
                    // Each entry counts towards the session's rate as towards its pace, so that
                    // a batch of small files is not taken for a slow session.
                    if let Some(seat) = &self.admitted {
                        seat.progress(crate::receiver::OFFER_CREDIT, Instant::now());
                    }
                    let directory = self.entry.take().is_some_and(|(e, _)| e.kind == EntryKind::Directory);
                    let bytes = if status == Status::Ok { bytes } else { 0 };
                    let counts = &mut self.report.entry_counts;
                    counts.ended += 1;
                    if status == Status::Ok {
                        counts.stored += 1;
                        counts.bytes += bytes;
                    }
                    if self.report.entries.len() < REPORTED_ENTRIES {
                        let detail = truncated(detail, wire::MAX_DETAIL_LEN);
                        self.report.entries.push(EntryReport { path, directory, status, detail, bytes });
                    }
                }
                Action::Send => {
                    self.machine.transmit(&mut self.out);
                    if self.machine.auth_failed() && self.tarpit.is_none() {
                        // The answer to a wrong proof: held back while its address is past its
                        // attempts (the rest of the machine's actions wait with it).
                        let hold = self.attempts.wrong_proof(
                            self.peer,
                            Instant::now(),
                            self.opts.auth_attempts,
                            self.opts.auth_window,
                        );
                        self.tarpit = Some((!hold.is_zero()).then(|| Instant::now() + hold));
                        if !hold.is_zero() {
                            tracing::info!(peer = %self.peer, ?hold, "a wrong proof of the secret: its answer held back");
                            return Ok(ControlFlow::Continue(true));
                        }
                    }
                    send_control(&mut self.sq, &self.control, &self.out, self.opts.timeout, drop)?;
                }
                Action::StoreChunk { seq, slot, offset, len } => self.store(seq, slot, offset, len),
                Action::StartOver => self.start_over(),
                #[cfg(feature = "fault-injection")]
                Action::Finalize { .. } if self.opts.test_never_ack => self.flood = Some(Instant::now()),
                Action::Finalize { digest } => self.finalize(&digest),
                // The session's end decides: a partial may be kept for a resume.
                Action::Discard => {}
                Action::Finish(o) => return Ok(ControlFlow::Break(o)),
            }
        }
        Ok(ControlFlow::Continue(acted))
    }

    /// Admits the session, opens the temporary and grants the slots (`Action::Open`).
    ///
    /// Each of the open's answers to the machine carries the time it is given, not the time the
    /// open began: the machine charges an open's time to the driver, not to the sender's pace
    /// (given the time the open began, a long open or hash would count as the sender's time).
    fn open(&mut self, name: String, size: u64, slot_size: u32, slot_count: u32, conn: &rdma_cm::Connection<'static>) {
        let now = Instant::now();
        let session = self.machine.session();
        self.report.session = session;
        self.report.name = Some(name.clone());
        let digest = self.machine.digest();
        tracing::info!(session = format_args!("{session:016x}"), %name, size, slot_size, slot_count, %digest, "receiving");
        self.hasher.reset(digest, self.machine.digest_key().as_ref());
        if let Err(why) = self.proved() {
            return self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now());
        }
        if let Some((status, why)) = self.judge(&name, false, size, false) {
            return self.machine.handle(Input::OpenFailed(status, why), Instant::now());
        }
        let then = Admitted::Open { name, size, slot_size, slot_count };
        match self.admit(then) {
            Err(why) => self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now()),
            Ok(Some(then)) => self.admitted(then, now, conn),
            Ok(None) => {}
        }
    }

    /// What follows a session's admission: its file's open and its ring (`then`), at `now`.
    fn admitted(&mut self, then: Admitted, now: Instant, conn: &rdma_cm::Connection<'static>) {
        match then {
            Admitted::Open { name, size, slot_size, slot_count } => {
                if let Some(dir) = self.dest {
                    if !self.open_file(dir, &name, &name, size, conn) {
                        return;
                    }
                }
                self.register(slot_size, slot_count, now);
            }
            Admitted::Reserve { slot_size, slot_count } => self.register(slot_size, slot_count, now),
        }
    }

    /// A session waiting for the seat of one displaced for it: takes it once given back and
    /// goes on with `then`, or past [`HEIR_WAIT`] refuses the session (`Busy`). Whether it
    /// did either.
    fn drive_waiting(&mut self, conn: &rdma_cm::Connection<'static>) -> bool {
        let authenticated = self.authenticated();
        let Some((ticket, until, _)) = self.waiting.as_mut() else { return false };
        if let Some(seat) = ticket.claim(authenticated) {
            self.admitted = Some(seat);
            let (_, _, then) = self.waiting.take().expect("waiting");
            self.admitted(then, Instant::now(), conn);
            return true;
        }
        if Instant::now() < *until {
            return false;
        }
        self.waiting = None;
        let why =
            format!("already serving {} transfers; the one giving way did not end in time", self.opts.max_sessions);
        self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now());
        true
    }

    /// Whether the sender proved the receiver's secret.
    fn authenticated(&self) -> bool {
        self.opts.secret.is_some() && self.machine.authorized()
    }

    /// The session proved itself (its HELLO taken, its secret proved): its connection keeps
    /// its place to its end. Called first thing at `Open` or `Reserve`, before the receiver's
    /// checks and the embedder's policy. `Err` with why (`Busy`) when the connection gave its
    /// place to a newer one already.
    fn proved(&self) -> Result<(), String> {
        match self.place.prove() {
            true => Ok(()),
            false => Err("this connection gave its place to a newer one".into()),
        }
    }

    /// Admits the session: it takes one of `max_sessions` seats (`Ok(Some(then))`: go on),
    /// or waits for the seat of a slower session displaced for it (`Ok(None)`: `then` is done
    /// once it has it, [`drive_waiting`](Self::drive_waiting)); `Err` with why (`Busy`) when
    /// they are all taken by sessions that may not be displaced.
    fn admit(&mut self, then: Admitted) -> Result<Option<Admitted>, String> {
        let now = Instant::now();
        match self.active.take(now, self.authenticated()) {
            Taken::Seat(seat) => {
                self.admitted = Some(seat);
                Ok(Some(then))
            }
            Taken::Wait(ticket) => {
                tracing::info!(
                    session = format_args!("{:016x}", self.machine.session()),
                    "waiting for a slow session's seat"
                );
                self.waiting = Some((ticket, now + HEIR_WAIT, then));
                Ok(None)
            }
            Taken::Busy => Err(format!("already serving {} transfers", self.opts.max_sessions)),
        }
    }

    /// A batch: admits the session and registers its ring (`Action::Reserve`).
    fn reserve(&mut self, slot_size: u32, slot_count: u32) {
        let now = Instant::now();
        let session = self.machine.session();
        self.report.session = session;
        self.report.name = Some(wire::BATCH_NAME.into());
        tracing::info!(session = format_args!("{session:016x}"), slot_size, slot_count, "receiving a batch");
        if let Err(why) = self.proved() {
            return self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now());
        }
        match self.admit(Admitted::Reserve { slot_size, slot_count }) {
            Err(why) => self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now()),
            Ok(Some(_)) => self.register(slot_size, slot_count, now),
            Ok(None) => {}
        }
    }

    /// Registers the ring of slots the sender writes into, and tells the machine.
    fn register(&mut self, slot_size: u32, slot_count: u32, now: Instant) {
        // Unmaps the previous entry's buffer, if any, before mapping this one.
        self.copy = None;
        self.copy = AlignedBuffer::zeroed(slot_size as usize);
        if self.copy.is_none() {
            let why = format!("mapping a {slot_size}-byte copy buffer failed");
            return self.machine.handle(Input::OpenFailed(Status::Internal, why), Instant::now());
        }
        let pool = match SlotPool::new(self.pd.clone(), slot_size as usize, slot_count as usize, GRANTED_ACCESS) {
            Ok(p) => p,
            Err(e) => return self.machine.handle(Input::OpenFailed(Status::Internal, e.to_string()), Instant::now()),
        };
        self.slots = std::iter::from_fn(|| pool.try_take()).collect();
        self.slots.sort_by_key(Slot::index);
        let remote = pool.remote();
        self.ring_at = Some((remote.addr, remote.rkey));
        let lanes = self.machine.lanes();
        if lanes > 1 && self.route.is_none() {
            self.route = Some(self.routes.register(self.machine.session(), lanes, self.machine.lane_token()));
            self.lanes = (1..lanes).map(|_| None).collect();
        }
        self.data_start = Some(now);
        if let Some(seat) = &self.admitted {
            seat.started(now);
        }
        self.machine.handle(Input::Ready { addr: remote.addr, rkey: remote.rkey }, Instant::now());
    }

    /// Takes the control messages and WRITEs with immediate that arrived; whether any came.
    fn drive_arrivals(&mut self) -> Result<bool, Error> {
        let counted = self.machine.authorized();
        let n = self.take_arrivals()?;
        if !counted && self.machine.authorized() {
            self.tally.asked.fetch_add(1, Ordering::AcqRel);
            self.tally.changed.ring();
        }
        Ok(n)
    }

    fn take_arrivals(&mut self) -> Result<bool, Error> {
        let machine = &mut self.machine;
        let mut n = take_arrivals(&mut self.ring, |msg| {
            let now = Instant::now();
            if msg.is_write_with_imm() {
                let imm = msg.imm().unwrap_or(u32::MAX);
                machine.handle(Input::WriteArrived { imm, len: msg.write_len() }, now);
            } else {
                machine.handle(Input::Message(msg.bytes()), now);
            }
        })?;
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let Some(RecvLane { ring, .. }) = lane else { continue };
            let lane = i as u16 + 1;
            n += take_arrivals(ring, |msg| {
                let now = Instant::now();
                if msg.is_write_with_imm() {
                    let imm = msg.imm().unwrap_or(u32::MAX);
                    machine.handle(Input::LaneWrite { lane, imm, len: msg.write_len() }, now);
                } else {
                    machine.handle(Input::LaneMessage { lane }, now);
                }
            })?;
        }
        Ok(n > 0)
    }

    /// The lane requests handed over since the last round, each accepted on a QP in this
    /// session's PD (the granted ring's rkey serves it) with its receives posted first.
    async fn accept_lanes<I: Io>(&mut self, io: &I) -> Result<(), Error> {
        while let Some((lane, req, qp, ring)) = self.next_lane()? {
            let params = conn_params(self.opts.ack_timeout);
            let conn = io.finish(req.accept(qp, &params), Deadline::after(self.opts.accept_timeout)).await?;
            self.attach(lane, conn, ring);
        }
        Ok(())
    }

    /// The next lane request handed over, if any, with its QP (in `Init`) and its receives
    /// posted; a request whose QP could not be made is rejected.
    fn next_lane(&mut self) -> Result<Option<PendingLane>, Error> {
        let Some((lane, req)) = self.route.as_ref().and_then(|(_, from)| from.try_recv().ok()) else {
            return Ok(None);
        };
        match self.lane_base.lane(1, ring_depth(self.opts), |qp| req.init_qp(qp, GRANTED_ACCESS)) {
            Ok((qp, ring)) => Ok(Some((lane, req, qp, ring))),
            Err(e) => {
                let _ = req.reject(&[]);
                Err(e.into())
            }
        }
    }

    /// Keeps an accepted lane, whose arrivals the rounds take from now on.
    fn attach(&mut self, lane: u16, conn: rdma_cm::Connection<'static>, ring: Option<RecvRing<'static>>) {
        let (Some(ring), Some(place)) = (ring, self.lanes.get_mut(usize::from(lane) - 1)) else { return };
        tracing::debug!(session = format_args!("{:016x}", self.machine.session()), lane, "lane accepted");
        *place = Some(RecvLane { conn, ring });
    }

    /// Takes the completions of the control messages sent; whether any came.
    fn drive_completions(&mut self) -> Result<bool, Error> {
        Ok(self.sq.poll(drop)? > 0)
    }

    /// Ends the round: spins or sleeps on the CQs ([`Pacer`]), and when the slow checks are due,
    /// the machine's timeout, whether the peer left, and whether the receiver is stopping.
    async fn drive_timers<I: Io>(
        &mut self,
        io: &I,
        progressed: bool,
        conn: &rdma_cm::Connection<'static>,
    ) -> Result<(), Error> {
        let cqs = SessionCqs::new(self.sq.cq(), self.ring.cq(), self.lanes.iter().flatten().map(|l| l.ring.cq()));
        let mut until = self.next_deadline();
        if progressed {
            self.prober.progressed(Instant::now());
        }
        if self.machine.takes_probes() && self.sq.in_flight() > 0 {
            until = until.min(Deadline::at(self.prober.deadline()));
        }
        let handed = self.route.as_ref().map(|(route, _)| &*route.handed);
        let mut wakes = session_wakes(conn, self.opts, self.place, self.machine.hello_received(), self.tally, handed);
        // A seat handed over, or this one's taken by a newer session.
        if let Some((ticket, _, _)) = &self.waiting {
            wakes = wakes.and(ticket.signal().fd());
        }
        if let Some(seat) = self.admitted.as_ref().filter(|s| !s.displaced()) {
            wakes = wakes.and(seat.signal().fd());
        }
        let due = self.pacer.round(io, progressed, &cqs, until, &wakes).await?;
        let probing = self.machine.takes_probes() && self.sq.in_flight() > 0;
        // `due` counts the probe as sent even without room, so that its deadline moves on.
        if due && probing && self.prober.due(Instant::now()) && self.sq.room() > 0 {
            // A CREDIT or a GRANT that was lost, or whose ACK was: the sender offered PROBES,
            // so its QP takes the zero-length WRITE.
            self.sq.probe(CONTROL_WR_ID)?;
        }
        self.drive_slow_checks(due, conn)
    }

    /// What ends the session when `e` is the peer's disconnect: a receive that failed before
    /// it (the device refused the peer's request; [`explain_loss`] names the violation), else
    /// the disconnect. The peer's WRITE, refused, failed a receive before the peer heard of it
    /// and left, but the wake that saw the disconnect may have come before the round that would
    /// have taken that completion (both fds ready at once): the rings are read once more.
    fn after_disconnect(&mut self, e: Error) -> Error {
        if !matches!(e, Error::PeerDisconnected) {
            return e;
        }
        match self.take_arrivals() {
            Err(lost @ Error::ConnectionLost { .. }) => lost,
            // The sender's CANCEL, read only now: it said its send was cancelled, then left.
            Ok(_) if self.finish_cancelled() => Error::Cancelled,
            _ => e,
        }
    }

    /// Whether the sender sent CANCEL before it left; if so, the chunks that arrived before it
    /// are stored (a resume continues after them), and the machine's other actions, for a peer
    /// that is gone, are dropped.
    fn finish_cancelled(&mut self) -> bool {
        if !self.machine.cancelled() {
            return false;
        }
        while let Some(a) = self.machine.poll_action() {
            if let Action::StoreChunk { seq, slot, offset, len } = a {
                self.store(seq, slot, offset, len);
            }
        }
        true
    }

    /// When the session must look at its clock next: the machine's deadline, a held-back
    /// answer, the test flood's next message.
    fn next_deadline(&self) -> Deadline {
        let at = |t: Option<Instant>| t.map_or(Deadline::never(), Deadline::at);
        let mut until = at(self.machine.poll_timeout());
        if let Some(Some(tarpit)) = self.tarpit {
            until = until.min(Deadline::at(tarpit));
        }
        if let Some((_, wait, _)) = &self.waiting {
            until = until.min(Deadline::at(*wait));
        }
        #[cfg(feature = "fault-injection")]
        if let Some(last) = self.flood {
            until = until.min(Deadline::at(last + FLOOD_EVERY));
        }
        until
    }

    /// Every round, what costs a load: whether the peer's disconnect was seen (by any read
    /// of the connection's events, the hash of a partial's too), the receiver stops, the
    /// connection was displaced, the server closed before its HELLO. When `due` (a wake or a
    /// deadline ended the idle wait, or `SLOW_EVERY` busy rounds): the machine's timeout, the
    /// connection's CM events, the lanes handed over.
    fn drive_slow_checks(&mut self, due: bool, conn: &rdma_cm::Connection<'static>) -> Result<(), Error> {
        if due {
            self.machine.handle_timeout(Instant::now());
            if peer_left(conn)? {
                return Err(Error::PeerDisconnected);
            }
            if let Some((route, _)) = &self.route {
                // The lanes handed over are taken by the next round.
                route.handed.heard();
            }
        }
        if conn.peer_disconnected() {
            return Err(Error::PeerDisconnected);
        }
        if self.opts.stop.is_set() {
            return Err(Error::Stopped);
        }
        if self.place.displaced() {
            // Not proved in `preempt_after`, with every place taken: a newer connection has this
            // one's place.
            return Err(Error::Preempted);
        }
        if self.admitted.as_ref().is_some_and(Seat::displaced) {
            // Too slow for its share, with every seat taken: a newer session waits for this
            // one's seat. It says so (Busy, and when to come back) and keeps its partial.
            self.machine.give_way(DISPLACED_HINT, Instant::now());
        }
        if !self.machine.hello_received() && self.tally.closing.is_set() {
            // The server took the transfers it serves; this connection asked for none.
            return Err(Error::Stopped);
        }
        Ok(())
    }

    /// The test hook `test_never_ack`: once the FIN came, an old CREDIT every [`FLOOD_EVERY`].
    #[cfg(feature = "fault-injection")]
    fn drive_faults(&mut self) -> Result<(), Error> {
        let Some(last) = self.flood else { return Ok(()) };
        if last.elapsed() >= FLOOD_EVERY {
            self.flood = Some(Instant::now());
            let credit = Message::Credit(wire::Credit { consumed: 0 });
            if wire::encode(self.machine.session(), &credit, &mut self.out).is_ok() {
                send_control(&mut self.sq, &self.control, &self.out, self.opts.timeout, drop)?;
            }
        }
        Ok(())
    }

    #[cfg(not(feature = "fault-injection"))]
    fn drive_faults(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// What wakes a session's idle wait besides its completions: its connection's CM events, the
/// receiver's stop, its displacement (while it may be displaced), the server closing (while it
/// has no HELLO), its lanes' hand-over (`handed`, once it granted lanes).
fn session_wakes<'w>(
    conn: &'w rdma_cm::Connection<'static>,
    opts: &'w ReceiveOptions,
    place: &'w Place,
    hello_received: bool,
    tally: &'w Tally,
    handed: Option<&'w Bell>,
) -> Wakes<'w> {
    let mut wakes = Wakes::new(conn.as_fd()).and(opts.stop.fd());
    if let Some(bell) = place.displaceable() {
        wakes = wakes.and(bell.fd());
    }
    if !hello_received {
        wakes = wakes.and(tally.closing.fd());
    }
    if let Some(handed) = handed {
        wakes = wakes.and(handed.fd());
    }
    wakes
}

/// How often the test hook `test_never_ack` sends an old CREDIT.
#[cfg(feature = "fault-injection")]
const FLOOD_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// `s` cut to at most `max` bytes, at a character's boundary.
fn truncated(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reported_detail_is_cut_at_a_character_boundary() {
        assert_eq!(super::truncated("abc".into(), 5), "abc");
        assert_eq!(super::truncated("abcdef".into(), 3), "abc");
        // "é" is two bytes: a cut inside it keeps the character out.
        assert_eq!(super::truncated("aé".into(), 2), "a");
        let long = format!("{:?}", "\\".repeat(960));
        assert_eq!(super::truncated(long, crate::wire::MAX_DETAIL_LEN).len(), crate::wire::MAX_DETAIL_LEN);
    }
}
