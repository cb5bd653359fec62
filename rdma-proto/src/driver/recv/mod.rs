//! [`Server`]: listen, and receive files from senders, each on its own thread (or, with the
//! feature `tokio`, each a task of the caller's runtime).

mod server;
mod session;
mod shared;

pub use server::Server;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::auth::Secret;
use crate::driver::flag::Flag;
use crate::driver::{Error, Phases, Progress};
use crate::policy::Policy;
use crate::receiver::DEFAULT_MIN_RATE;
use crate::{Digest, Status};

/// What a receiver accepts, and where it stores files. Made by [`Default`] (it is
/// `#[non_exhaustive]`: fields may be added), then changed field by field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReceiveOptions {
    /// The directory files are stored in; `None` receives into memory only (the data is
    /// checked against the digest, then thrown away). [`Server::bind`] opens it once and
    /// proves it can take files; every file is then made relative to it, following no link
    /// ([`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)).
    pub dir: Option<PathBuf>,
    /// Replace existing files.
    pub overwrite: bool,
    /// Largest file accepted.
    pub max_size: u64,
    /// Most bytes one session may bring: its file, or all the files of a batch together
    /// (more are refused with [`Status::TooLarge`]: the whole batch when it announces more,
    /// else each entry that would pass it).
    pub max_session_bytes: u64,
    /// Largest chunk granted.
    pub max_chunk: u32,
    /// Memory for the slot rings of all transfers together (256 MiB by default): each of the
    /// `max_sessions` transfers may take an equal share, its ring and its one-chunk copy
    /// buffer within it (its chunk at most half the share), so that no set of peers, however
    /// many and whatever they ask, makes the receiver hold more, and fewer than `max_sessions`
    /// of them cannot take it all. A sender asking for more gets fewer or smaller slots.
    pub memory_budget: u64,
    /// Most slots per transfer.
    pub max_slots: u32,
    /// Transfers served at the same time; more are refused with [`Status::Busy`].
    pub max_sessions: usize,
    /// How long a phase may make no progress.
    pub timeout: Duration,
    /// Bound on accepting a connection.
    pub accept_timeout: Duration,
    /// The QP's local ACK timeout, an exponent: a control message not acknowledged within
    /// 4.096 µs × 2^`ack_timeout` is sent again (1..=31; as
    /// [`SendOptions::ack_timeout`](crate::driver::SendOptions::ack_timeout)).
    pub ack_timeout: u8,
    /// How the session's loop waits for completions once a round made no progress: by
    /// default it sleeps on the CQs' channel at once ([`rdma_verbs::WaitPolicy::sleep_at_once`]; why:
    /// [`docs/protocol.md`, "Speed, and the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)). A spin budget
    /// ([`rdma_verbs::WaitPolicy::spin_then_sleep`]) trades a core for the wake-up latency.
    pub wait: rdma_verbs::WaitPolicy,
    /// How long an accepted connection may take to send its HELLO, and then (with a secret)
    /// its proof: an idle connection holds one of the few places past `max_sessions` until
    /// then, and is closed after it.
    pub hello_timeout: Duration,
    /// How long a new connection keeps its place against newcomers before it proves itself
    /// (its HELLO taken and, with a secret, the secret proved): 1 s by default. When every
    /// place (`max_sessions` and the few beyond it) is taken, a new connection request takes
    /// the place of the oldest connection that has proved nothing for this long, instead of
    /// hearing [`Status::Busy`]; the older one is closed ([`Error::Preempted`]). Whose
    /// place goes by fair shares of the addresses, and a request that proves the secret in its
    /// connect request ([`wire::Knock`](crate::wire::Knock)) takes any unproven place at any age. So connections
    /// that are opened and then hold still keep a sender out for at most this long, and
    /// connections that prove nothing cannot take a secret holder's place; what stays open
    /// (floods of requests among it) is in [`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model). A sender without a secret
    /// slower than this to send its HELLO may itself be displaced while the receiver is full.
    /// [`Duration::MAX`] keeps every place to its connection's HELLO timeout.
    pub preempt_after: Duration,
    /// The slowest pace an admitted sender may keep, in bytes per second, judged once per
    /// `timeout` of its own time (16 KiB/s by default, [`DEFAULT_MIN_RATE`](crate::receiver::DEFAULT_MIN_RATE); 0 sets no floor):
    /// a slower one is told [`Status::Busy`] and its session ends, keeping a resumable
    /// partial, so that a peer trickling a byte per `timeout` cannot hold a place for ever.
    /// Each ENTRY of a batch counts [`OFFER_CREDIT`](crate::receiver::OFFER_CREDIT) bytes.
    pub min_rate: u64,
    /// Most entries one batch may offer (1,000,000 by default): past them the session ends as
    /// for a message out of place ([`ReceiverConfig::max_entries`](crate::receiver::ReceiverConfig::max_entries)).
    pub max_entries: u32,
    /// Resume interrupted transfers (with a `dir`): a session that fails midway (the sender
    /// killed or gone, the link cut, the receiver stopped) keeps its data as a partial, and a
    /// sender offering the same version of the file later sends only the rest. A partial is
    /// never under the file's name, and the whole-file digest still covers every byte.
    pub resume: bool,
    /// Partials not written for this long are removed (when the server binds, and when a
    /// transfer looks for one).
    pub partial_ttl: Duration,
    /// Most partials kept at once (64 by default): keeping one more gives up the oldest
    /// ([`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)), so that senders that break off on purpose cannot
    /// make the receiver keep data without end. 0 keeps none.
    pub max_partials: usize,
    /// Most bytes the partials kept hold together (256 GiB by default): keeping one more gives
    /// up the oldest; a partial larger than this alone is not kept.
    pub max_partial_bytes: u64,
    /// Without a secret: most bytes the partials of one sender address hold together (64 GiB
    /// by default): keeping one more gives up that address's oldest, so that one peer cannot
    /// push everyone else's partials out.
    pub max_partial_bytes_per_address: u64,
    /// Free space kept on the destination's file system (with [`min_free_percent`]: the larger
    /// of the two, but at most a fifth of the file system; 1 GiB by default): a partial is kept
    /// only while it stays free, the oldest partials (those of senders that proved no secret
    /// first) given up to keep it, and a transfer that opens gives up partials until its file
    /// fits beside it. A transfer itself is never refused for it: it may fill the disk as
    /// before, and is never refused for space that abandoned partials hold
    /// ([`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)).
    ///
    /// [`min_free_percent`]: Self::min_free_percent
    pub min_free: u64,
    /// The free space kept, as a percentage of the file system's size (5 by default; see
    /// [`min_free`](Self::min_free)).
    pub min_free_percent: u8,
    /// How often a resumable transfer's partial is checkpointed, in bytes stored (64 MiB by
    /// default): each checkpoint syncs the data stored so far and replaces the sidecar that
    /// vouches for it, so a receiver killed outright (SIGKILL, a crash) loses at most this much
    /// of the transfer. Values below one chunk checkpoint after every chunk.
    pub checkpoint_every: u64,
    /// The shared secret a sender must prove it knows ([`crate::auth`]): checked before
    /// anything is opened or registered for its file; `None` serves everyone. Load it from a
    /// file or the environment ([`Secret::new`]), never from a command line.
    pub secret: Option<Secret>,
    /// Wrong proofs of the secret from one address within `auth_window` that are answered at
    /// once; past them, the answer to each further wrong proof from that address is held back
    /// (1 s, then doubling, up to `auth_window / auth_attempts`): a token bucket that slows a
    /// guesser down. A correct proof is never delayed or refused, whatever its address did.
    pub auth_attempts: u32,
    /// The window `auth_attempts` counts in.
    pub auth_window: Duration,
    /// Connections one address may hold at the same time (4 by default), sessions and those
    /// still before their HELLO together: more are refused with [`Status::Busy`], so that a
    /// few peers cannot take every place (`max_sessions` and the few beyond it for HELLOs).
    /// Extra lanes of a session are not counted.
    pub max_per_address: usize,
    /// Most lanes (connections) one session's chunks may be striped over
    /// ([`wire::caps::LANES`](crate::wire::caps::LANES)), 1 ..= [`wire::MAX_LANES`](crate::wire::MAX_LANES): a sender asking for more is granted
    /// this many; 1 grants no striping. Each extra lane is a connection to this server that
    /// presents the session's token (from its GRANT) and is taken only while its session
    /// lives; it costs a QP and `max_slots + 16` receives of 64 bytes.
    pub max_lanes: u16,
    /// The whole-file digest granted when the sender offers it (every sender offers
    /// XXH3-128; this crate's also offer XXH64). `None` (the default): the one that hashes
    /// faster on this CPU ([`fastest_digest`](crate::driver::fastest_digest), measured once per
    /// process). With a [`secret`](Self::secret) every session uses keyed BLAKE3
    /// ([`Digest::Blake3Keyed`]) instead.
    pub digest: Option<Digest>,
    /// The embedder's own rule ([`Policy`]): asked about each file or directory a sender
    /// offers, after the receiver's own checks and before anything is opened or made for it;
    /// it may refuse the offer with a status. `None` (the default) accepts what the limits
    /// allow.
    pub policy: Option<Policy>,
    /// Called as each chunk is stored ([`Progress`]), from the session's thread or task.
    pub progress: Option<Progress>,
    /// [Set](Flag::set) it to stop: the accept loop and the sessions asleep wake at once;
    /// sessions in progress end with [`Error::Stopped`] (their temporaries removed), and
    /// [`Server::serve`] returns once they ended. From a signal, set it from a thread that
    /// waits for the signal (`signal_hook::iterator::Signals`, as `rdma-copy` does).
    pub stop: Flag,
    /// Test hook: flip one byte of this chunk as it arrives (to prove the digest check).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub corrupt_chunk: Option<u64>,
    /// Test hook: a hostile receiver that, once the FIN came, never ACKs but repeats an old
    /// CREDIT every millisecond (to prove the sender's timeout still fires).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_never_ack: bool,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            dir: None,
            overwrite: false,
            max_size: 1 << 40,
            max_session_bytes: 1 << 40,
            max_chunk: 4 << 20,
            memory_budget: 256 << 20,
            max_slots: 64,
            max_sessions: 8,
            timeout: Duration::from_secs(30),
            accept_timeout: Duration::from_secs(10),
            ack_timeout: crate::driver::link::RECEIVE_ACK_TIMEOUT,
            wait: crate::driver::link::WAIT,
            hello_timeout: Duration::from_secs(10),
            preempt_after: Duration::from_secs(1),
            min_rate: DEFAULT_MIN_RATE,
            max_entries: 1_000_000,
            policy: None,
            progress: None,
            resume: true,
            partial_ttl: Duration::from_secs(24 * 3600),
            max_partials: 64,
            max_partial_bytes: 256 << 30,
            max_partial_bytes_per_address: 64 << 30,
            min_free: 1 << 30,
            min_free_percent: 5,
            checkpoint_every: 64 << 20,
            secret: None,
            auth_attempts: 5,
            auth_window: Duration::from_secs(60),
            max_per_address: 4,
            max_lanes: 4,
            digest: None,
            stop: Flag::new(),
            #[cfg(feature = "fault-injection")]
            corrupt_chunk: None,
            #[cfg(feature = "fault-injection")]
            test_never_ack: false,
        }
    }
}

/// What one session did.
#[derive(Debug)]
#[non_exhaustive]
pub struct ReceiveReport {
    /// The session id (0 if no HELLO came).
    pub session: u64,
    /// Whether a HELLO came (valid or not, proved or not).
    pub hello: bool,
    /// Whether the connection asked for a transfer as a peer this receiver serves: its HELLO
    /// came and, with a secret, it proved the secret. What [`Server::serve`]'s count counts.
    pub authorized: bool,
    /// Whether the sender's proof of the secret was wrong (what the server rate-limits).
    pub auth_failed: bool,
    /// The sender's address.
    pub peer: SocketAddr,
    /// The file name, if a valid HELLO came.
    pub name: Option<String>,
    /// Bytes stored.
    pub bytes: u64,
    /// `Ok` when the file was stored (ACK `Ok` sent); [`Error::Refused`] with the status when
    /// the verdict sent was another (a refusal never reads as `Ok`); any other error when the
    /// session failed without a verdict.
    pub result: Result<(), Error>,
    /// Time per phase.
    pub phases: Phases,
    /// Wall time from the connection request.
    pub total: Duration,
    /// A batch's first [`REPORTED_ENTRIES`] entries, each with its verdict, in the order they
    /// came (empty for a single file); [`entry_counts`](Self::entry_counts) counts them all.
    /// `result` is then the summary: `Ok` when every entry was stored, else
    /// [`Error::Refused`] with the first failure's status.
    pub entries: Vec<EntryReport>,
    /// All of a batch's entries that ended, whether `entries` lists them or not.
    pub entry_counts: EntryCounts,
}

/// Most entries a [`ReceiveReport`] lists: a report costs at most this many lines, whatever a
/// peer sends (a batch of a million refused entries once kept about 3 GB until its session
/// ended). [`ReceiveReport::entry_counts`] counts the rest.
pub const REPORTED_ENTRIES: usize = 1000;

/// How many of a batch's entries ended, how many of them were stored, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryCounts {
    /// Entries with a verdict.
    pub ended: u64,
    /// Of those, the entries stored.
    pub stored: u64,
    /// Bytes of the entries stored.
    pub bytes: u64,
}

/// What became of one entry of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryReport {
    /// Its path, relative to the destination.
    pub path: String,
    /// A directory (else a file).
    pub directory: bool,
    /// The verdict sent for it.
    pub status: Status,
    /// Why, for a failure (at most [`wire::MAX_DETAIL_LEN`](crate::wire::MAX_DETAIL_LEN) bytes, as its ACK).
    pub detail: String,
    /// Bytes of it held.
    pub bytes: u64,
}

impl ReceiveReport {
    /// The report of a session from `peer` that is starting.
    fn starting(peer: SocketAddr) -> Self {
        ReceiveReport {
            session: 0,
            hello: false,
            authorized: false,
            auth_failed: false,
            peer,
            name: None,
            bytes: 0,
            result: Ok(()),
            phases: Phases::default(),
            total: Duration::ZERO,
            entries: Vec::new(),
            entry_counts: EntryCounts::default(),
        }
    }

    /// Completes the report with the session's result, and logs it.
    fn ended(mut self, result: Result<(), Error>, start: Instant) -> Self {
        self.result = result;
        self.total = start.elapsed();
        let (session, peer) = (format_args!("{:016x}", self.session), self.peer);
        match &self.result {
            Ok(()) => tracing::info!(session = %session, %peer, bytes = self.bytes, "session ended: stored"),
            Err(Error::Refused { status, .. }) => {
                tracing::info!(session = %session, %peer, %status, bytes = self.bytes, "session ended: refused")
            }
            Err(e) => tracing::warn!(session = %session, %peer, error = %e, "session failed"),
        }
        self
    }

    /// The verdict the receiver sent, if it sent one: `Ok` for a stored file, the refusal's
    /// status otherwise.
    pub fn status(&self) -> Option<Status> {
        match &self.result {
            Ok(()) => Some(Status::Ok),
            Err(Error::Refused { status, .. }) => Some(*status),
            Err(_) => None,
        }
    }
}
