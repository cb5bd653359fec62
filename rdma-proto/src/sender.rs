//! The sender's state machine: no I/O, no clock of its own.
//!
//! ```text
//!  new ──HELLO──▶ AwaitGrant ──GRANT──▶ Data ──all WRITEs done + digest──▶ AwaitAck ──ACK──▶ Done
//!                     │ ACK (refused)                                          │
//!                     └────────────────────────────────▶ Done ◀── timeout / protocol error (any state)
//! ```
//!
//! The driver feeds it [`Input`]s and performs the [`Action`]s it queues: send a control
//! message, read chunk `n` of the file into a local slot, WRITE that slot into the receiver's
//! slot `n % slot_count` with `n` as immediate data. Reads and WRITEs are bounded by the local
//! depth and by the receiver's credits, so memory stays bounded whatever the file size.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::auth::{DigestSecret, Role, Secret, Transcript, NONCE_LEN, PROOF_LEN};
use crate::digest::{Digest, DIGEST_CAPS};
use crate::outbox::Outbox;
use crate::seal::{Seals, Unsealed};
use crate::status::Status;
use crate::wire::{self, caps, Credit, End, Entry, EntryKind, Fin, Grant, Hello, Message, Proof};
use crate::{Outcome, ProtocolError};

/// What the sender asks for; the receiver may grant less. Made by [`new`](Self::new) (it is
/// `#[non_exhaustive]`: fields may be added), then changed field by field.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "a builder does nothing until it is used"]
pub struct SenderConfig {
    /// Bytes per chunk (one WRITE).
    pub chunk: u32,
    /// Chunks in flight (local slots).
    pub depth: u32,
    /// How long any phase may pass without progress (no grant, no credit, no ACK).
    pub timeout: Duration,
    /// The shared secret, if any: the sender then offers [`caps::AUTH`], proves it knows the
    /// secret when challenged, and sends data only to a receiver that proved it too
    /// ([`crate::auth`]). Give [`Sender::with_nonce`] 16 random bytes with it.
    pub secret: Option<Secret>,
    /// The file's resume key (a hash of its name, size and identity, made by the driver): the
    /// sender then offers [`caps::RESUME`], and sends only what the receiver's GRANT says it
    /// lacks. `None`: every byte is sent.
    pub resume_key: Option<u64>,
    /// Connections (lanes) to stripe the chunks over ([`caps::LANES`]): with more than 1 the
    /// sender offers `LANES`, and a receiver that grants it gets chunk `n` on lane
    /// `n % lanes` ([`Sender::lane_of`]); one that does not gets every chunk on lane 0.
    /// At most [`wire::MAX_LANES`].
    pub lanes: u16,
    /// Whether the sender offers [`caps::PROBES`]: set it only when the driver's QP allows
    /// remote writes (the receiver then probes it: a QP that refuses them fails on the first
    /// probe). This crate's driver does. `false` by [`new`](Self::new).
    pub probes: bool,
}

impl SenderConfig {
    /// Chunks of `chunk` bytes, `depth` in flight, `timeout` per phase, no secret, no resume.
    pub fn new(chunk: u32, depth: u32, timeout: Duration) -> Self {
        SenderConfig { chunk, depth, timeout, secret: None, resume_key: None, lanes: 1, probes: false }
    }
}

/// An event the driver reports to the machine.
#[derive(Debug)]
pub enum Input<'a> {
    /// A control message arrived (the received bytes, possibly padded).
    Message(&'a [u8]),
    /// Chunk `seq` is in its local slot.
    ChunkRead {
        /// The chunk.
        seq: u64,
    },
    /// The WRITE of chunk `seq` completed (and every earlier one: a send queue completes in order).
    WriteDone {
        /// The chunk.
        seq: u64,
    },
    /// The whole-file digest, once every chunk was read.
    Digest(Vec<u8>),
    /// The proof of the file's first bytes [`Action::ProvePrefix`] asked for: BLAKE3 keyed with
    /// its key over them.
    PrefixProof {
        /// The keyed hash.
        mac: [u8; PROOF_LEN],
    },
    /// The extra lanes the GRANT asked for ([`Sender::lanes`]) are connected: the current
    /// phase's timeout counts from now. Connecting them is bounded by the driver's own connect
    /// timeout, as the first connection is; without this input, a lane whose connection took
    /// long (a lost CM message is resent only after seconds) would eat into the time the first
    /// WRITEs have to complete.
    LanesConnected,
}

/// Work the machine asks the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A control message is ready: take its bytes with [`Sender::transmit`] (one message per `Send`, in
    /// order) and send them on the control plane.
    Send,
    /// Read `len` bytes of the file at `offset` into a local slot for chunk `seq`.
    ReadChunk {
        /// The chunk.
        seq: u64,
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// WRITE chunk `seq` (in its local slot) to `remote_addr`, with immediate data `imm`.
    WriteChunk {
        /// The chunk.
        seq: u64,
        /// Bytes.
        len: u32,
        /// Address of the receiver's slot.
        remote_addr: u64,
        /// The receiver's rkey.
        rkey: u32,
        /// Immediate data: the chunk number's low 32 bits.
        imm: u32,
    },
    /// Every chunk was read: report the whole-file digest ([`Input::Digest`]).
    NeedDigest,
    /// The receiver holds the file's first `from` bytes and asks for proof that this sender
    /// holds them too before it resumes from them ([`caps::RESUME_PROOF`]): hash them with
    /// BLAKE3 keyed with `key` and answer [`Input::PrefixProof`]. A proof that does not match
    /// (another version of the file) only makes the receiver take the file from byte 0.
    ProvePrefix {
        /// Bytes to hash, from the file's start.
        from: u64,
        /// The key ([`crate::auth::prefix_key`]).
        key: crate::digest::DigestKey,
    },
    /// In a batch: offer the next entry ([`Sender::start_entry`]) or end the batch
    /// ([`Sender::end_batch`]).
    NextEntry,
    /// In a batch: the receiver's verdict on an entry.
    EntryDone {
        /// The entry.
        index: u32,
        /// The receiver's verdict.
        status: Status,
        /// Why, for a failure.
        detail: String,
        /// Bytes of it the receiver holds.
        received: u64,
    },
    /// The session is over.
    Finish(Outcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitGrant,
    /// A batch between entries: the driver's next entry (or its end) awaited.
    Idle,
    /// A batch: the ENTRY is out, its READY (or refusal) awaited.
    AwaitReady,
    Data,
    AwaitAck,
    /// A batch: the END is out, the summary ACK awaited.
    AwaitSummary,
    Done,
}

/// The sender of one file.
#[derive(Debug)]
pub struct Sender {
    session: u64,
    size: u64,
    cfg: SenderConfig,
    phase: Phase,
    grant: Option<Grant>,
    chunks: u64,
    /// Next chunk to read; chunks read and not yet written wait in `ready`.
    next_read: u64,
    ready: VecDeque<u64>,
    /// Next chunk whose read is reported.
    next_read_done: u64,
    next_write: u64,
    write_done: u64,
    /// Lanes granted (1 without [`caps::LANES`]).
    lanes: u16,
    /// The digest the GRANT named (XXH3-128 until then).
    granted_digest: Digest,
    /// Per lane, the first of its chunks whose WRITE has not completed.
    lane_done: Vec<u64>,
    consumed: u64,
    digest: Option<Vec<u8>>,
    digest_asked: bool,
    /// The file's name (what the proofs of the secret cover).
    name: String,
    /// This side's nonce (`with_nonce`).
    nonce: [u8; NONCE_LEN],
    /// The receiver's nonce, once challenged.
    challenge: Option<[u8; NONCE_LEN]>,
    /// The nonce of the receiver's prefix CHALLENGE for the current file, until it is answered
    /// ([`caps::RESUME_PROOF`]); set once per file.
    prefix_nonce: Option<[u8; NONCE_LEN]>,
    /// Whether the current file's prefix was challenged already, and for how many bytes.
    prefix_asked: bool,
    prefix_from: u64,
    /// Whether the receiver proved it knows the secret.
    receiver_proven: bool,
    /// The session's digest secret, once the receiver proved the secret ([`crate::auth`]).
    digest_secret: Option<DigestSecret>,
    /// With a secret, from this side's PROOF on: the seals of the messages sent and received
    /// ([`crate::seal`]).
    seals: Option<Seals>,
    /// Bytes the receiver held before (the GRANT's, or in a batch the READY's, `resume_from`).
    resume_from: u64,
    /// Whether this is a batch, and its entries so far.
    batch: Option<u32>,
    /// The entry in progress (a batch).
    entry: Option<Entry>,
    /// When the current phase last made progress: the timeout counts from here.
    progress: Instant,
    /// The hint of the receiver's refusal ([`Ack::retry_after_ms`](wire::Ack::retry_after_ms)).
    retry_after: Option<Duration>,
    actions: VecDeque<Action>,
    outbox: Outbox,
}

impl Sender {
    /// Starts a session offering `name` of `size` bytes: queues the HELLO.
    ///
    /// # Errors
    /// [`ProtocolError::Local`] for a name the receiver would refuse or a zero chunk or depth.
    pub fn new(session: u64, name: &str, size: u64, cfg: SenderConfig, now: Instant) -> Result<Self, ProtocolError> {
        crate::name::check(name).map_err(|r| ProtocolError::Local(format!("file name {name:?}: {r}")))?;
        Self::offering(session, name, size, cfg, now, wire::PROTOCOL_VERSIONS)
    }

    /// As [`new`](Self::new), but offering `versions` and sending `name` unchecked: a test
    /// hook, to see a receiver refuse what this crate's senders never send.
    ///
    /// # Errors
    /// As `new`, except for the name.
    #[doc(hidden)]
    pub fn offering(
        session: u64,
        name: &str,
        size: u64,
        cfg: SenderConfig,
        now: Instant,
        versions: std::ops::RangeInclusive<u16>,
    ) -> Result<Self, ProtocolError> {
        if cfg.chunk == 0 || cfg.depth == 0 {
            return Err(ProtocolError::Local("chunk size and depth must be at least 1".into()));
        }
        if cfg.lanes == 0 || cfg.lanes > wire::MAX_LANES {
            return Err(ProtocolError::Local(format!(
                "{} lanes: 1 ..= {} may be asked for",
                cfg.lanes,
                wire::MAX_LANES
            )));
        }
        let mut s = Sender {
            session,
            size,
            phase: Phase::AwaitGrant,
            grant: None,
            chunks: 0,
            next_read: 0,
            ready: VecDeque::new(),
            next_read_done: 0,
            next_write: 0,
            write_done: 0,
            lanes: 1,
            granted_digest: Digest::Xxh3_128,
            lane_done: vec![0],
            consumed: 0,
            digest: None,
            digest_asked: false,
            name: name.to_owned(),
            nonce: [0; NONCE_LEN],
            challenge: None,
            prefix_nonce: None,
            prefix_asked: false,
            prefix_from: 0,
            receiver_proven: false,
            digest_secret: None,
            seals: None,
            resume_from: 0,
            batch: None,
            entry: None,
            progress: now,
            retry_after: None,
            actions: VecDeque::new(),
            outbox: Outbox::default(),
            cfg,
        };
        let hello = Hello {
            version_min: *versions.start(),
            version_max: *versions.end(),
            resume: s.cfg.resume_key,
            caps: s.offered_caps(),
            size,
            chunk: s.cfg.chunk,
            depth: s.cfg.depth,
            name: name.to_owned(),
            lanes: s.cfg.lanes,
        };
        s.send(&Message::Hello(hello));
        Ok(s)
    }

    /// Starts a batch ([`caps::BATCH`]): many files and directories, `total` bytes together,
    /// over this one session and its one grant. Queues the HELLO (name
    /// [`wire::BATCH_NAME`]); once granted, [`Action::NextEntry`] asks for each entry in turn.
    /// Offers [`caps::RESUME`]: each entry carries its own key (0: none).
    ///
    /// # Errors
    /// [`ProtocolError::Local`] for a zero chunk or depth.
    pub fn batch(session: u64, total: u64, mut cfg: SenderConfig, now: Instant) -> Result<Self, ProtocolError> {
        // Offers resuming (the key itself is per entry).
        cfg.resume_key.get_or_insert(0);
        let mut s = Self::offering(session, wire::BATCH_NAME, total, cfg, now, wire::PROTOCOL_VERSIONS)?;
        s.batch = Some(0);
        Ok(s)
    }

    /// Offers the next entry of a batch (its `index` is set here), once
    /// [`Action::NextEntry`] asked for one: a file's chunks follow its READY; a directory is
    /// answered by its ACK. Ignored at any other time.
    pub fn start_entry(&mut self, mut entry: Entry, now: Instant) {
        let Some(count) = self.batch.filter(|_| self.phase == Phase::Idle) else { return };
        entry.index = count;
        self.batch = Some(count + 1);
        if entry.kind == EntryKind::Directory {
            entry.size = 0;
        }
        self.size = entry.size;
        (self.chunks, self.next_read, self.next_read_done, self.next_write) = (0, 0, 0, 0);
        (self.write_done, self.consumed, self.resume_from) = (0, 0, 0);
        self.lane_done = (0..u64::from(self.lanes)).collect();
        self.ready.clear();
        (self.digest, self.digest_asked) = (None, false);
        (self.prefix_nonce, self.prefix_asked, self.prefix_from) = (None, false, 0);
        self.phase = Phase::AwaitReady;
        self.progress = now;
        self.send(&Message::Entry(entry.clone()));
        self.entry = Some(entry);
    }

    /// Ends a batch once [`Action::NextEntry`] asked for an entry: the END goes out, and the
    /// receiver's summary ACK ends the session. Ignored at any other time.
    pub fn end_batch(&mut self, now: Instant) {
        let Some(entries) = self.batch.filter(|_| self.phase == Phase::Idle) else { return };
        self.phase = Phase::AwaitSummary;
        self.progress = now;
        self.send(&Message::End(End { entries }));
    }

    /// The entry in progress, in a batch.
    pub fn entry(&self) -> Option<&Entry> {
        self.entry.as_ref()
    }

    /// Whether chunks of the file (or the batch's entry) are being sent: from the GRANT (or
    /// READY) to the ACK.
    pub fn sending(&self) -> bool {
        matches!(self.phase, Phase::Data | Phase::AwaitAck)
    }

    /// The send is cancelled: the session ends ([`ProtocolError::Cancelled`]), and a receiver
    /// that granted [`caps::CANCEL`] is told so by a CANCEL (an [`Action::Send`] before the
    /// [`Action::Finish`]), so that it reports the transfer cancelled rather than its peer gone.
    /// Before the GRANT, or to a receiver that does not know CANCEL, nothing is sent. Ignored
    /// once the session is over.
    pub fn cancel(&mut self) {
        if self.phase == Phase::Done {
            return;
        }
        if self.grant.is_some_and(|g| g.caps & caps::CANCEL != 0) {
            self.send(&Message::Cancel(wire::Cancel));
        }
        self.finish(Outcome::Failed(ProtocolError::Cancelled));
    }

    /// Sets this side's nonce for the proof of the secret: 16 random bytes from the driver
    /// (the machine has no randomness of its own). Needed only with a secret.
    pub fn with_nonce(mut self, nonce: [u8; NONCE_LEN]) -> Self {
        self.nonce = nonce;
        self
    }

    /// The session id.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The grant, once received.
    pub fn grant(&self) -> Option<&Grant> {
        self.grant.as_ref()
    }

    /// Chunks in the file (known once granted).
    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    /// Whether the sender waits for room at the receiver: a chunk is read and the receiver's
    /// ring has no slot for it until a CREDIT comes. That message is what moves it on; a
    /// completion of its own WRITEs meanwhile would only free a slot to read ahead into, which
    /// it does when the CREDIT wakes it (the receiver credits a chunk only after taking its
    /// WRITE, so that completion has come by then as a rule). A driver need not wake for those
    /// completions while this holds.
    pub fn waits_for_room(&self) -> bool {
        let Some(g) = self.grant else { return false };
        self.phase == Phase::Data
            && self.ready.front().is_some_and(|&seq| seq >= self.consumed + u64::from(g.slot_count))
    }

    /// Chunks whose WRITE completed (every chunk before this number).
    pub fn chunks_written(&self) -> u64 {
        self.write_done
    }

    /// The digest the receiver granted ([`Digest::granted`]): XXH3-128 until the GRANT. The
    /// driver hashes the file with it and answers [`Action::NeedDigest`] with one of its size.
    pub fn digest(&self) -> Digest {
        self.granted_digest
    }

    /// The key of the current file's digest when the granted digest is keyed
    /// ([`Digest::Blake3Keyed`]: with a secret, once the receiver proved it); `None` otherwise.
    /// In a batch, the key of the entry in progress. The driver hashes what it sends with it.
    pub fn digest_key(&self) -> Option<crate::digest::DigestKey> {
        let secret = self.digest_secret.as_ref().filter(|_| self.granted_digest.is_keyed())?;
        Some(crate::auth::digest_key(secret, self.entry.as_ref().map_or(0, |e| e.index)))
    }

    /// Lanes granted: 1 until the GRANT, and when the receiver does not stripe.
    pub fn lanes(&self) -> u16 {
        self.lanes
    }

    /// The lane chunk `seq` is written on: `seq % lanes`.
    pub fn lane_of(&self, seq: u64) -> u16 {
        (seq % u64::from(self.lanes)) as u16
    }

    /// Whether the session is over.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// The next action, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Writes the control message the oldest [`Action::Send`] announced into `out`, replacing
    /// its contents; `false` when no message waits. Reuse `out`: nothing is allocated per
    /// message once it is large enough.
    pub fn transmit(&mut self, out: &mut Vec<u8>) -> bool {
        self.outbox.take(out)
    }

    /// When [`handle_timeout`](Self::handle_timeout) must be called, unless an input comes first.
    /// `None` once the session is over, or when the timeout is too large to represent (no
    /// deadline, as with `rdma_verbs::Deadline`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.phase != Phase::Done).then(|| crate::timer(self.progress, self.cfg.timeout)).flatten()
    }

    /// Time passed: ends the session if the current phase made no progress in time.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|deadline| now >= deadline) {
            let what = match self.phase {
                Phase::AwaitGrant => "the receiver's grant",
                Phase::Idle => "the driver's next entry",
                Phase::AwaitReady => "the receiver's READY",
                Phase::AwaitSummary => "the receiver's summary",
                Phase::Data => "the receiver's credit or the WRITEs' completions",
                _ => "the receiver's ACK",
            };
            self.finish(Outcome::Failed(ProtocolError::Timeout { waiting_for: what, after: self.cfg.timeout }));
        }
    }

    /// Reports an event.
    pub fn handle(&mut self, input: Input<'_>, now: Instant) {
        if self.phase == Phase::Done {
            return;
        }
        let r = match input {
            Input::Message(bytes) => self.on_message(bytes, now),
            Input::ChunkRead { seq } => self.on_read(seq),
            Input::WriteDone { seq } => self.on_write_done(seq, now),
            Input::Digest(d) if d.len() != self.granted_digest.size() => Err(ProtocolError::Local(format!(
                "an {} digest has {} bytes, not {}",
                self.granted_digest,
                self.granted_digest.size(),
                d.len()
            ))),
            Input::Digest(d) => {
                self.digest = Some(d);
                Ok(())
            }
            Input::LanesConnected => {
                self.progress = now;
                Ok(())
            }
            Input::PrefixProof { mac } => match self.prefix_nonce.take() {
                Some(nonce) => {
                    self.progress = now;
                    self.send(&Message::Proof(Proof { nonce, mac }));
                    Ok(())
                }
                None => Err(ProtocolError::Local("a prefix proof nobody asked for".into())),
            },
        };
        match r {
            Ok(()) => self.advance(),
            Err(e) => self.finish(Outcome::Failed(e)),
        }
    }

    fn on_message(&mut self, bytes: &[u8], now: Instant) -> Result<(), ProtocolError> {
        let (h, m) = match self.seals.as_mut().map(|s| s.incoming.open(bytes)) {
            None => wire::decode(bytes).map_err(ProtocolError::Wire)?,
            Some(Ok(opened)) => opened,
            Some(Err(Unsealed::Wire(e))) => return Err(ProtocolError::Wire(e)),
            Some(Err(Unsealed::Tag)) => return self.on_unsealed(bytes),
        };
        if h.session != self.session {
            return Err(ProtocolError::Peer(format!(
                "message of session {:#x}, ours is {:#x}",
                h.session, self.session
            )));
        }
        match (self.phase, m) {
            (Phase::AwaitGrant | Phase::AwaitReady, Message::Challenge(c)) if c.prefix.is_some() => {
                self.on_prefix_challenge(c, now)?;
            }
            (Phase::AwaitGrant, Message::Challenge(c)) if self.challenge.is_none() => {
                let Some(secret) = &self.cfg.secret else {
                    return Err(ProtocolError::Peer("a CHALLENGE, but this sender offered no secret".into()));
                };
                let t = Transcript {
                    session: self.session,
                    sender_nonce: &self.nonce,
                    receiver_nonce: &c.nonce,
                    size: self.size,
                    name: &self.name,
                };
                let mac = secret.proof(Role::Sender, &t);
                let digest_secret = secret.digest_secret(&t);
                self.challenge = Some(c.nonce);
                self.progress = now;
                self.send(&Message::Proof(Proof { nonce: self.nonce, mac }));
                // Everything after the PROOF is sealed, both ways.
                self.seals = Some(Seals::new(&digest_secret, Role::Sender));
            }
            (Phase::AwaitGrant, Message::Proof(p)) if self.challenge.is_some() && !self.receiver_proven => {
                let (Some(secret), Some(nr)) = (&self.cfg.secret, self.challenge) else {
                    return Err(ProtocolError::Peer("a PROOF before a CHALLENGE".into()));
                };
                let t = Transcript {
                    session: self.session,
                    sender_nonce: &self.nonce,
                    receiver_nonce: &nr,
                    size: self.size,
                    name: &self.name,
                };
                if p.nonce != nr || !secret.verify(&p.mac, Role::Receiver, &t) {
                    return Err(ProtocolError::Peer(
                        "the receiver's proof of the shared secret is wrong: it may not be the receiver meant, nothing was sent".into(),
                    ));
                }
                self.receiver_proven = true;
                self.digest_secret = Some(DigestSecret(secret.digest_secret(&t)));
                self.progress = now;
            }
            (Phase::AwaitGrant, Message::Grant(_)) if self.cfg.secret.is_some() && !self.receiver_proven => {
                return Err(ProtocolError::Peer(
                    "the receiver granted without proving it knows the shared secret: nothing was sent".into(),
                ));
            }
            (Phase::AwaitGrant, Message::Grant(g)) => {
                self.accept_grant(g)?;
                self.progress = now;
            }
            (Phase::AwaitReady, Message::Ready(r)) => {
                let Some(e) = &self.entry else { return Err(ProtocolError::Local("READY without an entry".into())) };
                let g = self.grant.ok_or_else(|| ProtocolError::Local("READY before the grant".into()))?;
                if r.index != e.index || e.kind != EntryKind::File {
                    return Err(ProtocolError::Peer(format!("READY for entry {}, offered {}", r.index, e.index)));
                }
                if r.resume_from != 0 && (e.resume == 0 || g.caps & caps::RESUME == 0) {
                    return Err(ProtocolError::Peer(format!("resuming at {} without resume offered", r.resume_from)));
                }
                if r.resume_from > e.size {
                    return Err(ProtocolError::Peer(format!("resuming at {} of {} bytes", r.resume_from, e.size)));
                }
                self.resume_from = r.resume_from;
                self.chunks = (e.size - r.resume_from).div_ceil(u64::from(g.slot_size));
                self.phase = Phase::Data;
                self.progress = now;
            }
            (Phase::AwaitReady | Phase::Data | Phase::AwaitAck, Message::Ack(a)) if self.batch.is_some() => {
                // The entry's verdict: after its FIN, a refusal of the entry before its READY
                // (or a directory made), or a failure midway, after which the receiver ended
                // the session.
                let index = self.entry.as_ref().map_or(0, |e| e.index);
                let dir = self.entry.as_ref().is_some_and(|e| e.kind == EntryKind::Directory);
                let expected =
                    self.phase == Phase::AwaitAck || (self.phase == Phase::AwaitReady && (dir || self.proved_whole()));
                if a.status == Status::Ok && !expected {
                    return Err(ProtocolError::Peer("ACK ok before FIN".into()));
                }
                // Midway through a file, or a violation (never an entry's own verdict): the
                // receiver has ended the session.
                // After the FIN, an entry's own verdict (its digest, its commit) comes with
                // every byte stored; fewer is a store that failed, which ended the session.
                let size = self.entry.as_ref().map_or(0, |e| e.size);
                let short = self.phase == Phase::AwaitAck && a.received < size;
                let midway = self.phase == Phase::Data || a.status == Status::ProtocolMismatch || short;
                self.actions.push_back(Action::EntryDone {
                    index,
                    status: a.status,
                    detail: a.detail.clone(),
                    received: a.received,
                });
                self.entry = None;
                self.progress = now;
                if midway {
                    self.finish(Outcome::Acked { status: a.status, detail: a.detail });
                } else {
                    self.phase = Phase::Idle;
                    self.actions.push_back(Action::NextEntry);
                }
            }
            (Phase::Data | Phase::AwaitAck, Message::Credit(Credit { consumed })) => {
                if consumed > self.next_write {
                    return Err(ProtocolError::Peer(format!(
                        "credit for {consumed} chunks, only {} written",
                        self.next_write
                    )));
                }
                if consumed > self.consumed {
                    self.consumed = consumed;
                    self.progress = now;
                }
            }
            (_, Message::Ack(a)) => {
                // A refusal (in any phase), the verdict after FIN, or a batch's summary.
                let stored = self.phase == Phase::AwaitGrant && self.proved_whole();
                if a.status == Status::Ok && !matches!(self.phase, Phase::AwaitAck | Phase::AwaitSummary) && !stored {
                    return Err(ProtocolError::Peer("ACK ok before FIN".into()));
                }
                self.refused(&a);
                self.finish(Outcome::Acked { status: a.status, detail: a.detail });
            }
            (phase, m) => {
                return Err(ProtocolError::Peer(format!("unexpected {:?} while {phase:?}", m.kind())));
            }
        }
        Ok(())
    }

    /// Whether this sender proved the whole current file to the receiver (it holds it already,
    /// [`receiver::Input::Present`](crate::receiver::Input::Present)): its `Ok` then comes
    /// without a GRANT or READY, nothing sent.
    pub fn proved_whole(&self) -> bool {
        let size = self.entry.as_ref().map_or(self.size, |e| e.size);
        self.prefix_asked && self.prefix_nonce.is_none() && self.prefix_from == size
    }

    /// The receiver holds the file's first bytes and asks this sender to prove it holds them
    /// too: only once per file, only when this sender offered to resume it, never past its end.
    fn on_prefix_challenge(&mut self, c: wire::Challenge, now: Instant) -> Result<(), ProtocolError> {
        let Some(claim) = c.prefix else { return Err(ProtocolError::Local("a CHALLENGE without a prefix".into())) };
        let (index, size, key) = match &self.entry {
            Some(e) => (e.index, e.size, e.resume),
            None => (0, self.size, self.cfg.resume_key.unwrap_or(0)),
        };
        if self.cfg.secret.is_some() && !self.receiver_proven {
            return Err(ProtocolError::Peer("a prefix CHALLENGE before the receiver proved the shared secret".into()));
        }
        if self.prefix_asked || key == 0 || claim.index != index || claim.from == 0 || claim.from > size {
            return Err(ProtocolError::Peer(format!(
                "a prefix CHALLENGE for {} bytes of entry {}, offered entry {index} of {size} bytes{}",
                claim.from,
                claim.index,
                if key == 0 { " without resume" } else { "" }
            )));
        }
        self.prefix_asked = true;
        self.prefix_from = claim.from;
        self.prefix_nonce = Some(c.nonce);
        self.progress = now;
        let key = crate::auth::prefix_key(&c.nonce, self.session, index);
        self.actions.push_back(Action::ProvePrefix { from: claim.from, key });
        Ok(())
    }

    fn accept_grant(&mut self, g: Grant) -> Result<(), ProtocolError> {
        let bad = |r: String| Err(ProtocolError::Peer(format!("bad grant: {r}")));
        if !wire::PROTOCOL_VERSIONS.contains(&g.version) {
            return bad(format!("version {} not offered", g.version));
        }
        if g.caps & !self.offered_caps() != 0 {
            return bad(format!("capabilities {:#x} not offered", g.caps));
        }
        let Some(digest) = Digest::granted(g.caps) else {
            return bad(format!("capabilities {:#x} name no single digest", g.caps));
        };
        // With a secret, the keyed digest or nothing: an unkeyed one would let the data be
        // changed on the path (and a receiver that proved the secret grants only the keyed).
        if digest.is_keyed() != self.cfg.secret.is_some() {
            return bad(format!("digest {digest} with{} a shared secret", if digest.is_keyed() { "out" } else { "" }));
        }
        // With a secret, sealed messages or nothing (what was received so far was sealed).
        if (g.caps & caps::SEALED != 0) != self.cfg.secret.is_some() {
            return bad(format!(
                "sealed messages {}granted with{} a shared secret",
                if g.caps & caps::SEALED != 0 { "" } else { "not " },
                if self.cfg.secret.is_some() { "" } else { "out" }
            ));
        }
        if g.slot_size == 0 || g.slot_size > self.cfg.chunk || g.slot_count == 0 {
            return bad(format!("{} slots of {} bytes", g.slot_count, g.slot_size));
        }
        let ring = u64::from(g.slot_size) * u64::from(g.slot_count);
        if g.addr.checked_add(ring).is_none() {
            return bad("the ring wraps the address space".into());
        }
        if g.resume_from != 0 && (g.caps & caps::RESUME == 0 || self.cfg.resume_key.is_none()) {
            return bad(format!("resuming at {} without resume offered", g.resume_from));
        }
        if g.resume_from > self.size {
            return bad(format!("resuming at {} of a {}-byte file", g.resume_from, self.size));
        }
        self.lanes = match (g.caps & caps::LANES != 0, g.lanes) {
            (false, None) => 1,
            (true, Some(l)) if (2..=self.cfg.lanes).contains(&l.count) => l.count,
            (_, l) => return bad(format!("{:?} lanes; {} asked for", l.map(|l| l.count), self.cfg.lanes)),
        };
        self.lane_done = (0..u64::from(self.lanes)).collect();
        self.granted_digest = digest;
        if self.batch.is_some() {
            if g.caps & caps::BATCH == 0 || g.resume_from != 0 {
                return Err(ProtocolError::Peer("the receiver does not take batches of files".into()));
            }
            self.grant = Some(g);
            self.phase = Phase::Idle;
            self.actions.push_back(Action::NextEntry);
            return Ok(());
        }
        self.chunks = (self.size - g.resume_from).div_ceil(u64::from(g.slot_size));
        self.resume_from = g.resume_from;
        self.grant = Some(g);
        self.phase = Phase::Data;
        Ok(())
    }

    fn on_read(&mut self, seq: u64) -> Result<(), ProtocolError> {
        if seq != self.next_read_done || seq >= self.next_read {
            return Err(ProtocolError::Local(format!("chunk {seq} read out of order")));
        }
        self.next_read_done += 1;
        self.ready.push_back(seq);
        Ok(())
    }

    /// The WRITE of `seq` completed, and every earlier one of its lane (a lane's queue
    /// completes in order; lanes do not complete in order with each other).
    fn on_write_done(&mut self, seq: u64, now: Instant) -> Result<(), ProtocolError> {
        let lane = self.lane_of(seq) as usize;
        if seq < self.lane_done[lane] || seq >= self.next_write {
            return Err(ProtocolError::Local(format!("completion of chunk {seq}, not in flight")));
        }
        self.lane_done[lane] = seq + u64::from(self.lanes);
        // Every chunk before the first one not completed, on any lane.
        self.write_done = self.lane_done.iter().copied().min().unwrap_or(0).min(self.chunks);
        self.progress = now;
        Ok(())
    }

    /// Queues every read, WRITE and the FIN that the windows allow.
    fn advance(&mut self) {
        let Some(g) = self.grant else { return };
        if self.phase != Phase::Data {
            return;
        }
        let slot = u64::from(g.slot_size);
        // WRITE what was read, while the receiver has room: chunk n needs n < consumed + count.
        while let Some(&seq) = self.ready.front() {
            if seq >= self.consumed + u64::from(g.slot_count) {
                break;
            }
            self.ready.pop_front();
            let len = self.chunk_len(seq);
            let remote_addr = g.addr + (seq % u64::from(g.slot_count)) * slot;
            self.actions.push_back(Action::WriteChunk { seq, len, remote_addr, rkey: g.rkey, imm: seq as u32 });
            self.next_write = seq + 1;
        }
        // Read ahead while local slots are free: reads, ready chunks and WRITEs in flight
        // together use at most `depth` slots.
        while self.next_read < self.chunks && self.next_read - self.write_done < u64::from(self.cfg.depth) {
            let seq = self.next_read;
            let offset = self.resume_from + seq * slot;
            self.actions.push_back(Action::ReadChunk { seq, offset, len: self.chunk_len(seq) });
            self.next_read += 1;
        }
        if self.next_read_done == self.chunks && !self.digest_asked {
            self.digest_asked = true;
            self.actions.push_back(Action::NeedDigest);
        }
        if self.write_done == self.chunks {
            if let Some(digest) = self.digest.take() {
                let fin = Fin { chunks: self.chunks, size: self.size, digest };
                // The phase first: a FIN that does not encode ends the session in `send`.
                self.phase = Phase::AwaitAck;
                self.send(&Message::Fin(fin));
            }
        }
    }

    fn chunk_len(&self, seq: u64) -> u32 {
        let slot = u64::from(self.grant.map_or(self.cfg.chunk, |g| g.slot_size));
        (self.size - self.resumed_from() - seq * slot).min(slot) as u32
    }

    /// The capabilities this sender's HELLO offered.
    fn offered_caps(&self) -> u32 {
        let auth = if self.cfg.secret.is_some() { caps::AUTH | caps::DIGEST_BLAKE3 | caps::SEALED } else { 0 };
        let resume = if self.cfg.resume_key.is_some() { caps::RESUME | caps::RESUME_PROOF } else { 0 };
        let batch = if self.name == wire::BATCH_NAME { caps::BATCH } else { 0 };
        let lanes = if self.cfg.lanes > 1 { caps::LANES } else { 0 };
        let probes = if self.cfg.probes { caps::PROBES } else { 0 };
        DIGEST_CAPS | auth | resume | batch | lanes | caps::CANCEL | probes
    }

    /// How long the receiver asked this sender to wait before it asks again, when it refused
    /// the session as [`Status::Busy`] with a hint ([`wire::Ack::retry_after_ms`]); `None`
    /// otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Keeps a refusal's hint ([`retry_after`](Self::retry_after)).
    fn refused(&mut self, a: &wire::Ack) {
        if a.status == Status::Busy && a.retry_after_ms > 0 {
            self.retry_after = Some(Duration::from_millis(u64::from(a.retry_after_ms)));
        }
    }

    /// Bytes the receiver held before this session (its GRANT's `resume_from`): the file's
    /// chunks start there, and the driver's digest must cover the bytes before it too.
    pub fn resumed_from(&self) -> u64 {
        self.resume_from
    }

    /// A message whose seal is wrong, after this side's PROOF. A refusal is taken as what it
    /// says: a receiver that refused the HELLO or the proof could not seal its ACK, and a
    /// forged refusal can only make this send fail. Anything else ends the session.
    fn on_unsealed(&mut self, bytes: &[u8]) -> Result<(), ProtocolError> {
        match wire::decode(bytes) {
            Ok((h, Message::Ack(a))) if h.session == self.session && a.status != Status::Ok => {
                self.refused(&a);
                self.finish(Outcome::Acked { status: a.status, detail: a.detail });
                Ok(())
            }
            _ => Err(ProtocolError::Unsealed),
        }
    }

    fn send(&mut self, m: &Message) {
        match self.outbox.push(self.session, m, self.seals.as_mut().map(|s| &mut s.outgoing)) {
            Ok(()) => self.actions.push_back(Action::Send),
            Err(e) => self.finish(Outcome::Failed(ProtocolError::Wire(e))),
        }
    }

    fn finish(&mut self, o: Outcome) {
        self.phase = Phase::Done;
        self.actions.push_back(Action::Finish(o));
    }
}
