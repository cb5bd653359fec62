//! One send in progress: the machine, the file, the connection's queues and lanes, and the
//! `drive_*` parts of a round; its summary once the queues are gone.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_verbs::{
    AccessFlags, Deadline, ProtectionDomain, Rc, RecvRing, RemoteRegion, SendQueue, Slot, SlotPool, SlotRequest,
    WcStatus,
};

use crate::driver::digest::Hasher;
use crate::driver::io::{Io, Wakes};
use crate::driver::link::{
    conn_params, peer_left, send_control, take_arrivals, EndpointParts, LaneBase, Pacer, SessionCqs, CONTROL_WR_ID,
    DRAIN, PROBE_WRS,
};
use crate::driver::probe::Prober;
use crate::driver::{Error, Phases};
use crate::sender::{Action, Input, Sender};
use crate::wire::{self, Message};
use crate::{Digest, Outcome, ProtocolError, Status};

use super::source::*;
#[cfg(feature = "fault-injection")]
use super::AfterFin;
use super::{refusal, SendOptions, SendReport};
use crate::driver::batch::BatchState;

/// What the report of a send is made of, once its queues are gone.
pub(crate) struct SendSummary {
    pub(crate) machine: Sender,
    pub(crate) size: u64,
    pub(crate) session: u64,
    pub(crate) start: Instant,
    pub(crate) connect: Duration,
    pub(crate) granted_at: Option<Instant>,
    /// When the extra lanes were connected (none on one lane).
    pub(crate) lanes_at: Option<Instant>,
    pub(crate) data_end: Option<Instant>,
    pub(crate) fin_at: Option<Instant>,
}

impl SendSummary {
    /// The session's outcome as the caller sees it.
    pub(crate) fn report(self, outcome: Result<Outcome, Error>) -> Result<SendReport, Error> {
        let SendSummary { machine, size, session, start, connect, granted_at, lanes_at, data_end, fin_at } = self;
        let end = Instant::now();
        match outcome? {
            // In place already, identical: no GRANT, nothing sent.
            Outcome::Acked { status: Status::Ok, .. } if machine.grant().is_none() && machine.proved_whole() => {
                let mut phases = Phases { connect, ..Phases::default() };
                phases.grant = end.duration_since(start).saturating_sub(connect);
                Ok(SendReport {
                    session,
                    bytes: size,
                    chunk: 0,
                    slots: 0,
                    phases,
                    total: end - start,
                    resumed_from: size,
                    lanes: 1,
                    digest: machine.digest(),
                    retries: 0,
                    already_stored: true,
                })
            }
            Outcome::Acked { status: Status::Ok, .. } => {
                let g = *machine.grant().expect("an OK ACK follows a grant");
                let fin = fin_at.unwrap_or(end);
                let granted = granted_at.unwrap_or(start);
                let data_start = lanes_at.unwrap_or(granted);
                let mut phases = Phases { connect, ..Phases::default() };
                phases.grant = granted.duration_since(start).saturating_sub(connect);
                phases.lanes = data_start.duration_since(granted);
                phases.data = data_end.unwrap_or(fin).duration_since(data_start);
                phases.digest = end.duration_since(fin);
                Ok(SendReport {
                    session,
                    bytes: size,
                    chunk: g.slot_size,
                    slots: g.slot_count,
                    phases,
                    total: end - start,
                    resumed_from: g.resume_from,
                    lanes: machine.lanes(),
                    digest: machine.digest(),
                    retries: 0,
                    already_stored: false,
                })
            }
            Outcome::Acked { status, detail } => {
                Err(Error::Refused { status, detail, retry_after: machine.retry_after() })
            }
            Outcome::Failed(e) => Err(e.into()),
        }
    }
}

/// One send in progress: the machine, the file, and the connection's queues. Each `drive_*`
/// method does one part of a round; `send_file`'s loop calls them in turn.
pub(crate) struct SendSession<'a> {
    pub(crate) opts: &'a SendOptions,
    pub(crate) path: PathBuf,
    pub(crate) machine: Sender,
    /// The file being sent (none yet in a batch before its first file).
    pub(crate) file: Option<std::fs::File>,
    /// A batch's entries and results.
    pub(crate) batch: Option<BatchState>,
    /// The file as it was opened ([`Identity`]).
    pub(crate) identity: Identity,
    pub(crate) size: u64,
    pub(crate) session: u64,
    pub(crate) start: Instant,
    pub(crate) connect: Duration,
    /// The connection's PD (and, through it, its device context).
    pub(crate) pd: Arc<ProtectionDomain<'static>>,
    /// The local slots chunks are read into and written from.
    pub(crate) data: SlotPool<'static>,
    pub(crate) control: SlotPool<'static>,
    pub(crate) sq: SendQueue<'static, Rc>,
    pub(crate) ring: RecvRing<'static>,
    /// What extra lanes are made on (this connection's PD and channel).
    pub(crate) lane_base: LaneBase,
    /// The extra lanes, once connected: lane `n` is `lanes[n - 1]`.
    pub(crate) lanes: Vec<SendLane>,
    pub(crate) hasher: Hasher,
    /// The forger's digest of what is sent ([`SendOptions::test_tamper`]).
    #[cfg(feature = "fault-injection")]
    pub(crate) forger: Option<Hasher>,
    /// Chunks read and not yet pushed, with their slots.
    pub(crate) read: VecDeque<(u64, Slot<'static>)>,
    /// Chunks whose WRITE completed since the machine was last told.
    pub(crate) done: Vec<u64>,
    pub(crate) failed: Option<Error>,
    pub(crate) granted_at: Option<Instant>,
    /// When the extra lanes were connected.
    pub(crate) lanes_at: Option<Instant>,
    /// Whether the bytes the receiver already held were hashed.
    pub(crate) held_hashed: bool,
    pub(crate) data_end: Option<Instant>,
    pub(crate) fin_at: Option<Instant>,
    pub(crate) pacer: Pacer,
    /// When the connection and its lanes probe for a lost tail ([`Prober`]).
    pub(crate) prober: Prober,
    /// The progress last reported: the batch entry it was of (its index; `None` for a single
    /// file) and its chunks written. Completions are taken in several places of a round; the
    /// caller hears of each chunk once, from [`report_progress`](Self::report_progress).
    pub(crate) reported: (Option<u32>, u64),
    /// The control message being sent: the machine writes each into it (no allocation per
    /// message).
    pub(crate) out: Vec<u8>,
}

impl<'a> SendSession<'a> {
    pub(crate) fn new(
        opts: &'a SendOptions,
        path: &Path,
        source: SourceFile,
        parts: EndpointParts,
        conn: &rdma_cm::Connection<'static>,
        start: Instant,
    ) -> Result<Self, Error> {
        let EndpointParts { pd, lane_base, ring, control } = parts;
        let connect = start.elapsed();
        let SourceFile { file, size, session, machine, identity, chunk } = source;
        let data = SlotPool::new(pd.clone(), chunk as usize, opts.depth as usize, AccessFlags::LOCAL_WRITE)?;
        let sq = SendQueue::new(conn.qp(), DRAIN)?;
        Ok(SendSession {
            opts,
            path: path.to_path_buf(),
            machine,
            file,
            batch: None,
            identity,
            size,
            session,
            start,
            connect,
            pd,
            data,
            control,
            sq,
            ring,
            lane_base,
            lanes: Vec::new(),
            hasher: Hasher::new(Digest::default(), None),
            #[cfg(feature = "fault-injection")]
            forger: None,
            read: VecDeque::new(),
            done: Vec::new(),
            failed: None,
            granted_at: None,
            lanes_at: None,
            held_hashed: false,
            data_end: None,
            fin_at: None,
            pacer: Pacer::new(opts.wait),
            prober: Prober::new(Instant::now()),
            reported: (None, 0),
            out: Vec::new(),
        })
    }

    /// One round: the machine's actions, then the completions and arrivals. `Break` with the
    /// session's outcome once it is over, else `Continue` saying whether anything progressed.
    pub(crate) fn drive_round(
        &mut self,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<ControlFlow<Result<Outcome, Error>, bool>, Error> {
        // Completions the last round's waits took are reported before the machine can finish.
        self.report_progress(progress);
        let pushed = match self.drive_actions()? {
            ControlFlow::Break(o) => return Ok(ControlFlow::Break(Ok(o))),
            ControlFlow::Continue(pushed) => pushed,
        };
        let completed = self.drive_completions()?;
        self.report_progress(progress);
        let arrived = self.drive_arrivals()?;
        Ok(ControlFlow::Continue(pushed || completed || arrived))
    }

    /// The file being sent.
    pub(crate) fn file(&self) -> Result<&std::fs::File, Error> {
        self.file.as_ref().ok_or_else(|| ProtocolError::Local("a chunk read without a file".into()).into())
    }

    pub(crate) fn file_err(&self, e: std::io::Error) -> Error {
        Error::File { path: self.path.display().to_string(), source: e }
    }

    /// Does what the machine asks: `Break` with the outcome once it finished, else `Continue`
    /// saying whether WRITEs were submitted.
    pub(crate) fn drive_actions(&mut self) -> Result<ControlFlow<Outcome, bool>, Error> {
        let mut pushed = false;
        while let Some(action) = self.machine.poll_action() {
            match action {
                Action::Send => self.send_message()?,
                Action::ReadChunk { seq, offset, len } => self.read_chunk(seq, offset, len)?,
                Action::WriteChunk { seq, len, remote_addr, rkey, imm } => {
                    let Some(pos) = self.read.iter().position(|(s, _)| *s == seq) else {
                        return Err(ProtocolError::Local(format!("chunk {seq} was not read")).into());
                    };
                    let (_, slot) = self.read.remove(pos).expect("position found above");
                    let remote = RemoteRegion { addr: remote_addr, rkey, len: u64::from(len) };
                    let req = SlotRequest::write(slot, len as usize, remote).with_imm(imm).with_wr_id(seq);
                    let sq = match self.machine.lane_of(seq) {
                        0 => &mut self.sq,
                        n => match self.lanes.get_mut(usize::from(n) - 1) {
                            Some(lane) => &mut lane.sq,
                            None => return Err(ProtocolError::Local(format!("lane {n} is not connected")).into()),
                        },
                    };
                    sq.push(req).map_err(|r| Error::from(r.error))?;
                    pushed = true;
                }
                Action::NeedDigest => {
                    self.check_unchanged()?;
                    let digest = self.hasher.finish();
                    #[cfg(feature = "fault-injection")]
                    let digest = self.forger.as_ref().map_or(digest, Hasher::finish);
                    self.machine.handle(Input::Digest(digest), Instant::now());
                }
                Action::ProvePrefix { from, key } => {
                    let mac = self.prove_prefix(from, &key)?;
                    self.machine.handle(Input::PrefixProof { mac }, Instant::now());
                }
                Action::NextEntry => self.next_entry(),
                Action::EntryDone { status, detail, received, .. } => {
                    if let Some(b) = &mut self.batch {
                        b.entry_done(status, detail, received);
                    }
                }
                Action::Finish(o) => return Ok(ControlFlow::Break(o)),
            }
        }
        if pushed {
            self.sq.submit()?;
            for lane in &mut self.lanes {
                lane.sq.submit()?;
            }
        }
        Ok(ControlFlow::Continue(pushed))
    }

    pub(crate) fn send_message(&mut self) -> Result<(), Error> {
        self.machine.transmit(&mut self.out);
        let fin = wire::decode_header(&self.out).is_ok_and(|h| h.kind == wire::Kind::Fin);
        if fin && self.fin_at.is_none() {
            self.fin_at = Some(Instant::now());
        }
        let (done, failed) = (&mut self.done, &mut self.failed);
        send_control(&mut self.sq, &self.control, &self.out, self.opts.timeout, |c| collect(c, done, failed))?;
        #[cfg(feature = "fault-injection")]
        if let Some(after) = self.opts.test_after_fin.filter(|_| fin) {
            send_after_fin(after, &mut self.sq, &self.control, &self.out, &self.machine, self.opts.timeout)?;
        }
        Ok(())
    }

    /// Fails with [`Error::SourceChanged`] when the file is not as it was opened.
    pub(crate) fn check_unchanged(&self) -> Result<(), Error> {
        let now = Identity::of(&self.file()?.metadata().map_err(|e| self.file_err(e))?);
        if now == self.identity {
            return Ok(());
        }
        let was = self.identity;
        let what = if now.size != was.size {
            format!("its size went from {} to {} bytes", was.size, now.size)
        } else if now.mtime != was.mtime {
            "it was modified".to_owned()
        } else {
            "its status changed (ctime)".to_owned()
        };
        Err(Error::SourceChanged { path: self.path.display().to_string(), what })
    }

    pub(crate) fn read_chunk(&mut self, seq: u64, offset: u64, len: u32) -> Result<(), Error> {
        let Some(mut slot) = self.data.try_take() else {
            return Err(ProtocolError::Local("no free data slot: depth exceeded".into()).into());
        };
        #[cfg(feature = "fault-injection")]
        if let Some(delay) = self.opts.test_chunk_delay {
            std::thread::sleep(delay);
        }
        match slot.read_file(self.file()?, offset, len as usize) {
            Ok(n) if n == len as usize => {}
            Ok(n) => {
                let e = std::io::ErrorKind::UnexpectedEof;
                return Err(
                    self.file_err(std::io::Error::new(e, format!("file shrank: {n} of {len} bytes at {offset}")))
                );
            }
            Err(e) => return Err(self.file_err(e)),
        }
        // The data pool is not remotely writable: a plain slice of it is sound.
        if let Ok(bytes) = slot.as_slice() {
            self.hasher.update(&bytes[..len as usize]);
        }
        #[cfg(feature = "fault-injection")]
        if let Some(forger) = &mut self.forger {
            if let Ok(bytes) = slot.as_mut_slice() {
                if self.opts.test_tamper == Some(seq) && len > 0 {
                    bytes[0] ^= 0x5a;
                }
                forger.update(&bytes[..len as usize]);
            }
        }
        self.read.push_back((seq, slot));
        self.machine.handle(Input::ChunkRead { seq }, Instant::now());
        Ok(())
    }

    /// Takes the send queue's completions and tells the machine; whether any came. The
    /// caller hears of them from [`report_progress`](Self::report_progress).
    pub(crate) fn drive_completions(&mut self) -> Result<bool, Error> {
        let (done, failed) = (&mut self.done, &mut self.failed);
        let mut n = self.sq.poll(|c| collect(c, done, failed))?;
        for lane in &mut self.lanes {
            n += lane.sq.poll(|c| collect(c, done, failed))?;
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        for &seq in &self.done {
            self.machine.handle(Input::WriteDone { seq }, Instant::now());
        }
        if !self.done.is_empty() {
            self.done.clear();
            if self.machine.chunks_written() == self.machine.chunks() && self.data_end.is_none() {
                self.data_end = Some(Instant::now());
            }
        }
        Ok(n > 0)
    }

    /// Tells `progress` of each chunk written since it last heard, one call per chunk (with
    /// lanes, a chunk counts once the chunks before it are written too).
    pub(crate) fn report_progress(&mut self, progress: &mut impl FnMut(u64, u64)) {
        // In a batch, keyed by the entry, and only while one is sent: from its ACK on, the
        // machine has no entry but counts its chunks until the next starts, and the bytes
        // before it grow only once the driver took the ACK's EntryDone.
        let entry = match (&self.batch, self.machine.entry()) {
            (None, _) => None,
            (Some(_), Some(e)) => Some(e.index),
            (Some(_), None) => return,
        };
        if self.reported.0 != entry {
            self.reported = (entry, 0);
        }
        let (before, total) = self.batch.as_ref().map_or((0, self.size), |b| (b.done_bytes, b.total));
        let written = self.machine.chunks_written();
        if written <= self.reported.1 {
            return;
        }
        let slot = u64::from(self.machine.grant().map_or(1, |g| g.slot_size));
        let held = self.machine.resumed_from();
        for chunk in self.reported.1 + 1..=written {
            progress(before + held.saturating_add(chunk * slot).min(self.size), total);
        }
        self.reported.1 = written;
    }

    /// Takes the control messages that arrived; whether any came.
    pub(crate) fn drive_arrivals(&mut self) -> Result<bool, Error> {
        let (machine, granted_at) = (&mut self.machine, &mut self.granted_at);
        let n = take_arrivals(&mut self.ring, |msg| {
            let was_granted = machine.grant().is_some();
            machine.handle(Input::Message(msg.bytes()), Instant::now());
            if !was_granted && machine.grant().is_some() {
                *granted_at = Some(Instant::now());
            }
        })?;
        if self.machine.sending() && !self.held_hashed {
            self.held_hashed = true;
            // The file's first bytes: hashed with the digest the GRANT named.
            self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
            #[cfg(feature = "fault-injection")]
            if self.opts.test_tamper.is_some() {
                // Without the secret: no key.
                self.forger = Some(Hasher::without_key(self.machine.digest()));
            }
            self.note_resumed();
            self.hash_held()?;
        }
        Ok(n > 0)
    }

    /// Hashes the bytes the receiver already holds (its GRANT's `resume_from`), before any
    /// chunk after them: the digest covers every byte of the file.
    pub(crate) fn hash_held(&mut self) -> Result<(), Error> {
        use std::os::unix::fs::FileExt;
        let held = self.machine.resumed_from();
        if held > 0 {
            tracing::info!(session = format_args!("{:016x}", self.session), held, "resuming");
        }
        let mut buf = vec![0u8; (1 << 20).min(held as usize)];
        let mut at = 0u64;
        while at < held {
            let n = (held - at).min(buf.len() as u64) as usize;
            self.file()?.read_exact_at(&mut buf[..n], at).map_err(|e| self.file_err(e))?;
            self.hasher.update(&buf[..n]);
            #[cfg(feature = "fault-injection")]
            if let Some(forger) = &mut self.forger {
                forger.update(&buf[..n]);
            }
            at += n as u64;
        }
        Ok(())
    }

    /// The proof that this sender holds the file's first `from` bytes (`Action::ProvePrefix`):
    /// BLAKE3 keyed with `key` over them, read from the file.
    pub(crate) fn prove_prefix(&self, from: u64, key: &crate::digest::DigestKey) -> Result<[u8; 32], Error> {
        use std::os::unix::fs::FileExt;
        let mut hasher = blake3::Hasher::new_keyed(key.as_bytes());
        let mut buf = vec![0u8; (1 << 20).min(from as usize)];
        let mut at = 0u64;
        while at < from {
            let n = (from - at).min(buf.len() as u64) as usize;
            self.file()?.read_exact_at(&mut buf[..n], at).map_err(|e| self.file_err(e))?;
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        Ok(*hasher.finalize().as_bytes())
    }

    /// Ends the round: spins or sleeps on the CQs ([`Pacer`]), and when the slow checks are due,
    /// the machine's timeout and whether the peer left.
    pub(crate) async fn drive_timers<I: Io>(
        &mut self,
        io: &I,
        progressed: bool,
        conn: &rdma_cm::Connection<'static>,
    ) -> Result<(), Error> {
        let cqs = SessionCqs::new(self.sq.cq(), self.ring.cq(), self.lanes.iter().map(|l| l.sq.cq()))
            .quiet_send(self.machine.waits_for_room());
        // Asleep until a completion, the peer's CM event, the cancel, the machine's deadline,
        // or the next probe's.
        let mut until = self.machine.poll_timeout().map_or(Deadline::never(), Deadline::at);
        if progressed {
            self.prober.progressed(Instant::now());
        }
        if self.in_flight() {
            until = until.min(Deadline::at(self.prober.deadline()));
        }
        let wakes = Wakes::new(conn.as_fd()).and(self.opts.cancel.fd());
        let due = self.pacer.round(io, progressed, &cqs, until, &wakes).await?;
        if due {
            self.drive_probes()?;
        }
        self.drive_slow_checks(due, conn)
    }

    /// Whether any request of the connection or its lanes is in flight.
    fn in_flight(&self) -> bool {
        self.sq.in_flight() > 0 || self.lanes.iter().any(|l| l.sq.in_flight() > 0)
    }

    /// When a probe is due ([`Prober`]): one on the connection and on each lane with requests
    /// in flight and room for it.
    pub(crate) fn drive_probes(&mut self) -> Result<(), Error> {
        if !self.in_flight() || Instant::now() < self.prober.deadline() {
            return Ok(());
        }
        // Completions that came while the send CQ was quiet (`SessionCqs::quiet_send`) are
        // progress: no probe for requests already done.
        if self.drive_completions()? {
            self.prober.progressed(Instant::now());
            return Ok(());
        }
        if !self.in_flight() || !self.prober.due(Instant::now()) {
            return Ok(());
        }
        for sq in std::iter::once(&mut self.sq).chain(self.lanes.iter_mut().map(|l| &mut l.sq)) {
            if sq.in_flight() > 0 && sq.room() > 0 {
                sq.probe(CONTROL_WR_ID)?;
            }
        }
        Ok(())
    }

    /// Whether the GRANT asks for lanes not yet connected.
    pub(crate) fn lanes_due(&self) -> Option<(u16, [u8; wire::LANE_TOKEN_LEN])> {
        let l = self.machine.grant()?.lanes?;
        (self.lanes.len() + 1 < usize::from(l.count)).then_some((l.count, l.token))
    }

    /// The LANE message lane `lane` presents as its connect private data.
    pub(crate) fn lane_message(&self, lane: u16, token: [u8; wire::LANE_TOKEN_LEN]) -> Result<Vec<u8>, Error> {
        #[cfg(feature = "fault-injection")]
        let token = self.opts.test_lane_token.unwrap_or(token);
        let mut bytes = Vec::new();
        wire::encode(self.session, &Message::Lane(wire::Lane { lane, token }), &mut bytes)
            .map_err(|e| Error::Protocol(e.into()))?;
        Ok(bytes)
    }

    /// Connects the extra lanes the GRANT granted, each a connection to the receiver in this
    /// connection's PD, within `connect_timeout` together.
    pub(crate) async fn connect_lanes<I: Io>(&mut self, io: &I) -> Result<(), Error> {
        let Some((count, token)) = self.lanes_due() else { return Ok(()) };
        let deadline = Deadline::after(self.opts.connect_timeout);
        #[cfg(feature = "fault-injection")]
        if let Some(delay) = self.opts.test_lane_delay {
            io.sleep(delay.min(deadline.remaining())).await;
        }
        for lane in self.lanes.len() as u16 + 1..count {
            let private = self.lane_message(lane, token)?;
            let id = io
                .finish(rdma_cm::CmId::new()?.resolve(self.opts.from, self.opts.to), deadline)
                .await
                .map_err(refusal)?;
            let send_wr = self.opts.depth + PROBE_WRS;
            let (qp, _) = self.lane_base.lane(send_wr, 0, |qp| id.init_qp(qp, AccessFlags::LOCAL_WRITE))?;
            let params = conn_params(self.opts.ack_timeout).private_data(&private);
            let conn = io.finish(id.connect(qp, &params), deadline).await.map_err(refusal)?;
            let sq = SendQueue::new(conn.qp(), DRAIN)?;
            self.lanes.push(SendLane { conn, sq });
        }
        tracing::debug!(session = format_args!("{:016x}", self.session), lanes = count, "lanes connected");
        self.lanes_connected();
        Ok(())
    }

    /// The lanes are up: the data phase starts now, and its timeout counts from now
    /// ([`Input::LanesConnected`]).
    pub(crate) fn lanes_connected(&mut self) {
        let now = Instant::now();
        self.lanes_at = Some(now);
        self.machine.handle(Input::LanesConnected, now);
    }

    /// Whether the send is cancelled (every round: one relaxed load), and when `due`: the
    /// machine's timeout and whether the peer left.
    pub(crate) fn drive_slow_checks(&mut self, due: bool, conn: &rdma_cm::Connection<'static>) -> Result<(), Error> {
        if self.opts.cancel.is_set() {
            self.send_cancel();
            return Err(Error::Cancelled);
        }
        if due {
            // A WRITE's completion is progress: take any that came while the send CQ was quiet
            // (`SessionCqs::quiet_send`) before the machine judges the session stalled.
            self.drive_completions()?;
            self.machine.handle_timeout(Instant::now());
            if peer_left(conn)? {
                return Err(Error::PeerDisconnected);
            }
        }
        // A disconnect seen by any read of the connection's events (a load).
        if conn.peer_disconnected() {
            return Err(Error::PeerDisconnected);
        }
        Ok(())
    }

    /// Tells the receiver the send is cancelled (a CANCEL, when it granted [`wire::caps::CANCEL`]):
    /// posted before the teardown, which lets the last sends complete before it disconnects.
    /// A CANCEL that cannot be sent is no matter: the receiver then sees the peer leave.
    pub(crate) fn send_cancel(&mut self) {
        self.machine.cancel();
        while let Some(action) = self.machine.poll_action() {
            if action == Action::Send {
                let _ = self.send_message();
            }
        }
    }

    /// Splits the session, once over, into its queues (to tear down) and its summary.
    pub(crate) fn into_parts(
        self,
    ) -> (SendQueue<'static, Rc>, RecvRing<'static>, SendSummary, Option<BatchState>, Vec<SendLane>) {
        let SendSession {
            machine,
            sq,
            ring,
            size,
            session,
            start,
            connect,
            granted_at,
            lanes_at,
            data_end,
            fin_at,
            batch,
            lanes,
            ..
        } = self;
        let summary = SendSummary { machine, size, session, start, connect, granted_at, lanes_at, data_end, fin_at };
        (sq, ring, summary, batch, lanes)
    }
}

/// An extra lane of a send: its connection and the send queue its chunks go on.
pub(crate) struct SendLane {
    pub(crate) conn: rdma_cm::Connection<'static>,
    pub(crate) sq: SendQueue<'static, Rc>,
}

/// The test hook [`SendOptions::test_after_fin`]: what a hostile sender sends right after its
/// FIN (`fin`), without waiting for anything.
#[cfg(feature = "fault-injection")]
pub(crate) fn send_after_fin(
    after: AfterFin,
    sq: &mut SendQueue<'static, rdma_verbs::Rc>,
    control: &SlotPool<'static>,
    fin: &[u8],
    machine: &Sender,
    timeout: Duration,
) -> rdma_verbs::Result<()> {
    match after {
        AfterFin::Junk => send_control(sq, control, &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3], timeout, drop),
        AfterFin::SecondFin => send_control(sq, control, fin, timeout, drop),
        AfterFin::Write => {
            let (Some(g), Some(slot)) = (machine.grant(), control.try_take()) else { return Ok(()) };
            let len = g.slot_size.min(8) as usize;
            let remote = RemoteRegion { addr: g.addr, rkey: g.rkey, len: len as u64 };
            let imm = machine.chunks() as u32;
            sq.push(SlotRequest::write(slot, len, remote).with_imm(imm).with_wr_id(CONTROL_WR_ID))
                .map_err(|r| r.error)?;
            sq.submit().map(drop)
        }
    }
}

/// Sorts a completion: data WRITEs report their chunk; a failure ends the session. A request
/// that failed on the peer's or the path's account is [`Error::ConnectionLost`] (which the
/// session's loop explains: [`explain_loss`]); one refused for a local reason (a bug of ours)
/// stays the verbs error.
pub(crate) fn collect(c: rdma_verbs::SlotCompletion<'static>, done: &mut Vec<u64>, failed: &mut Option<Error>) {
    if let Err(e) = c.ok() {
        let local = [WcStatus::LocalLengthError, WcStatus::LocalProtectionError, WcStatus::LocalAccessError];
        let e = match e {
            rdma_verbs::Error::WorkCompletion { status, .. } if !local.contains(&status) => {
                Error::ConnectionLost { status }
            }
            e => e.into(),
        };
        failed.get_or_insert(e);
        return;
    }
    if c.wr_id != CONTROL_WR_ID {
        done.push(c.wr_id);
    }
}
