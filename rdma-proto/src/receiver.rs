//! The receiver's state machine: no I/O, no clock of its own.
//!
//! ```text
//!  new ──HELLO──▶ Opening ──Ready──▶ Data ──FIN + every chunk stored──▶ Finalizing ──Finalized──▶ Done
//!    │ bad HELLO     │ open failed      │ bad WRITE / timeout                     (ACK sent)
//!    └───────────────┴──────────────────┴──────────▶ Done (ACK with the status, when the peer can hear it)
//! ```
//!
//! With a secret ([`ReceiverConfig::secret`]), a HELLO leads to `Authenticating` first: a
//! CHALLENGE goes out, and only a PROOF that verifies leads to `Opening` ([`crate::auth`]).
//!
//! Finalizing has one way out: the driver's answer to [`Action::Finalize`]. Inputs of the peer
//! and timeouts are ignored there, so that the verdict sent is always what happened on disk.
//!
//! The driver feeds it [`Input`]s: control messages, WRITE-with-immediate arrivals, and the
//! results of the work it asked for (open the file and register the ring; store chunk `n`;
//! check the digest, sync and rename). Every arrival is checked against what the sender may
//! do: the immediate must be the next chunk number, the length that chunk's, and the chunk
//! within the credit the receiver gave. Anything else ends the session with
//! [`Status::ProtocolMismatch`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::auth::{DigestSecret, Role, Secret, Transcript, NONCE_LEN, PROOF_LEN};
use crate::digest::{Digest, DigestKey};
use crate::outbox::Outbox;
use crate::seal::{Seals, Unsealed};
use crate::status::Status;
use crate::wire::{
    self, caps, Ack, Challenge, Credit, End, Entry, EntryKind, Grant, Message, PrefixClaim, Proof, Ready,
};
use crate::{Outcome, ProtocolError};

/// What a receiver accepts. Made by [`Default`] (1 TiB files, 4 MiB chunks, 64 MiB and 64
/// slots per transfer, 30 s per phase; it is `#[non_exhaustive]`: fields may be added), then
/// changed field by field.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "a builder does nothing until it is used"]
pub struct ReceiverConfig {
    /// Largest file accepted.
    pub max_size: u64,
    /// Most bytes one session may bring: the file, or all the files of a batch
    /// ([`caps::BATCH`]) together.
    pub max_session_bytes: u64,
    /// Largest chunk (slot) size granted.
    pub max_chunk: u32,
    /// Memory for the slot ring of one transfer: slots granted = min(depth wanted,
    /// budget / chunk, `max_slots`).
    pub memory_budget: u64,
    /// Most slots granted (each chunk in flight also takes one posted receive).
    pub max_slots: u32,
    /// How long any phase after the peer's admission may pass without progress.
    pub timeout: Duration,
    /// How long a connection may wait before its HELLO, and then (with a secret) before its
    /// proof (an idle connection holds a place among
    /// the receiver's connections until then).
    pub hello_timeout: Duration,
    /// The slowest pace a sender may keep once admitted, in bytes per second (16 KiB/s by
    /// default; 0 sets no floor). It is judged once per [`timeout`](Self::timeout) of the
    /// peer's time (from the GRANT; the driver's own steps, opening and syncing, do not
    /// count): a session that brought less ends with [`ProtocolError::TooSlow`] and an ACK
    /// [`Status::Busy`] saying why. Each ENTRY of a batch counts [`OFFER_CREDIT`] bytes. Without
    /// it, a sender that trickles a byte per `timeout` holds its place for ever.
    pub min_rate: u64,
    /// The shared secret, if any: a sender must then prove it knows it before anything is
    /// opened for it, and is shown the receiver's proof ([`crate::auth`]). Give
    /// [`Receiver::with_nonce`] 16 random bytes with it.
    pub secret: Option<Secret>,
    /// Offer to resume: a HELLO's resume key is handed to the driver (`resume_key`), which may
    /// answer [`Input::Resumed`] with the bytes it already holds of that file. Needs a place to
    /// keep partial files, so off by default.
    pub resume: bool,
    /// Take batches ([`caps::BATCH`]): with it off, a batch's HELLO is refused as a receiver
    /// without batches refuses it (its name, `.`, is `BadName`).
    pub batch: bool,
    /// Most entries one batch may offer (each costs the driver a line of its report): past
    /// it the session ends as for a message out of place.
    pub max_entries: u32,
    /// Most lanes (connections) one session's chunks may be striped over ([`caps::LANES`]):
    /// a sender asking for more gets this many, and 1 (or 0) grants no striping, as a
    /// receiver without `LANES` does. At most [`wire::MAX_LANES`]. Give
    /// [`Receiver::with_lane_token`] 16 random bytes with it.
    pub max_lanes: u16,
    /// The digest granted when the sender offers it ([`Digest::choose`]): otherwise the
    /// other one it offers. XXH3-128 by default, the one every sender knows; the driver
    /// picks the faster one on its CPU unless told (`ReceiveOptions::digest`). Not used with a
    /// [`secret`](Self::secret): that session's digest is [`Digest::Blake3Keyed`].
    pub digest: Digest,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_size: 1 << 40,
            max_session_bytes: 1 << 40,
            max_chunk: 4 << 20,
            memory_budget: 64 << 20,
            max_slots: 64,
            timeout: Duration::from_secs(30),
            hello_timeout: Duration::from_secs(30),
            min_rate: DEFAULT_MIN_RATE,
            secret: None,
            resume: false,
            batch: true,
            max_entries: 1_000_000,
            max_lanes: 4,
            digest: Digest::Xxh3_128,
        }
    }
}

/// [`ReceiverConfig::min_rate`]'s default: 16 KiB/s. Below one chunk of the sender's default
/// 512 KiB per 30 s window, and a third of the slowest window an honest sender kept among
/// sixteen at once on two emulated CPUs under Linux 6.1's retransmission storm (1.5 MB in 30 s,
/// [`docs/results/`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/results)); above what a peer that trickles to hold places wants to spend on each.
pub const DEFAULT_MIN_RATE: u64 = 16 << 10;

/// The hint every [`Status::Busy`] ACK carries ([`wire::Ack::retry_after_ms`]) unless the
/// driver names another ([`Receiver::give_way`]): about how long a small transfer takes, so
/// that a sender turned away asks again soon, but not at once.
pub const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What each ENTRY of a batch counts for towards [`ReceiverConfig::min_rate`], in bytes,
/// whatever its verdict, beside the bytes its file brings: at the default floor a batch keeps
/// its place with 16 entries a second. An honest sender offers each entry as soon as the last
/// one's verdict arrives (the receiver's own time opening it is not the sender's): a batch of
/// 2,000 entries all refused (files that exist) ran at 120 a second on the emulated CPUs of the
/// test VM ([`docs/results/`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/results)), and real CPUs and NICs are faster. A peer trickling entries to
/// hold a place must send that many. A larger credit per entry (16 KiB, say) would let a peer
/// that sends one entry a second (a directory that exists already, an empty file) hold its place
/// for the whole of [`ReceiverConfig::max_entries`].
pub const OFFER_CREDIT: u64 = 1 << 10;

/// An event the driver reports to the machine.
#[derive(Debug)]
pub enum Input<'a> {
    /// A control message arrived.
    Message(&'a [u8]),
    /// A WRITE with immediate `imm` of `len` bytes landed on lane 0 (the session's own
    /// connection; the only lane without [`caps::LANES`]).
    WriteArrived {
        /// The immediate data.
        imm: u32,
        /// The WRITE's length.
        len: u32,
    },
    /// A WRITE with immediate `imm` of `len` bytes landed on `lane` ([`caps::LANES`]; lane 0
    /// is [`Input::WriteArrived`]).
    LaneWrite {
        /// The lane (connection) it came on.
        lane: u16,
        /// The immediate data.
        imm: u32,
        /// The WRITE's length.
        len: u32,
    },
    /// A control message arrived on an extra lane, where only WRITEs may come: the peer's
    /// violation.
    LaneMessage {
        /// The lane.
        lane: u16,
    },
    /// The file is open and the ring registered (answers [`Action::Open`]); in a batch, the
    /// ring is registered (answers [`Action::Reserve`]) or the entry is open, or the directory
    /// made (answers [`Action::OpenEntry`], with the same ring).
    Ready {
        /// Address of slot 0.
        addr: u64,
        /// The ring's rkey.
        rkey: u32,
    },
    /// Before [`Input::Ready`]: the file's first `from` bytes are already held (a partial of
    /// the version the HELLO's resume key names); only the rest is asked for, once the sender
    /// proved it holds those bytes too ([`caps::RESUME_PROOF`]).
    Resumed {
        /// Bytes held, at most the file's size.
        from: u64,
        /// BLAKE3 keyed with [`Receiver::prefix_key`] over those `from` bytes: what the
        /// sender's proof must be (ignored when `from` is 0).
        proof: [u8; PROOF_LEN],
    },
    /// The answer to [`Action::Open`] or a file's [`Action::OpenEntry`] when the file is in
    /// place already (overwriting off) with the size offered, and the session may resume
    /// ([`Receiver::resume_key`]): `proof` is BLAKE3 keyed with [`Receiver::prefix_key`] over
    /// all of it. The sender is asked to prove the whole file ([`caps::RESUME_PROOF`]); the
    /// same bytes make the verdict `Ok` ("already stored"), counted as done, with nothing
    /// sent or written; other bytes make it [`Status::Exists`], as without this answer.
    Present {
        /// The keyed hash of the file in place.
        proof: [u8; PROOF_LEN],
    },
    /// [`Action::Open`], [`Action::Reserve`] or [`Action::OpenEntry`] failed (a status of `Ok`
    /// here is taken as [`Status::Internal`]). A batch goes on after an entry that failed to open.
    OpenFailed(Status, String),
    /// Chunk `seq` left its slot (stored, or checked in memory-only mode).
    ChunkStored {
        /// The chunk.
        seq: u64,
    },
    /// Storing a chunk failed (a status of `Ok` here is taken as [`Status::Internal`]).
    StoreFailed(Status, String),
    /// [`Action::Finalize`] is done: `Ok` (renamed into place) or why not.
    Finalized(Status, String),
}

/// Work the machine asks the driver to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Open a temporary file for `name` (`size` bytes) and register a ring of `slot_count`
    /// slots of `slot_size` bytes; answer with [`Input::Ready`] or [`Input::OpenFailed`].
    Open {
        /// The (checked) file name.
        name: String,
        /// Its size.
        size: u64,
        /// Bytes per slot.
        slot_size: u32,
        /// Slots.
        slot_count: u32,
    },
    /// A batch ([`caps::BATCH`]) was accepted: register a ring of `slot_count` slots of
    /// `slot_size` bytes (no file yet); answer with [`Input::Ready`] or [`Input::OpenFailed`].
    Reserve {
        /// Bytes per slot.
        slot_size: u32,
        /// Slots.
        slot_count: u32,
    },
    /// In a batch: open a temporary for the entry's file at its (checked) relative path,
    /// making its parent directories, or make the directory it names; with the entry's
    /// `flags`, apply its mode and modification time at the commit (a directory's at once).
    /// Answer with [`Input::Ready`] (the ring's address again), preceded by [`Input::Resumed`]
    /// when [`Receiver::resume_key`] is set, or [`Input::OpenFailed`].
    OpenEntry(Entry),
    /// In a batch: the entry's verdict was sent (its ACK); the batch goes on.
    EntryDone {
        /// The entry.
        index: u32,
        /// Its path.
        path: String,
        /// The verdict.
        status: Status,
        /// Why, for a failure.
        detail: String,
        /// Bytes of it held.
        bytes: u64,
    },
    /// A control message is ready: take its bytes with [`Receiver::transmit`] (one message per `Send`, in
    /// order) and send them on the control plane.
    Send,
    /// Take chunk `seq` (`len` bytes in slot `slot`) out of the ring: hash it and write it at
    /// `offset`; answer with [`Input::ChunkStored`] or [`Input::StoreFailed`].
    StoreChunk {
        /// The chunk.
        seq: u64,
        /// Its slot.
        slot: u32,
        /// File offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Compare the digest with the data's, sync and rename into place; answer with
    /// [`Input::Finalized`].
    Finalize {
        /// The sender's digest.
        digest: Vec<u8>,
    },
    /// The sender did not prove it holds the bytes the partial holds ([`caps::RESUME_PROOF`]):
    /// leave that partial as it is (to its owner), and open a new temporary for the same file,
    /// to be written from byte 0 (the digest starts over too); answer with [`Input::Ready`]
    /// (the ring's address again) or [`Input::OpenFailed`], and no [`Input::Resumed`].
    StartOver,
    /// Remove the temporary file (the transfer failed).
    Discard,
    /// The session is over (an ACK, if any, was queued before this).
    Finish(Outcome),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitHello,
    /// A secret is required: the CHALLENGE is out, the sender's PROOF awaited.
    Authenticating,
    /// A batch between entries: the next ENTRY or the END awaited.
    AwaitEntry,
    Opening,
    /// Resuming: the prefix CHALLENGE is out, the sender's proof of the bytes held awaited.
    Proving,
    Data,
    Finalizing,
    Done,
}

/// The receiver of one file.
#[derive(Debug)]
pub struct Receiver {
    cfg: ReceiverConfig,
    session: u64,
    phase: Phase,
    /// The protocol version granted: the highest both sides speak.
    version: u16,
    size: u64,
    slot_size: u32,
    slot_count: u32,
    chunks: u64,
    arrived: u64,
    stored: u64,
    credited: u64,
    fin: Option<Vec<u8>>,
    opened: bool,
    /// Whether a HELLO arrived.
    greeted: bool,
    /// Whether an ACK was queued.
    acked: bool,
    /// This side's nonce (`with_nonce`).
    nonce: [u8; NONCE_LEN],
    /// Whether the sender's proof of the secret was wrong.
    auth_failed: bool,
    /// Whether the sender proved the secret.
    proved: bool,
    /// The session's digest secret, once the sender proved the secret ([`crate::auth`]).
    digest_secret: Option<DigestSecret>,
    /// With a secret, once the sender proved it: the seals of the messages sent and received
    /// ([`crate::seal`]).
    seals: Option<Seals>,
    /// The file offered, kept while the sender proves the secret.
    offered: Option<(String, u64)>,
    /// A single file's name, once opened.
    offered_name: Option<String>,
    /// The HELLO's resume key, when both sides resume.
    resume_key: Option<u64>,
    /// Bytes of the file held before this session (chunk `n` starts at `base + n * slot`).
    base: u64,
    /// With `base` above 0: the proof of those bytes the sender must show ([`Input::Resumed`]).
    expected: Option<[u8; PROOF_LEN]>,
    /// The ring ([`Input::Ready`]), kept for the GRANT while the sender proves its prefix.
    ring: Option<(u64, u32)>,
    /// Prefix proofs that were wrong ([`caps::RESUME_PROOF`]).
    prefix_refused: u32,
    /// The file is in place already ([`Input::Present`]): the proof asked for is of all of it.
    present: bool,
    /// [`caps::CANCEL`] when the HELLO offered it: granted back.
    cancel: u32,
    /// The sender sent CANCEL: the session ends once the chunks that arrived are stored.
    cancelled: bool,
    /// The HELLO offered [`caps::PROBES`].
    probes: bool,
    /// Lanes granted ([`caps::LANES`]; 1 without): chunk `n` comes on lane `n % lanes`.
    lanes: u16,
    /// The digest granted (chosen from the HELLO's offer).
    digest: Digest,
    /// Per lane, the next chunk it must bring (lane `l` brings `l`, `l + lanes`, ...).
    lane_next: Vec<u64>,
    /// The token extra lanes present (`with_lane_token`).
    lane_token: [u8; wire::LANE_TOKEN_LEN],
    /// The batch, when the HELLO asked for one.
    batch: Option<Batch>,
    /// When the current phase last made progress: the timeout counts from here.
    progress: Instant,
    /// The sender's pace since its GRANT ([`ReceiverConfig::min_rate`]).
    pace: Option<Pace>,
    /// The hint a `Busy` ACK carries ([`BUSY_RETRY_AFTER`], or [`Receiver::give_way`]'s).
    busy_hint: Duration,
    actions: VecDeque<Action>,
    outbox: Outbox,
}

/// One window of the sender's pace ([`ReceiverConfig::min_rate`]): what it brought, and how
/// much of the window was the peer's to use.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// When the window began: the GRANT, then each judgement.
    start: Instant,
    /// What it brought (`credit`).
    bytes: u64,
    /// Time in it spent on the driver's steps (opening, syncing), not the peer's.
    driver: Duration,
    /// The last input: the time since belongs to the phase then current.
    seen: Instant,
}

impl Pace {
    fn new(now: Instant) -> Pace {
        Pace { start: now, bytes: 0, driver: Duration::ZERO, seen: now }
    }

    /// The peer's time in this window, as of `now`.
    fn peer_time(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start).saturating_sub(self.driver)
    }
}

/// A batch in progress ([`caps::BATCH`]).
#[derive(Debug, Default)]
struct Batch {
    /// The total the HELLO announced.
    declared: u64,
    /// Whether both sides resume (per entry, by its key).
    resume: bool,
    /// ENTRY messages so far.
    entries: u32,
    /// Bytes of the files announced so far.
    announced: u64,
    /// Bytes held by the entries that ended.
    held: u64,
    /// Entries stored, and not.
    ok: u32,
    failed: u32,
    /// The first failure's status and detail.
    first_failure: Option<(Status, String)>,
    /// The entry in progress.
    current: Option<(u32, String, EntryKind)>,
}

impl Receiver {
    /// A receiver waiting for a HELLO.
    pub fn new(cfg: ReceiverConfig, now: Instant) -> Self {
        Receiver {
            progress: now,
            pace: None,
            busy_hint: BUSY_RETRY_AFTER,
            cfg,
            session: 0,
            phase: Phase::AwaitHello,
            version: 0,
            size: 0,
            slot_size: 0,
            slot_count: 0,
            chunks: 0,
            arrived: 0,
            stored: 0,
            credited: 0,
            fin: None,
            opened: false,
            greeted: false,
            acked: false,
            nonce: [0; NONCE_LEN],
            auth_failed: false,
            proved: false,
            digest_secret: None,
            seals: None,
            offered: None,
            offered_name: None,
            resume_key: None,
            base: 0,
            expected: None,
            ring: None,
            prefix_refused: 0,
            present: false,
            cancel: 0,
            cancelled: false,
            probes: false,
            lanes: 1,
            digest: Digest::Xxh3_128,
            lane_next: vec![0],
            lane_token: [0; wire::LANE_TOKEN_LEN],
            batch: None,
            actions: VecDeque::new(),
            outbox: Outbox::default(),
        }
    }

    /// The session id (0 until the HELLO).
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Whether a HELLO arrived (valid or not): the peer asked for a transfer.
    pub fn hello_received(&self) -> bool {
        self.greeted
    }

    /// Whether the peer is one this receiver serves: its HELLO arrived and, with a secret, it
    /// proved the secret. What a driver counts as a transfer asked for: a peer that cannot
    /// prove the secret must not use up a count meant for those that can.
    pub fn authorized(&self) -> bool {
        self.greeted && (self.cfg.secret.is_none() || self.proved)
    }

    /// Sets this side's nonce for the proof of the secret: 16 random bytes from the driver
    /// (the machine has no randomness of its own). Needed only with a secret.
    pub fn with_nonce(mut self, nonce: [u8; NONCE_LEN]) -> Self {
        self.nonce = nonce;
        self
    }

    /// Sets the token the GRANT hands a striping sender ([`caps::LANES`]): 16 random bytes
    /// from the driver, which then takes an extra lane's connection only when it presents
    /// them. Needed only with [`ReceiverConfig::max_lanes`] above 1.
    pub fn with_lane_token(mut self, token: [u8; wire::LANE_TOKEN_LEN]) -> Self {
        self.lane_token = token;
        self
    }

    /// Lanes granted (1 without striping, and until the HELLO was accepted).
    pub fn lanes(&self) -> u16 {
        self.lanes
    }

    /// The digest the session uses: chosen from the HELLO's offer (XXH3-128 until then). The
    /// driver hashes what it stores with it; the FIN must carry one of its size.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The key of the current file's digest when the session's digest is keyed
    /// ([`Digest::Blake3Keyed`]: with a secret, once the sender proved it); `None` otherwise.
    /// In a batch, the key of the entry in progress. The driver hashes what it stores with it.
    pub fn digest_key(&self) -> Option<DigestKey> {
        let secret = self.digest_secret.as_ref().filter(|_| self.digest.is_keyed())?;
        let index = self.batch.as_ref().and_then(|b| b.current.as_ref()).map_or(0, |c| c.0);
        Some(crate::auth::digest_key(secret, index))
    }

    /// The token extra lanes must present ([`with_lane_token`](Self::with_lane_token)).
    pub fn lane_token(&self) -> [u8; wire::LANE_TOKEN_LEN] {
        self.lane_token
    }

    /// Whether the session ended on a wrong proof of the secret (what a driver rate-limits).
    pub fn auth_failed(&self) -> bool {
        self.auth_failed
    }

    /// The driver's seat for this session is wanted by a newer sender, this one being too slow
    /// for its share ([`ProtocolError::Displaced`]): once the session is admitted and before
    /// its commit, it ends with an ACK [`Status::Busy`] whose hint asks the sender to come
    /// back after `retry_after`, and keeps a resumable partial (the driver's choice). Ignored
    /// in other phases (before its HELLO nothing is held; a commit under way decides itself).
    pub fn give_way(&mut self, retry_after: Duration, now: Instant) {
        if !matches!(self.phase, Phase::Opening | Phase::AwaitEntry | Phase::Data) {
            return;
        }
        self.account(now);
        self.busy_hint = retry_after;
        let detail = format!(
            "a newer sender took this one's place, which progressed below its fair share; come back in {} ms",
            retry_after.as_millis()
        );
        self.fail(ProtocolError::Displaced, Some((Status::Busy, detail)));
    }

    /// Whether an ACK was queued (the sender is told the verdict): a driver then gives the
    /// sender time to read it before the connection goes.
    pub fn acked(&self) -> bool {
        self.acked
    }

    /// Bytes of the file held: those from before the session ([`resumed_from`](Self::resumed_from))
    /// and those stored since. In a batch, of the entry in progress (0 between entries and
    /// after the END: an entry's bytes are in its [`Action::EntryDone`]).
    pub fn bytes_stored(&self) -> u64 {
        self.base.saturating_add(self.stored * u64::from(self.slot_size)).min(self.size)
    }

    /// Whether the session is a batch ([`caps::BATCH`]).
    pub fn is_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// The HELLO's resume key, when the session may resume (the sender offered it and
    /// [`ReceiverConfig::resume`] is on): what [`Action::Open`] looks a partial up by.
    pub fn resume_key(&self) -> Option<u64> {
        self.resume_key
    }

    /// Bytes held before this session ([`Input::Resumed`]).
    pub fn resumed_from(&self) -> u64 {
        self.base
    }

    /// The key of the current file's prefix proof ([`crate::auth::prefix_key`], from this
    /// side's nonce, the session and the entry): the driver hashes the bytes a partial holds
    /// with BLAKE3 keyed with it, and reports the result in [`Input::Resumed`].
    pub fn prefix_key(&self) -> DigestKey {
        let index = self.batch.as_ref().and_then(|b| b.current.as_ref()).map_or(0, |c| c.0);
        crate::auth::prefix_key(&self.nonce, self.session, index)
    }

    /// Whether the sender said its send was cancelled (a CANCEL, [`caps::CANCEL`]): the session
    /// ends once the chunks that arrived before it are stored.
    pub fn cancelled(&self) -> bool {
        self.cancelled
    }

    /// Whether the sender's HELLO offered [`caps::PROBES`]: its connection takes this side's
    /// probes (a driver sends none to a sender that did not).
    pub fn takes_probes(&self) -> bool {
        self.probes
    }

    /// How many of this session's senders' proofs of a partial's prefix were wrong (each
    /// such file was then sent from byte 0 into a new temporary).
    pub fn prefix_refused(&self) -> u32 {
        self.prefix_refused
    }

    /// The file's size (0 until the HELLO).
    pub fn size(&self) -> u64 {
        self.size
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
    /// `None` once the session is over, and while [`Action::Finalize`] is the driver's: that
    /// step is bounded by the driver's disk, not by the peer, and its result is the verdict.
    /// Also `None` when the timeout is too large to represent (no deadline, as with
    /// `rdma_verbs::Deadline`).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.phase_deadline(), self.pace_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the current phase times out for want of progress.
    fn phase_deadline(&self) -> Option<Instant> {
        let timeout = self.phase_timeout();
        let running = matches!(
            self.phase,
            Phase::AwaitHello
                | Phase::Authenticating
                | Phase::AwaitEntry
                | Phase::Opening
                | Phase::Proving
                | Phase::Data
        );
        running.then(|| crate::timer(self.progress, timeout)).flatten()
    }

    /// When the sender's pace is next judged: at the end of a window of `timeout` of the
    /// peer's time, while it is the peer's turn (between entries, or sending data).
    fn pace_deadline(&self) -> Option<Instant> {
        let pace = self.pace.as_ref().filter(|_| self.cfg.min_rate > 0)?;
        if !matches!(self.phase, Phase::AwaitEntry | Phase::Data) {
            return None;
        }
        pace.start.checked_add(self.cfg.timeout.checked_add(pace.driver)?)
    }

    /// Counts `bytes` towards the sender's pace ([`ReceiverConfig::min_rate`]): the bytes of
    /// each chunk written, and [`OFFER_CREDIT`] for each ENTRY.
    fn credit(&mut self, bytes: u64) {
        if let Some(pace) = self.pace.as_mut() {
            pace.bytes = pace.bytes.saturating_add(bytes);
        }
    }

    /// Charges the time since the last input to the phase it passed in: the driver's steps
    /// (opening, syncing) are not the peer's time.
    fn account(&mut self, now: Instant) {
        let driver = matches!(self.phase, Phase::Opening | Phase::Finalizing);
        if let Some(pace) = self.pace.as_mut() {
            if driver {
                pace.driver += now.saturating_duration_since(pace.seen);
            }
            pace.seen = pace.seen.max(now);
        }
    }

    /// How long the current phase may go without progress: a peer not yet admitted (before its
    /// HELLO, and while it proves the secret) has `hello_timeout`, the rest `timeout`.
    fn phase_timeout(&self) -> Duration {
        match self.phase {
            Phase::AwaitHello | Phase::Authenticating => self.cfg.hello_timeout,
            _ => self.cfg.timeout,
        }
    }

    /// Time passed: ends the session if the current phase made no progress in time, or if the
    /// sender kept a pace below [`ReceiverConfig::min_rate`]. Ignored once
    /// [`Action::Finalize`] was asked for (see [`poll_timeout`](Self::poll_timeout)).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase == Phase::Done {
            return;
        }
        self.account(now);
        if self.pace_deadline().is_some_and(|at| now >= at) {
            if let Some(pace) = self.pace {
                let over = pace.peer_time(now);
                let floor = u128::from(self.cfg.min_rate) * over.as_millis() / 1000;
                if u128::from(pace.bytes) < floor {
                    let (bytes, min_rate) = (pace.bytes, self.cfg.min_rate);
                    let detail = format!(
                        "{bytes} bytes in {:.0} s, below this receiver's floor of {min_rate} bytes/s",
                        over.as_secs_f64()
                    );
                    self.fail(ProtocolError::TooSlow { bytes, over, min_rate }, Some((Status::Busy, detail)));
                    return;
                }
                self.pace = Some(Pace::new(now));
            }
        }
        if !self.phase_deadline().is_some_and(|deadline| now >= deadline) {
            return;
        }
        let what = match self.phase {
            Phase::AwaitHello => "the sender's HELLO",
            Phase::Authenticating => "the sender's proof of the secret",
            Phase::AwaitEntry => "the sender's next entry or END",
            Phase::Opening => "the file to open",
            Phase::Proving => "the sender's proof of the bytes held",
            Phase::Data => "the sender's chunks or FIN",
            _ => "the file to be synced",
        };
        let after = self.phase_timeout();
        self.fail(ProtocolError::Timeout { waiting_for: what, after }, None);
    }

    /// Reports an event.
    ///
    /// Once [`Action::Finalize`] was asked for, only its answer ([`Input::Finalized`]) counts:
    /// the driver may already have committed the file, so nothing the peer sends after its FIN
    /// (junk, a WRITE, a second FIN) can turn the verdict into a failure. The verdict sent is
    /// always the one that matches the disk.
    pub fn handle(&mut self, input: Input<'_>, now: Instant) {
        if self.phase == Phase::Done {
            return;
        }
        if self.phase == Phase::Finalizing && !matches!(input, Input::Finalized(..)) {
            return;
        }
        self.account(now);
        let r = match input {
            Input::Message(bytes) => self.on_message(bytes, now),
            Input::WriteArrived { imm, len } => self.on_write(0, imm, len, now),
            Input::LaneWrite { lane, imm, len } => self.on_write(lane, imm, len, now),
            Input::LaneMessage { lane } => Err(ProtocolError::Peer(format!("a control message on lane {lane}"))),
            Input::Resumed { from, proof } if self.phase == Phase::Opening && self.resume_key.is_some() => {
                if from > self.size {
                    Err(ProtocolError::Local(format!("resuming at {from} of a {}-byte file", self.size)))
                } else {
                    self.base = from;
                    self.expected = (from > 0).then_some(proof);
                    self.chunks = (self.size - from).div_ceil(u64::from(self.slot_size));
                    self.reset_lanes();
                    Ok(())
                }
            }
            Input::Present { proof } if self.phase == Phase::Opening && self.resume_key.is_some() && !self.is_dir() => {
                // Nothing is opened: the sender proves the whole file, or hears it exists.
                self.present = true;
                (self.base, self.expected) = (self.size, Some(proof));
                self.progress = now;
                let index = self.batch.as_ref().and_then(|b| b.current.as_ref()).map_or(0, |c| c.0);
                self.phase = Phase::Proving;
                let prefix = Some(PrefixClaim { index, from: self.size });
                self.send(&Message::Challenge(Challenge { nonce: self.nonce, prefix }));
                Ok(())
            }
            Input::Ready { addr, rkey } if self.phase == Phase::Opening && self.entry_open() => {
                self.progress = now;
                match self.batch.as_ref().and_then(|b| b.current.as_ref()) {
                    Some((_, _, EntryKind::Directory)) => self.entry_done(Status::Ok, String::new()),
                    Some(&(index, ..)) => {
                        self.opened = true;
                        self.ring = Some((addr, rkey));
                        if !self.challenge_prefix(index) {
                            self.phase = Phase::Data;
                            self.send(&Message::Ready(Ready { index, resume_from: self.base }));
                        }
                    }
                    None => {}
                }
                Ok(())
            }
            Input::Ready { addr, rkey } if self.phase == Phase::Opening => {
                self.opened = !self.is_batch();
                if self.is_batch() {
                    self.phase = Phase::AwaitEntry;
                    self.progress = now;
                    let resume = if self.batch.as_ref().is_some_and(|b| b.resume) { caps::RESUME } else { 0 };
                    let auth = if self.cfg.secret.is_some() { caps::AUTH | caps::SEALED } else { 0 };
                    let g = Grant {
                        version: self.version,
                        caps: self.digest.cap() | caps::BATCH | auth | resume | self.lanes_cap() | self.cancel,
                        addr,
                        rkey,
                        slot_size: self.slot_size,
                        slot_count: self.slot_count,
                        resume_from: 0,
                        lanes: self.granted_lanes(),
                    };
                    self.send(&Message::Grant(g));
                    self.pace = Some(Pace::new(now));
                    return;
                }
                self.progress = now;
                self.ring = Some((addr, rkey));
                if self.challenge_prefix(0) {
                    return;
                }
                self.grant(addr, rkey, now);
                Ok(())
            }
            Input::OpenFailed(status, why) if self.phase == Phase::Opening && self.entry_open() => {
                self.entry_done(failed(status), why);
                Ok(())
            }
            Input::OpenFailed(status, why) if self.phase == Phase::Opening => {
                self.refuse(failed(status), why);
                Ok(())
            }
            Input::ChunkStored { seq } if self.phase >= Phase::Data && seq == self.stored && seq < self.arrived => {
                self.stored += 1;
                self.progress = now;
                Ok(())
            }
            Input::StoreFailed(status, why) if self.phase >= Phase::Data => {
                self.fail(ProtocolError::Local(why.clone()), Some((failed(status), why)));
                Ok(())
            }
            Input::Finalized(status, why) if self.phase == Phase::Finalizing && self.is_batch() => {
                if status != Status::Ok {
                    self.actions.push_back(Action::Discard);
                }
                self.progress = now;
                self.entry_done(status, why);
                Ok(())
            }
            Input::Finalized(status, why) if self.phase == Phase::Finalizing => {
                if status != Status::Ok {
                    self.actions.push_back(Action::Discard);
                }
                self.ack(status, why.clone());
                self.phase = Phase::Done;
                let o = Outcome::Acked { status, detail: why };
                self.actions.push_back(Action::Finish(o));
                Ok(())
            }
            other => Err(ProtocolError::Local(format!("driver input {other:?} out of place"))),
        };
        if let Err(e) = r {
            let status = match e {
                ProtocolError::Local(_) => Status::Internal,
                // No verdict: the connection failed, not the sender ([`ProtocolError::CompletedTwice`]),
                // or a message was changed on the path (a sealed ACK would be a verdict the
                // sender takes as final, so it would never retry and resume).
                ProtocolError::CompletedTwice { .. } | ProtocolError::Unsealed => return self.fail(e, None),
                _ => Status::ProtocolMismatch,
            };
            let detail = e.to_string();
            self.fail(e, Some((status, detail)));
            return;
        }
        if self.cancelled && self.stored >= self.arrived && !matches!(self.phase, Phase::Done | Phase::Finalizing) {
            return self.fail(ProtocolError::Cancelled, None);
        }
        self.advance();
    }

    fn on_message(&mut self, bytes: &[u8], now: Instant) -> Result<(), ProtocolError> {
        let (h, m) = match self.seals.as_mut().map(|s| s.incoming.open(bytes)) {
            None => wire::decode(bytes)?,
            Some(Ok(opened)) => opened,
            Some(Err(Unsealed::Wire(e))) => return Err(ProtocolError::Wire(e)),
            Some(Err(Unsealed::Tag)) => return Err(ProtocolError::Unsealed),
        };
        if self.phase != Phase::AwaitHello && h.session != self.session {
            return Err(ProtocolError::Peer(format!(
                "message of session {:#x}, ours is {:#x}",
                h.session, self.session
            )));
        }
        match (self.phase, m) {
            (Phase::AwaitHello, Message::Hello(hello)) => {
                self.session = h.session;
                self.greeted = true;
                self.cancel = hello.caps & caps::CANCEL;
                self.probes = hello.caps & caps::PROBES != 0;
                self.progress = now;
                let v = *wire::PROTOCOL_VERSIONS.end();
                // With a secret, and a sender that offers to prove it, only the keyed digest.
                let keyed = self.cfg.secret.is_some() && hello.caps & caps::AUTH != 0;
                let chosen = Digest::choose(hello.caps, self.cfg.digest, keyed);
                self.digest = chosen.unwrap_or_default();
                if hello.version_max < *wire::PROTOCOL_VERSIONS.start() || hello.version_min > v {
                    let why = format!(
                        "sender speaks versions {}..={}, receiver {:?}",
                        hello.version_min,
                        hello.version_max,
                        wire::PROTOCOL_VERSIONS
                    );
                    self.refuse(Status::ProtocolMismatch, why);
                } else if chosen.is_none() && keyed {
                    let why = "with a shared secret this receiver needs the keyed digest (blake3-keyed), which the sender does not offer";
                    self.refuse(Status::ProtocolMismatch, why.into());
                } else if keyed && hello.caps & caps::SEALED == 0 {
                    let why =
                        "with a shared secret this receiver needs sealed messages, which the sender does not offer";
                    self.refuse(Status::ProtocolMismatch, why.into());
                } else if chosen.is_none() {
                    self.refuse(Status::ProtocolMismatch, "sender offers no digest this receiver knows".into());
                } else if self.cfg.batch && hello.caps & caps::BATCH != 0 && hello.name == wire::BATCH_NAME {
                    self.start_batch(hello);
                } else if let Err(why) = crate::name::check(&hello.name) {
                    self.refuse(Status::BadName, why);
                } else if hello.size > self.cfg.max_size.min(self.cfg.max_session_bytes) {
                    let most = self.cfg.max_size.min(self.cfg.max_session_bytes);
                    self.refuse(Status::TooLarge, format!("{} bytes, at most {most}", hello.size));
                } else if hello.chunk == 0 || hello.depth == 0 {
                    self.refuse(Status::ProtocolMismatch, "chunk size and depth must be at least 1".into());
                } else {
                    self.version = hello.version_max.min(v);
                    self.size = hello.size;
                    self.size_ring(&hello);
                    self.chunks = hello.size.div_ceil(u64::from(self.slot_size));
                    if self.cfg.resume && hello.caps & RESUMES == RESUMES {
                        self.resume_key = hello.resume;
                    }
                    self.prove_then_open(hello);
                }
            }
            (Phase::Authenticating, Message::Proof(p)) => {
                let (Some(secret), Some((name, size))) = (self.cfg.secret.clone(), self.offered.take()) else {
                    return Err(ProtocolError::Local("authenticating without a secret or a file".into()));
                };
                let t = Transcript {
                    session: self.session,
                    sender_nonce: &p.nonce,
                    receiver_nonce: &self.nonce,
                    size,
                    name: &name,
                };
                if !secret.verify(&p.mac, Role::Sender, &t) {
                    self.auth_failed = true;
                    self.refuse(Status::NotAuthorized, "the proof of the shared secret is wrong".into());
                    return Ok(());
                }
                self.progress = now;
                self.proved = true;
                let digest_secret = secret.digest_secret(&t);
                self.digest_secret = Some(DigestSecret(digest_secret));
                // Everything after the sender's PROOF is sealed, both ways: this side's PROOF on.
                self.seals = Some(Seals::new(&digest_secret, Role::Receiver));
                let mac = secret.proof(Role::Receiver, &t);
                self.send(&Message::Proof(Proof { nonce: self.nonce, mac }));
                self.open(name);
            }
            (Phase::Data, Message::Fin(fin)) if self.fin.is_none() => {
                // The FIN comes on lane 0, after lane 0's WRITEs; the other lanes' last ones
                // may still be on their way (no order between connections).
                let complete =
                    if self.lanes > 1 { self.lane_next[0] >= self.chunks } else { fin.chunks == self.arrived };
                if fin.chunks != self.chunks || fin.size != self.size || !complete {
                    return Err(ProtocolError::Peer(format!(
                        "FIN for {} chunks / {} bytes; {} of {} chunks / {} bytes arrived",
                        fin.chunks, fin.size, self.arrived, self.chunks, self.size
                    )));
                }
                if fin.digest.len() != self.digest.size() {
                    let n = fin.digest.len();
                    return Err(ProtocolError::Peer(format!(
                        "an {} digest has {} bytes, not {n}",
                        self.digest,
                        self.digest.size()
                    )));
                }
                self.fin = Some(fin.digest);
                self.progress = now;
            }
            (Phase::Proving, Message::Proof(p)) => self.on_prefix_proof(p, now)?,
            // The sender's send was cancelled: it leaves, and hears nothing more. The chunks
            // that arrived before the CANCEL are stored first (below): a resume continues
            // after them.
            (phase, Message::Cancel(_)) if phase != Phase::AwaitHello => self.cancelled = true,
            (Phase::AwaitEntry, Message::Entry(e)) => self.on_entry(e, now)?,
            (Phase::AwaitEntry, Message::End(End { entries })) => {
                let Some(b) = self.batch.take() else {
                    return Err(ProtocolError::Local("an END outside a batch".into()));
                };
                if entries != b.entries {
                    return Err(ProtocolError::Peer(format!("END after {entries} entries; {} came", b.entries)));
                }
                let (status, mut detail) = b.first_failure.unwrap_or((Status::Ok, String::new()));
                detail = if b.failed == 0 {
                    format!("{} entries stored", b.ok)
                } else {
                    format!("{} of {} entries stored; the first failure: {detail}", b.ok, b.entries)
                };
                self.acked = true;
                self.send(&Message::Ack(Ack { status, received: b.held, detail: detail.clone(), retry_after_ms: 0 }));
                self.phase = Phase::Done;
                self.actions.push_back(Action::Finish(Outcome::Acked { status, detail }));
            }
            (phase, m) => return Err(ProtocolError::Peer(format!("unexpected {:?} while {phase:?}", m.kind()))),
        }
        Ok(())
    }

    /// A HELLO asking for a batch: checked as a session (its total within
    /// `max_session_bytes`), then the ring is reserved (after the proof of the secret).
    fn start_batch(&mut self, hello: wire::Hello) {
        if hello.size > self.cfg.max_session_bytes {
            let why = format!("a batch of {} bytes, at most {} per session", hello.size, self.cfg.max_session_bytes);
            return self.refuse(Status::TooLarge, why);
        }
        if hello.chunk == 0 || hello.depth == 0 {
            return self.refuse(Status::ProtocolMismatch, "chunk size and depth must be at least 1".into());
        }
        self.version = hello.version_max.min(*wire::PROTOCOL_VERSIONS.end());
        self.size_ring(&hello);
        let resume = self.cfg.resume && hello.caps & RESUMES == RESUMES;
        self.batch = Some(Batch { declared: hello.size, resume, ..Batch::default() });
        self.prove_then_open(hello);
    }

    /// The ring a HELLO gets: its chunk within `max_chunk`, its depth within the memory budget
    /// and `max_slots`.
    fn size_ring(&mut self, hello: &wire::Hello) {
        self.slot_size = hello.chunk.min(self.cfg.max_chunk).max(1);
        let fit = (self.cfg.memory_budget / u64::from(self.slot_size)).clamp(1, u64::from(u32::MAX));
        self.slot_count = hello.depth.min(fit as u32).min(self.cfg.max_slots).max(1);
        // Striping, when both sides want it: at most `max_lanes` and `MAX_LANES`.
        self.lanes = if hello.caps & caps::LANES != 0 {
            hello.lanes.min(self.cfg.max_lanes).clamp(1, wire::MAX_LANES)
        } else {
            1
        };
        self.reset_lanes();
    }

    /// Every lane back to its first chunk (a new file, or a resume that moved chunk 0).
    fn reset_lanes(&mut self) {
        self.lane_next = (0..u64::from(self.lanes)).collect();
    }

    /// [`caps::LANES`] when striping was granted.
    fn lanes_cap(&self) -> u32 {
        if self.lanes > 1 {
            caps::LANES
        } else {
            0
        }
    }

    /// The GRANT's lanes block.
    fn granted_lanes(&self) -> Option<wire::Lanes> {
        (self.lanes > 1).then_some(wire::Lanes { count: self.lanes, token: self.lane_token })
    }

    /// After an accepted HELLO: opens at once, or with a secret challenges the sender first
    /// (one that offers no `AUTH` is refused).
    fn prove_then_open(&mut self, hello: wire::Hello) {
        if self.cfg.secret.is_none() {
            self.open(hello.name);
        } else if hello.caps & caps::AUTH == 0 {
            let why = "this receiver requires a shared secret: give the sender one (rdma-copy: --secret-file or RDMA_COPY_SECRET)";
            self.refuse(Status::NotAuthorized, why.into());
        } else {
            self.phase = Phase::Authenticating;
            self.offered = Some((hello.name, hello.size));
            self.send(&Message::Challenge(Challenge { nonce: self.nonce, prefix: None }));
        }
    }

    /// An ENTRY of the batch: checked (its path, its size within the limits), then opened by
    /// the driver; a refused entry gets its ACK and the batch goes on.
    fn on_entry(&mut self, e: Entry, now: Instant) -> Result<(), ProtocolError> {
        // Every ENTRY counts as progress, and only OFFER_CREDIT of it: a larger credit would let
        // a peer hold its place with one entry a second (an existing directory, an empty file).
        self.credit(OFFER_CREDIT);
        let (max_size, max_session) = (self.cfg.max_size, self.cfg.max_session_bytes);
        let Some(b) = self.batch.as_mut() else {
            return Err(ProtocolError::Local("an ENTRY outside a batch".into()));
        };
        if b.entries >= self.cfg.max_entries {
            return Err(ProtocolError::Peer(format!("more than {} entries in one batch", self.cfg.max_entries)));
        }
        if e.index != b.entries {
            return Err(ProtocolError::Peer(format!("ENTRY {}, expected {}", e.index, b.entries)));
        }
        if e.kind == EntryKind::Directory && e.size != 0 {
            return Err(ProtocolError::Peer(format!("a directory of {} bytes", e.size)));
        }
        b.entries += 1;
        b.current = Some((e.index, e.path.clone(), e.kind));
        // Only an entry that is opened counts against the total: a refused one brings no
        // bytes, and counting it (a file that grew since the sender walked its tree, a size
        // that overflows) would refuse every later entry, directories too.
        let announced = b.announced.saturating_add(e.size);
        let limit = b.declared.min(max_session);
        self.progress = now;
        // The entry's own state: nothing of the last one carries over.
        self.size = e.size;
        self.base = 0;
        self.chunks = e.size.div_ceil(u64::from(self.slot_size));
        (self.arrived, self.stored, self.credited, self.fin, self.opened) = (0, 0, 0, None, false);
        self.resume_key = (b.resume && e.resume != 0).then_some(e.resume);
        self.reset_lanes();
        if let Err(why) = crate::name::check_path(&e.path) {
            self.entry_done(Status::BadName, why);
        } else if e.size > max_size {
            self.entry_done(Status::TooLarge, format!("{}: {} bytes, at most {max_size}", e.path, e.size));
        } else if announced > limit {
            let why =
                format!("{}: the batch would pass {limit} bytes (its announced total or the session limit)", e.path);
            self.entry_done(Status::TooLarge, why);
        } else {
            if let Some(b) = self.batch.as_mut() {
                b.announced = announced;
            }
            self.phase = Phase::Opening;
            self.actions.push_back(Action::OpenEntry(e));
        }
        Ok(())
    }

    /// Resuming from a partial ([`Input::Resumed`] above 0): sends the prefix CHALLENGE for
    /// entry `index` and waits for the sender's proof (`Proving`); whether it did. The GRANT
    /// (or READY) waits for a proof that verifies.
    fn challenge_prefix(&mut self, index: u32) -> bool {
        if self.base == 0 || self.expected.is_none() {
            return false;
        }
        self.phase = Phase::Proving;
        let prefix = Some(PrefixClaim { index, from: self.base });
        self.send(&Message::Challenge(Challenge { nonce: self.nonce, prefix }));
        true
    }

    /// The sender's proof of the prefix: right, the GRANT (or READY) resumes from it; wrong, the
    /// file starts over from byte 0 in a new temporary ([`Action::StartOver`]) and the partial
    /// is left to its owner. A proof must echo this side's nonce and match what the driver
    /// hashed.
    fn on_prefix_proof(&mut self, p: Proof, now: Instant) -> Result<(), ProtocolError> {
        let right = p.nonce == self.nonce && self.expected.is_some_and(|e| crate::auth::same_bytes(&e, &p.mac));
        self.expected = None;
        self.progress = now;
        if std::mem::take(&mut self.present) {
            self.already_stored(right);
            return Ok(());
        }
        let Some((addr, rkey)) = self.ring else {
            return Err(ProtocolError::Local("proving a prefix without a ring".into()));
        };
        let entry = self.batch.as_ref().and_then(|b| b.current.as_ref()).map(|c| c.0);
        if !right {
            self.prefix_refused += 1;
            self.base = 0;
            self.chunks = self.size.div_ceil(u64::from(self.slot_size));
            self.reset_lanes();
            // Not this sender's partial: nothing of this session may touch it any more.
            self.resume_key = None;
            self.phase = Phase::Opening;
            self.actions.push_back(Action::StartOver);
            return Ok(());
        }
        match entry {
            Some(index) => {
                self.phase = Phase::Data;
                self.send(&Message::Ready(Ready { index, resume_from: self.base }));
            }
            None => self.grant(addr, rkey, now),
        }
        Ok(())
    }

    /// The verdict on a file in place already ([`Input::Present`]): `Ok` when the sender proved
    /// the same bytes (counted as stored, nothing sent), else `Exists`.
    fn already_stored(&mut self, identical: bool) {
        let name = self.batch.as_ref().and_then(|b| b.current.as_ref()).map(|c| c.1.clone());
        let name = name.or_else(|| self.offered_name.clone()).unwrap_or_default();
        let (status, detail) = match identical {
            true => (Status::Ok, format!("{name}: already stored, identical (size and digest)")),
            false => {
                self.base = 0;
                (Status::Exists, format!("{name} exists"))
            }
        };
        if self.is_batch() {
            return self.entry_done(status, detail);
        }
        self.ack(status, detail.clone());
        self.phase = Phase::Done;
        self.actions.push_back(Action::Finish(Outcome::Acked { status, detail }));
    }

    /// Whether the entry in progress is a directory.
    fn is_dir(&self) -> bool {
        self.batch.as_ref().and_then(|b| b.current.as_ref()).is_some_and(|c| c.2 == EntryKind::Directory)
    }

    /// Sends a single file's GRANT (resuming from `base`) and enters the data phase.
    fn grant(&mut self, addr: u64, rkey: u32, now: Instant) {
        self.phase = Phase::Data;
        self.progress = now;
        let auth = if self.cfg.secret.is_some() { caps::AUTH | caps::SEALED } else { 0 };
        let resume = if self.resume_key.is_some() { caps::RESUME } else { 0 };
        let g = Grant {
            version: self.version,
            caps: self.digest.cap() | auth | resume | self.lanes_cap() | self.cancel,
            addr,
            rkey,
            slot_size: self.slot_size,
            slot_count: self.slot_count,
            resume_from: self.base,
            lanes: self.granted_lanes(),
        };
        self.send(&Message::Grant(g));
        self.pace = Some(Pace::new(now));
    }

    /// Whether an entry of a batch is being opened (not the batch's ring).
    fn entry_open(&self) -> bool {
        self.batch.as_ref().is_some_and(|b| b.current.is_some())
    }

    /// The entry in progress ended with `status`, told to the sender by its ACK; the batch
    /// waits for the next entry.
    fn entry_done(&mut self, status: Status, detail: String) {
        let bytes = self.bytes_stored();
        self.ack(status, detail.clone());
        let Some(b) = self.batch.as_mut() else { return };
        let Some((index, path, _)) = b.current.take() else { return };
        if status == Status::Ok {
            b.ok += 1;
            b.held = b.held.saturating_add(bytes);
        } else {
            b.failed += 1;
            b.first_failure.get_or_insert_with(|| (status, format!("{path}: {status}: {detail}")));
        }
        self.opened = false;
        self.phase = Phase::AwaitEntry;
        // The entry's bytes are now its verdict's: none is in progress (`bytes_stored` is 0),
        // so that a driver adding them to its entries' counts each once.
        (self.size, self.base, self.stored, self.arrived, self.chunks) = (0, 0, 0, 0, 0);
        self.actions.push_back(Action::EntryDone { index, path, status, detail, bytes });
    }

    /// Asks the driver to open the file and register the ring (the HELLO was accepted, and the
    /// sender proved the secret if one is required).
    fn open(&mut self, name: String) {
        self.phase = Phase::Opening;
        if self.is_batch() {
            let (slot_size, slot_count) = (self.slot_size, self.slot_count);
            self.actions.push_back(Action::Reserve { slot_size, slot_count });
            return;
        }
        self.offered_name = Some(name.clone());
        self.actions.push_back(Action::Open {
            name,
            size: self.size,
            slot_size: self.slot_size,
            slot_count: self.slot_count,
        });
    }

    /// A WRITE on `lane`: it must be that lane's next chunk (chunk `n` comes on lane
    /// `n % lanes`, each lane in order), within the file and the credit, of its chunk's
    /// length. Chunks are then stored in their global order, as they become contiguous.
    fn on_write(&mut self, lane: u16, imm: u32, len: u32, now: Instant) -> Result<(), ProtocolError> {
        if self.phase != Phase::Data || (self.fin.is_some() && lane == 0) {
            return Err(ProtocolError::Peer("a WRITE outside the data phase".into()));
        }
        let Some(&seq) = self.lane_next.get(usize::from(lane)) else {
            return Err(ProtocolError::Peer(format!("a WRITE on lane {lane}; {} granted", self.lanes)));
        };
        if seq >= self.chunks {
            return Err(ProtocolError::Peer(format!("a WRITE beyond the file's {} chunks", self.chunks)));
        }
        let lanes = u64::from(self.lanes.max(1));
        if seq >= lanes && imm == (seq - lanes) as u32 {
            // The lane's last chunk again: the device's, not the peer's (see the variant).
            return Err(ProtocolError::CompletedTwice { chunk: seq - lanes });
        }
        if imm != seq as u32 {
            // Which lane matters only when there are several.
            let on = if self.lanes > 1 { format!(" on lane {lane}") } else { String::new() };
            return Err(ProtocolError::Peer(format!("WRITE tagged chunk {imm}{on}, expected chunk {}", seq as u32)));
        }
        if seq >= self.credited + u64::from(self.slot_count) {
            return Err(ProtocolError::Peer(format!("chunk {seq} written before its slot was credited")));
        }
        let want = (self.size - self.base - seq * u64::from(self.slot_size)).min(u64::from(self.slot_size)) as u32;
        if len != want {
            return Err(ProtocolError::Peer(format!("chunk {seq} of {len} bytes, expected {want}")));
        }
        self.lane_next[usize::from(lane)] = seq + u64::from(self.lanes);
        self.progress = now;
        self.credit(u64::from(len));
        // Store, in order, every chunk now contiguous: chunk `n` arrived when its lane is past it.
        let lanes = u64::from(self.lanes);
        while self.arrived < self.chunks && self.lane_next[(self.arrived % lanes) as usize] > self.arrived {
            let seq = self.arrived;
            let len = (self.size - self.base - seq * u64::from(self.slot_size)).min(u64::from(self.slot_size)) as u32;
            self.arrived += 1;
            self.actions.push_back(Action::StoreChunk {
                seq,
                slot: (seq % u64::from(self.slot_count)) as u32,
                offset: self.base + seq * u64::from(self.slot_size),
                len,
            });
        }
        Ok(())
    }

    fn advance(&mut self) {
        if self.phase != Phase::Data {
            return;
        }
        // Credit slots in batches of a quarter ring (at least 1), and at once when the sender
        // could otherwise stall on the last ones.
        let batch = u64::from(self.slot_count / 4).max(1);
        let pending = self.stored - self.credited;
        if pending > 0 && (pending >= batch || self.stored == self.arrived) {
            self.credited = self.stored;
            self.send(&Message::Credit(Credit { consumed: self.credited }));
        }
        if self.stored == self.chunks {
            if let Some(digest) = self.fin.take() {
                self.phase = Phase::Finalizing;
                self.actions.push_back(Action::Finalize { digest });
            }
        }
    }

    fn send(&mut self, m: &Message) {
        if self.outbox.push(self.session, m, self.seals.as_mut().map(|s| &mut s.outgoing)).is_ok() {
            self.actions.push_back(Action::Send);
        }
    }

    fn ack(&mut self, status: Status, detail: String) {
        self.acked = true;
        let retry_after_ms = match status {
            Status::Busy => u32::try_from(self.busy_hint.as_millis()).unwrap_or(u32::MAX).max(1),
            _ => 0,
        };
        self.send(&Message::Ack(Ack { status, received: self.bytes_stored(), detail, retry_after_ms }));
    }

    /// Refuses the HELLO (nothing opened): ACK with `status`, session over.
    fn refuse(&mut self, status: Status, detail: String) {
        self.ack(status, detail.clone());
        self.phase = Phase::Done;
        self.actions.push_back(Action::Finish(Outcome::Acked { status, detail }));
    }

    /// Ends the session on an error: remove the temporary, tell the peer if `ack` is set.
    fn fail(&mut self, e: ProtocolError, ack: Option<(Status, String)>) {
        if self.opened {
            self.actions.push_back(Action::Discard);
        }
        if let Some((status, detail)) = ack {
            if self.session != 0 || self.phase != Phase::AwaitHello {
                self.ack(status, detail);
            }
        }
        self.phase = Phase::Done;
        self.actions.push_back(Action::Finish(Outcome::Failed(e)));
    }
}

/// What a sender must offer to resume: [`caps::RESUME`] with proof of the prefix
/// ([`caps::RESUME_PROOF`]). A sender that offers only the first (an older one) is served from
/// byte 0: a resume key alone (seen in `ls -a`, or on the wire) must not continue a partial.
const RESUMES: u32 = caps::RESUME | caps::RESUME_PROOF;

/// The verdict of a failure the driver reports: a status of `Ok` there is the driver's own bug,
/// and must not reach the sender as success.
fn failed(status: Status) -> Status {
    if status == Status::Ok {
        Status::Internal
    } else {
        status
    }
}

impl PartialOrd for Phase {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some((*self as u8).cmp(&(*other as u8)))
    }
}
