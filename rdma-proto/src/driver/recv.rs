//! [`Server`]: listen, and receive files from senders, each on its own thread (or, with the
//! feature `tokio`, each a task of the caller's runtime).

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rdma_cm::{ConnectRequest, Listener};
use rdma_verbs::{AccessFlags, AlignedBuffer, Deadline, Rc, RecvRing, SendQueue, Slot, SlotPool};

use super::digest::Hasher;
use super::files::{io_status, make_dir_entry, make_dirs, DirFd, Incoming, MadeDirs};
use super::flag::{Bell, Flag};
#[cfg(feature = "tokio")]
use super::io::Tokio;
use super::io::Wakes;
use super::io::{block_on, Blocking, Io};
use super::knock::Knocks;
use super::link::{
    conn_params, explain_loss, peer_left, send_control, take_arrivals, Endpoint, EndpointParts, LaneBase, Pacer,
    SessionCqs, Side, DISCONNECT_WAIT, DRAIN,
};
use super::partials::Ledger;
use super::places::{AddressPlace, ConnectionPlaces, Counted, PerAddress, Place};
use super::policy::{Offer, Policy};
use super::{Error, Phases, Progress, ProgressEvent};
use crate::auth::Secret;
use crate::receiver::{Action, Input, Receiver, ReceiverConfig, DEFAULT_MIN_RATE};
use crate::wire::{self, Ack, Entry, EntryKind, Message};
use crate::{Digest, Outcome, Status};

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
    /// [`SendOptions::ack_timeout`](super::SendOptions::ack_timeout)).
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
    /// connect request ([`wire::Knock`]) takes any unproven place at any age. So connections
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
    /// for a message out of place ([`ReceiverConfig::max_entries`]).
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
    /// ([`wire::caps::LANES`]), 1 ..= [`wire::MAX_LANES`]: a sender asking for more is granted
    /// this many; 1 grants no striping. Each extra lane is a connection to this server that
    /// presents the session's token (from its GRANT) and is taken only while its session
    /// lives; it costs a QP and `max_slots + 16` receives of 64 bytes.
    pub max_lanes: u16,
    /// The whole-file digest granted when the sender offers it (every sender offers
    /// XXH3-128; this crate's also offer XXH64). `None` (the default): the one that hashes
    /// faster on this CPU ([`fastest_digest`](super::fastest_digest), measured once per
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
            ack_timeout: super::link::ACK_TIMEOUT,
            wait: super::link::WAIT,
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
    /// Why, for a failure (at most [`wire::MAX_DETAIL_LEN`] bytes, as its ACK).
    pub detail: String,
    /// Bytes of it held.
    pub bytes: u64,
}

/// A listening receiver.
#[must_use = "dropping it at once releases what was just made"]
pub struct Server {
    listener: Listener,
    opts: Arc<ReceiveOptions>,
    /// Sessions past their HELLO (at most `max_sessions`).
    active: Arc<AtomicUsize>,
    /// Connections with a thread: `max_sessions + BUSY_SLACK` places, and those leaving
    /// after giving theirs to a newer connection.
    places: Arc<ConnectionPlaces>,
    /// Wrong proofs of the secret, by address.
    attempts: Arc<Attempts>,
    /// Connections, by address.
    per_address: Arc<PerAddress>,
    /// The knocks taken lately ([`super::knock`]): each vouches for one request.
    knocks: Knocks,
    /// The live sessions that granted lanes, by token: where an extra lane's connection
    /// request goes.
    routes: Arc<Routes>,
    /// The destination directory, open (`opts.dir`): every file is made relative to it.
    dest: Option<DirFd>,
    /// The partials kept for resumes, within their caps.
    partials: Arc<Ledger>,
}

/// The sessions waiting for (or served by) extra lanes, by their token.
#[derive(Default)]
struct Routes(std::sync::Mutex<std::collections::HashMap<[u8; wire::LANE_TOKEN_LEN], Route>>);

/// Where a session's extra lanes go.
struct Route {
    session: u64,
    /// Lanes granted.
    lanes: u16,
    /// Lanes handed over so far, by number (bit `n`): each at most once.
    taken: u32,
    /// The session's side of the hand-over.
    to: std::sync::mpsc::Sender<(u16, ConnectRequest)>,
    /// Rung with each lane handed over: the session's idle wait wakes for it.
    handed: Arc<Bell>,
}

/// Where a lane's request is handed to its session.
type HandOver = std::sync::mpsc::Sender<(u16, ConnectRequest)>;

/// A session's registration in [`Routes`]: removed when dropped (the session ended), so that
/// a lane arriving later names no live session.
struct RouteGuard {
    routes: Arc<Routes>,
    token: [u8; wire::LANE_TOKEN_LEN],
    /// The route's bell ([`Route::handed`]).
    handed: Arc<Bell>,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.token);
    }
}

impl Routes {
    /// Registers a session that granted `lanes` lanes with `token`; its lanes' requests come
    /// out of the returned receiver.
    fn register(
        self: &Arc<Self>,
        session: u64,
        lanes: u16,
        token: [u8; wire::LANE_TOKEN_LEN],
    ) -> (RouteGuard, std::sync::mpsc::Receiver<(u16, ConnectRequest)>) {
        let (to, from) = std::sync::mpsc::channel();
        let handed = Arc::new(Bell::new());
        let route = Route { session, lanes, taken: 1, to, handed: handed.clone() };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(token, route);
        (RouteGuard { routes: self.clone(), token, handed }, from)
    }

    /// Where a lane's request goes (its session's side of the hand-over), the lane marked as
    /// taken: `Err` with why when its token names no live session, the session is another, or
    /// the lane is not one granted or came already.
    fn take(&self, lane: wire::Lane, session: u64) -> Result<(HandOver, Arc<Bell>), String> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(route) = map.get_mut(&lane.token).filter(|r| r.session == session) else {
            return Err("a lane whose token names no live session".into());
        };
        let bit = 1u32.checked_shl(u32::from(lane.lane)).unwrap_or(0);
        if lane.lane == 0 || lane.lane >= route.lanes || route.taken & bit != 0 {
            return Err(format!("lane {} of {} granted, or one that came already", lane.lane, route.lanes));
        }
        route.taken |= bit;
        Ok((route.to.clone(), route.handed.clone()))
    }
}

/// Wrong proofs of the secret by address, for [`ReceiveOptions::auth_attempts`].
#[derive(Debug, Default)]
struct Attempts(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (Instant, u32)>>);

impl Attempts {
    /// Addresses remembered at most: past it, the one with the fewest wrong proofs is forgotten.
    /// Entries are pruned only then, not on every call (review L2: wrong proofs or LANE tokens
    /// from many addresses grew the map without bound, and every call, in the accept loop for
    /// LANEs, scanned all of it).
    const MOST: usize = 4096;

    /// Counts a wrong proof from `ip`; how long its answer is held back: nothing for the first
    /// `auth_attempts` within `auth_window`, then 1 s doubling, up to the time the bucket
    /// takes to refill one (`auth_window / auth_attempts`).
    fn wrong_proof(&self, ip: std::net::IpAddr, opts: &ReceiveOptions) -> Duration {
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MOST && !map.contains_key(&ip) {
            map.retain(|_, (since, _)| now.saturating_duration_since(*since) < opts.auth_window);
            // The address with the fewest wrong proofs goes (the oldest of them), never one that
            // is held back while others have fewer.
            let least = map.iter().min_by_key(|(_, (since, n))| (*n, *since)).map(|(ip, _)| *ip);
            if let (Some(least), true) = (least, map.len() >= Self::MOST) {
                map.remove(&least);
            }
        }
        let e = map.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(e.0) >= opts.auth_window {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
        let past = e.1.saturating_sub(opts.auth_attempts);
        if past == 0 {
            return Duration::ZERO;
        }
        let most = opts.auth_window / opts.auth_attempts.max(1);
        Duration::from_secs(1u64 << (past - 1).min(16)).min(most)
    }
}

/// A connection's places: among all connections, and among its address's.
type Places = (Place, AddressPlace);

/// Connections served beyond `max_sessions`: those waiting for their HELLO, or being told
/// `Busy` by ACK. Past that, a connection request takes the place of a connection that proved
/// nothing within `preempt_after` (`places`), or is rejected at once, with an ACK(Busy) as the
/// rejection's private data.
const BUSY_SLACK: usize = 4;

/// What the sessions of one `serve` call tell its accept loop.
#[derive(Debug)]
struct Tally {
    /// Transfers asked for: connections whose HELLO arrived.
    asked: AtomicUsize,
    /// Set once the loop takes no more transfers: connections still without a HELLO end.
    closing: Flag,
    /// Rung when a transfer is asked for: the accept loop, asleep until a request comes,
    /// looks at the count.
    changed: Bell,
}

impl Default for Tally {
    fn default() -> Self {
        Tally { asked: AtomicUsize::new(0), closing: Flag::new(), changed: Bell::new() }
    }
}

impl Tally {
    /// Whether `sessions` transfers were asked for (never, with `None`).
    fn enough(&self, sessions: Option<usize>) -> bool {
        sessions.is_some_and(|n| self.asked.load(Ordering::Acquire) >= n)
    }
}

impl Server {
    /// Listens on `addr` (an address of an RDMA device, or a wildcard).
    ///
    /// # Errors
    /// [`Error::Usage`] for options no session could be served with (a `max_chunk` of 0),
    /// before anything is bound; [`Error::Cm`] when binding or listening fails.
    pub fn bind(addr: SocketAddr, opts: ReceiveOptions) -> Result<Self, Error> {
        super::link::check_ack_timeout(opts.ack_timeout)?;
        if opts.max_chunk == 0 {
            return Err(Error::Usage("max_chunk 0: a chunk holds at least one byte".into()));
        }
        let dest = match &opts.dir {
            Some(dir) => Some(super::files::open_destination(dir).map_err(Error::Destination)?),
            None => None,
        };
        let partials = Arc::new(Ledger::new(opts.max_partials, opts.max_partial_bytes));
        if let Some(dir) = &dest {
            // Swept now: the sessions' opens sweep it again a minute from now at the earliest.
            partials.sweep_due(dir);
            partials.found(dir, super::files::sweep_partials(dir, opts.partial_ttl));
        }
        let places = ConnectionPlaces::new(opts.max_sessions.saturating_add(BUSY_SLACK), opts.preempt_after);
        Ok(Server {
            listener: Listener::bind(addr, 64)?,
            opts: Arc::new(opts),
            active: Arc::new(AtomicUsize::new(0)),
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
    /// In a runtime without IO and time enabled, as tokio's own types.
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
                    let fds = Wakes::new(self.listener.as_fd())
                        .and(self.opts.stop.fd())
                        .and(tally.changed.fd())
                        .and(self.places.ended_fd());
                    io.readable(fds.fds(), fds.until(Deadline::never())).await;
                    tally.changed.heard();
                    self.places.heard();
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
                report(reject(req, Status::Busy, "the receiver takes no more transfers".into()));
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
/// by rejecting that request, so that the others can be served (review L5: one such request
/// ended `serve`, and with it `rdma-copy recv`; a peer could bring it about by holding
/// connections until the receiver ran out of file descriptors). An error that consumed no
/// request (the device went away, the channel or the runtime failed) ends the loop, which
/// would otherwise meet it again at once.
fn ends_listening(e: &rdma_cm::Error) -> bool {
    !matches!(
        e,
        rdma_cm::Error::Cm { verb: "rdma_create_event_channel" | "fcntl(O_NONBLOCK)" | "rdma_migrate_id", .. }
            | rdma_cm::Error::Incomplete { .. }
            // librdmacm allocates each event it reads: under memory pressure the event stays
            // queued, and is read again after the pause (the last review, L7).
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
                    report(reject(req, Status::NotAuthorized, "its session ended".into()));
                }
            },
            Err(why) => {
                // A guessed token, on a receiver with a secret, counts as a wrong proof (it slows
                // the address's next wrong proofs); without a secret it costs only the connection.
                if self.opts.secret.is_some() {
                    let _ = self.attempts.wrong_proof(peer.ip(), &self.opts);
                }
                report(reject(req, Status::NotAuthorized, why));
            }
        }
        None
    }

    /// Takes a place for a connection request, or rejects it with `Busy` (reported): past its
    /// address's `max_per_address`, or past every connection limit. A request whose KNOCK
    /// proves the secret ([`super::knock`]) is proved from the start (`places.rs`), and is
    /// counted but not held back by its address's limit: an address is what a request says,
    /// and anyone who can use the sender's (a co-tenant of its host) could fill that limit
    /// with connections that prove nothing (a third review: four of them kept a secret holder
    /// out).
    fn admit(&self, req: ConnectRequest, report: &dyn Fn(ReceiveReport)) -> Option<(ConnectRequest, Places)> {
        let ip = req.peer_addr().ip();
        let secret = self.opts.secret.as_ref();
        let vouched = self.knocks.vouches(secret, req.private_data(), ip, req.local_addr(), SystemTime::now());
        let cap = if vouched { usize::MAX } else { self.opts.max_per_address.max(1) };
        let Some(mine) = self.per_address.enter(ip, cap) else {
            let why = format!("{} connections from this address already", self.opts.max_per_address.max(1));
            report(reject(req, Status::Busy, why));
            return None;
        };
        match self.places.take(Instant::now(), ip, vouched) {
            Some(place) => Some((req, (place, mine))),
            None => {
                report(reject(req, Status::Busy, format!("serving {} transfers", self.opts.max_sessions)));
                None
            }
        }
    }
}

/// Rejects a connection request with an ACK (session 0) as the rejection's private data.
fn reject(req: ConnectRequest, status: Status, detail: String) -> ReceiveReport {
    let peer = req.peer_addr();
    let ack = Message::Ack(Ack { status, received: 0, detail: detail.clone() });
    let mut bytes = Vec::new();
    let result = match wire::encode(0, &ack, &mut bytes) {
        Ok(()) => match req.reject(&bytes) {
            Ok(()) => Err(Error::Refused { status, detail }),
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(Error::Protocol(e.into())),
    };
    tracing::warn!(%peer, %status, "connection rejected");
    ReceiveReport { result, ..ReceiveReport::starting(peer) }
}

/// Serves one connection request to its end.
async fn receive<I: Io>(io: &I, req: ConnectRequest, shared: &Shared, place: &Place) -> ReceiveReport {
    let start = Instant::now();
    let mut report = ReceiveReport::starting(req.peer_addr());
    let result = session(io, req, shared, place, &mut report, start).await;
    report.ended(result, start)
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
    // A connection displaced before it is established ends now, not at the end of its accept
    // (review of the knock, M1: each never-completed request lingered `hello_timeout` among the
    // connections leaving, which held back knocked requests).
    let params = conn_params(opts.ack_timeout);
    let keep = || !place.displaced();
    let conn = io
        .accept(req, qp, &params, Deadline::after(hello_bound(opts)), Some(&keep))
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
                    break Err(e);
                }
            }
            Err(e) => break Err(e),
        }
    };
    let outcome = match outcome {
        Err(e) => Err(explain_loss(io, e, Side::Receiver, &conn, s.pd.context()).await),
        ok => ok,
    };
    let acked = s.machine.acked();
    let (sq, ring, slots, lanes, admitted) = s.end(&outcome);
    // One bound for the whole teardown, not one per lane: a peer that never disconnects holds
    // it `TEARDOWN_WAIT` at most, however many lanes it opened (the disconnects without an
    // ACK too: each was 1 s outside the bound, 17 s with 16 lanes; review finding G9).
    let teardown = Deadline::after(teardown_wait(opts, place));
    // An ACK must reach the sender before the connection goes: the sender reads it, then
    // disconnects. Without one there is nothing to wait for.
    let leave = |conn| async {
        if acked {
            io.wait_disconnected(conn, teardown).await;
        } else {
            io.disconnect(conn, teardown.min(Deadline::after(DISCONNECT_WAIT))).await;
        }
    };
    for RecvLane { conn, ring } in lanes {
        leave(conn).await;
        io.close_ring(ring).await;
    }
    io.close_queue(sq, teardown).await;
    leave(conn).await;
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

/// How long a new connection may take to be established: its HELLO's clock runs from its
/// request on (review H2: a peer that never completed the connection held its place for the
/// whole `accept_timeout` before that clock even started).
fn hello_bound(opts: &ReceiveOptions) -> Duration {
    opts.accept_timeout.min(opts.hello_timeout)
}

/// How long a session's teardown waits for its ACK to complete, and for the sender to
/// disconnect.
const TEARDOWN_WAIT: Duration = Duration::from_secs(5);

/// How long a session's teardown waits in all: [`TEARDOWN_WAIT`] (at most `timeout`), and not
/// at all for a connection that gave its place to a newer one: it proved nothing, and its
/// peer's pace must not keep it among the connections still leaving (review of H2).
fn teardown_wait(opts: &ReceiveOptions, place: &Place) -> Duration {
    if place.displaced() {
        Duration::ZERO
    } else {
        TEARDOWN_WAIT.min(opts.timeout)
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
        Outcome::Acked { status, detail } => Err(Error::Refused { status, detail }),
        Outcome::Failed(e) => Err(e.into()),
    }
}

/// One session's share of [`ReceiveOptions::memory_budget`]: the largest chunk it may be
/// granted and the budget of its ring. A session holds its ring (`slot_count × slot_size`,
/// within the ring's budget) and one slot-sized copy buffer; the two together stay within
/// `memory_budget / max_sessions`, so all sessions together stay within `memory_budget`. The
/// chunk is at most half the share, so that a ring of at least one slot fits beside its copy.
fn session_memory(opts: &ReceiveOptions) -> (u32, u64) {
    let share = opts.memory_budget / opts.max_sessions.max(1) as u64;
    let chunk = u64::from(opts.max_chunk).min(share / 2).max(1);
    (chunk as u32, share.saturating_sub(chunk).max(chunk))
}

/// What a server's sessions share with it: the options, the count of sessions past their
/// HELLO, the accept loop's tally, and the routes of extra lanes.
struct Shared {
    opts: Arc<ReceiveOptions>,
    active: Arc<AtomicUsize>,
    tally: Arc<Tally>,
    routes: Arc<Routes>,
    /// The destination directory, open (`opts.dir`): every file is made relative to it.
    dest: Option<DirFd>,
    /// Wrong proofs of the secret, by address.
    attempts: Arc<Attempts>,
    /// The partials kept for resumes.
    partials: Arc<Ledger>,
}

/// What a session's teardown releases, in order: its send queue, its receive ring (the QP's
/// last handle), the peer-writable slots (after the QP is gone), and its extra lanes.
/// What a session's teardown releases, in order: the queues, then the granted slots, then its
/// place among `max_sessions` (whose memory share the slots are).
type Teardown = (SendQueue<'static, Rc>, RecvRing<'static>, Vec<Slot<'static>>, Vec<RecvLane>, Option<Counted>);

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
    /// The answer to a wrong proof, held back until then ([`Attempts::wrong_proof`]); set once
    /// the wrong proof was counted.
    tarpit: Option<Option<Instant>>,
    /// This connection's place among all connections: proved at admission, and until then
    /// one a newer connection may take ([`Place::displaced`]).
    place: &'a Place,
    active: &'a Arc<AtomicUsize>,
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
    /// This session's place among `max_sessions`, from its valid HELLO on.
    admitted: Option<Counted>,
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
            digest: opts.digest.unwrap_or_else(super::fastest_digest),
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
            machine: Receiver::new(cfg, start).with_nonce(super::random_bytes()).with_lane_token(super::random_bytes()),
            pd,
            control,
            sq,
            ring,
            admitted: None,
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
        let acted = match self.drive_actions(conn)? {
            ControlFlow::Break(o) => return Ok(ControlFlow::Break(o)),
            ControlFlow::Continue(acted) => acted,
        };
        let arrived = self.drive_arrivals()?;
        let completed = self.drive_completions()?;
        Ok(ControlFlow::Continue(acted || arrived || completed))
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
            ..
        } = self;
        // No lane is taken any more.
        drop(route);
        let lanes = lanes.into_iter().flatten().collect();
        // A partial outlives a session that ended in a way a resume can follow: the peer or the
        // path went, the peer went silent, the receiver stopped, a message was changed on the
        // path (review R7: that ended it as a violation, and threw the partial away). One that broke the rules or
        // failed its digest goes (as does everything of a session that was not resumable).
        let resumable = matches!(
            outcome,
            Err(Error::PeerDisconnected | Error::ConnectionLost { .. } | Error::Stopped)
                | Ok(Outcome::Failed(
                    crate::ProtocolError::Timeout { .. }
                        | crate::ProtocolError::TooSlow { .. }
                        | crate::ProtocolError::CompletedTwice { .. }
                        | crate::ProtocolError::Unsealed
                ))
        );
        let midway = file.is_some();
        if let Some(mut f) = file {
            // A partial that holds nothing is worth nothing: it goes.
            if resumable && machine.bytes_stored() > 0 {
                // A session that added no byte to what it resumed from leaves the sidecar as it
                // was: rewritten, its time would keep a partial that no attempt gets past from
                // ever expiring (review finding G4).
                let added = machine.bytes_stored() > machine.resumed_from();
                partials.keep(&mut f, machine.bytes_stored(), added);
            } else if resumable && f.vouched() > 0 {
                // Ended before its hash found anything to resume from (a stop, a read error):
                // the partial stays as its sidecar left it (review H11: it was thrown away,
                // however much it held).
                let vouched = f.vouched();
                partials.keep(&mut f, vouched, false);
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
                        let hold = self.attempts.wrong_proof(self.peer, self.opts);
                        self.tarpit = Some((!hold.is_zero()).then(|| Instant::now() + hold));
                        if !hold.is_zero() {
                            tracing::info!(peer = %self.peer, ?hold, "a wrong proof of the secret: its answer held back");
                            return Ok(ControlFlow::Continue(true));
                        }
                    }
                    send_control(&mut self.sq, &self.control, &self.out, self.opts.timeout, drop)?;
                }
                Action::StoreChunk { seq, slot, offset, len } => self.store(seq, slot, offset, len),
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
    /// (review H5: the time the open began made a long open or hash the sender's time).
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
        if let Err(why) = self.admit() {
            return self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now());
        }
        if let Some(dir) = self.dest {
            if !self.open_file(dir, &name, &name, size, conn) {
                return;
            }
        }
        self.register(slot_size, slot_count, now);
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

    /// Admits the session: it takes one of `max_sessions`; `Err` with why (`Busy`) when they
    /// are all taken.
    fn admit(&mut self) -> Result<(), String> {
        self.admitted = Counted::enter(self.active, self.opts.max_sessions);
        match self.admitted {
            Some(_) => Ok(()),
            None => Err(format!("already serving {} transfers", self.opts.max_sessions)),
        }
    }

    /// A batch: admits the session and registers its ring (`Action::Reserve`).
    fn reserve(&mut self, slot_size: u32, slot_count: u32) {
        let now = Instant::now();
        let session = self.machine.session();
        self.report.session = session;
        self.report.name = Some(wire::BATCH_NAME.into());
        tracing::info!(session = format_args!("{session:016x}"), slot_size, slot_count, "receiving a batch");
        if let Err(why) = self.proved().and_then(|()| self.admit()) {
            return self.machine.handle(Input::OpenFailed(Status::Busy, why), Instant::now());
        }
        self.register(slot_size, slot_count, now);
    }

    /// A batch's entry (`Action::OpenEntry`): its parent directories made under the
    /// destination, then its file opened as a single file's, or the directory made.
    fn open_entry(&mut self, e: Entry, conn: &rdma_cm::Connection<'static>) {
        let Some((addr, rkey)) = self.ring_at else {
            return self.machine.handle(Input::OpenFailed(Status::Internal, "no ring".into()), Instant::now());
        };
        self.file = None;
        self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
        let directory = e.kind == EntryKind::Directory;
        if let Some((status, why)) = self.judge(&e.path, directory, e.size, true) {
            return self.machine.handle(Input::OpenFailed(status, why), Instant::now());
        }
        let mut parent = None;
        if let Some(dest) = self.dest {
            let path = e.path.clone();
            let Ok(components) = crate::name::check_path(&path) else {
                return self.machine.handle(Input::OpenFailed(Status::BadName, path), Instant::now());
            };
            let (last, parents) = components.split_last().expect("a path has a component");
            let dir = match make_dirs(dest, parents, &mut self.made_dirs) {
                Ok(d) => d,
                Err((status, why)) => return self.machine.handle(Input::OpenFailed(status, why), Instant::now()),
            };
            match e.kind {
                EntryKind::Directory => {
                    let made = make_dir_entry(&dir, last, &e, &mut self.made_dirs);
                    if let Err((status, why)) = made {
                        return self.machine.handle(Input::OpenFailed(status, why), Instant::now());
                    }
                }
                EntryKind::File => {
                    if !self.open_file(&dir, last, &e.path, e.size, conn) {
                        return;
                    }
                }
            }
            parent = Some(dir);
        }
        self.entry = Some((e, parent));
        self.machine.handle(Input::Ready { addr, rkey }, Instant::now());
    }

    /// Asks the embedder's policy about an offer; the refusal, if it refuses.
    fn judge(&self, path: &str, directory: bool, size: u64, in_batch: bool) -> Option<(Status, String)> {
        let policy = self.opts.policy.as_ref()?;
        let authenticated = self.opts.secret.is_some() && self.machine.authorized();
        policy.judge(&Offer { peer: self.report.peer, authenticated, path, directory, size, in_batch })
    }

    /// The key this session's partial is stored under: the sender's resume key, or with a
    /// secret its keyed derivation ([`Secret::partial_key`]); `None` without resuming.
    fn partial_key(&self) -> Option<u64> {
        let key = self.machine.resume_key()?;
        Some(self.opts.secret.as_ref().map_or(key, |s| s.partial_key(key)))
    }

    /// Opens the temporary (or the resumable partial) of `name` in `dir` (`rel` under the
    /// destination), and tells the machine what a partial holds; `false` when it failed (the
    /// machine was told).
    fn open_file(
        &mut self,
        dir: &DirFd,
        name: &str,
        rel: &str,
        size: u64,
        conn: &rdma_cm::Connection<'static>,
    ) -> bool {
        let session = self.machine.session();
        {
            let plain = || Incoming::create(dir, name, rel, session, self.opts.overwrite).map(|f| (f, 0));
            let opened = match self.partial_key() {
                Some(key) => {
                    let sweep = self.partials.sweep_due(dir).then_some(self.opts.partial_ttl);
                    match Incoming::resumable(dir, name, rel, size, key, self.opts.overwrite, sweep) {
                        // Its partial is still held (a session of this file whose sender was killed
                        // a moment ago has not ended yet), or something the receiver cannot remove
                        // is at its name (review L6: a local user's directory, in a sticky
                        // destination, failed every send of the file): served from the start in
                        // a plain temporary rather than refused. A refusal that is the file's
                        // (it exists) or the disk's comes again from the plain temporary.
                        Err((status, why)) => {
                            tracing::debug!(session = format_args!("{session:016x}"), %name, %status, %why, "not resumable");
                            plain()
                        }
                        r => r,
                    }
                }
                None => plain(),
            };
            match opened {
                Ok((f, held)) => {
                    if let (Some(key), true) = (self.partial_key(), f.is_partial()) {
                        // A session's own again: out of the ledger until it is kept again.
                        self.partials.take(dir, key);
                    }
                    let held = self.hash_held(&f, held, conn);
                    self.file = Some(f);
                    if self.partial_key().is_some() {
                        if held > 0 {
                            tracing::info!(session = format_args!("{session:016x}"), %name, held, "resuming");
                        }
                        self.machine.handle(Input::Resumed { from: held }, Instant::now());
                    }
                }
                Err((status, why)) => {
                    self.machine.handle(Input::OpenFailed(status, why), Instant::now());
                    return false;
                }
            }
        }
        true
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
        self.machine.handle(Input::Ready { addr: remote.addr, rkey: remote.rkey }, Instant::now());
    }

    /// Hashes the first `held` bytes of a partial (the digest covers every byte of the file,
    /// those of earlier sessions too); returns how many it hashed: `held`, or 0 when reading
    /// them failed (the transfer then starts over).
    ///
    /// The sender waits for the GRANT meanwhile, and then hashes as much of its own file before
    /// its first chunk: so only what hashes within a third of `timeout` is used (the rest is
    /// sent again and written over), and the hash stops when the receiver is stopped or the peer
    /// leaves. A 20 GB
    /// partial at the VM's 32 MB/s of keyed BLAKE3 took 10 minutes, and every attempt to resume
    /// it timed out (review finding G4).
    fn hash_held(&mut self, f: &Incoming, held: u64, conn: &rdma_cm::Connection<'static>) -> u64 {
        let mut buf = vec![0u8; (1 << 20).min(held as usize)];
        let mut at = 0u64;
        let budget = Deadline::after(self.opts.timeout / 3);
        if held > 0 {
            tracing::info!(held, "hashing the bytes a partial holds, to resume it");
        }
        while at < held {
            // Whether the peer left is asked every 16 MiB (a read of the CM channel that does
            // not block): a peer that offers a resume and leaves costs the receiver no more
            // hashing than it stays connected for (review R2).
            let gone = at % (16 << 20) == 0 && at > 0 && peer_left(conn).unwrap_or(true);
            if gone || budget.has_passed() || self.opts.stop.is_set() {
                tracing::info!(held, hashed = at, gone, "resuming from what was hashed in time");
                return at;
            }
            let n = (held - at).min(buf.len() as u64) as usize;
            if f.file.read_exact_at(&mut buf[..n], at).is_err() {
                self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
                return 0;
            }
            self.hasher.update(&buf[..n]);
            at += n as u64;
        }
        held
    }

    /// Takes chunk `seq` out of its slot, hashes and stores it (`Action::StoreChunk`).
    fn store(&mut self, seq: u64, slot: u32, offset: u64, len: u32) {
        let now = Instant::now();
        // The slot is writable by the peer: copy it out once (no reference to it is made),
        // then hash and store that copy, so the bytes hashed are the bytes stored whatever the
        // peer does meanwhile.
        let Some(copy) = self.copy.as_mut() else {
            let why = "a chunk arrived before its ring was registered".to_owned();
            return self.machine.handle(Input::StoreFailed(Status::Internal, why), now);
        };
        let buf = &mut copy.as_mut_slice()[..len as usize];
        if let Err(e) = self.slots[slot as usize].read_at(0, buf) {
            return self.machine.handle(Input::StoreFailed(Status::Internal, e.to_string()), now);
        }
        #[cfg(feature = "fault-injection")]
        if self.opts.corrupt_chunk == Some(seq) && !buf.is_empty() {
            buf[0] ^= 0xff;
        }
        self.hasher.update(buf);
        if let Some(f) = &self.file {
            if let Err(e) = f.file.write_all_at(buf, offset) {
                let why = format!("writing at {offset}: {e}");
                return self.machine.handle(Input::StoreFailed(io_status(&e), why), now);
            }
        }
        self.last_stored = Some(Instant::now());
        self.machine.handle(Input::ChunkStored { seq }, now);
        if let Some(p) = &self.opts.progress {
            let name = match &self.entry {
                Some((e, _)) => e.path.as_str(),
                None => self.report.name.as_deref().unwrap_or(""),
            };
            let (session, size) = (self.machine.session(), self.machine.size());
            p.call(&ProgressEvent { session, name, done: self.machine.bytes_stored(), size });
        }
        // A partial vouches for what it holds every `checkpoint_every` bytes, so that a
        // receiver killed outright (SIGKILL, a crash) loses at most that much.
        let held = self.machine.bytes_stored();
        let every = self.opts.checkpoint_every.max(1);
        if let Some(f) = self.file.as_ref().filter(|f| f.is_partial()) {
            if held / every != held.saturating_sub(u64::from(len)) / every {
                let _ = f.checkpoint(held);
            }
        }
    }

    /// Checks the digest, syncs and renames the file into place (`Action::Finalize`).
    fn finalize(&mut self, digest: &[u8]) {
        let now = Instant::now();
        self.data_end = Some(now);
        let ours = self.hasher.finish();
        self.report.phases.digest = now.elapsed(); // the hashing itself ran with the data
        let (status, why) = if ours[..] != digest[..] {
            (Status::ChecksumMismatch, "the data does not match the sender's digest".to_owned())
        } else if let Some(f) = self.file.take() {
            let t = Instant::now();
            let partial = f.is_partial();
            let r = f.commit(self.entry.as_ref().map(|(e, _)| e));
            self.report.phases.sync_rename = t.elapsed();
            match r {
                Ok(()) => {
                    // Served from the start while its partial was held: that partial, once
                    // free, is of a file now in place (unless it is of another file).
                    let dir = self.entry.as_ref().and_then(|(_, d)| d.as_ref()).or(self.dest);
                    let (rel, size) = match &self.entry {
                        Some((e, _)) => (e.path.as_str(), e.size),
                        None => (self.report.name.as_deref().unwrap_or_default(), self.machine.size()),
                    };
                    // Out of the ledger only when removed: another file's partial under the key
                    // stays within the caps (review R4).
                    if let (false, Some(key), Some(dir)) = (partial, self.partial_key(), dir) {
                        if super::files::drop_partial(dir, key, rel, size) {
                            self.partials.take(dir, key);
                        }
                    }
                    (Status::Ok, String::new())
                }
                Err((status, why)) => (status, why),
            }
        } else {
            (Status::Ok, String::new())
        };
        self.machine.handle(Input::Finalized(status, why), Instant::now());
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
            let conn = io.accept(req, qp, &params, Deadline::after(self.opts.accept_timeout), None).await?;
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
        let until = self.next_deadline();
        let handed = self.route.as_ref().map(|(route, _)| &*route.handed);
        let wakes = session_wakes(conn, self.opts, self.place, self.machine.hello_received(), self.tally, handed);
        let due = self.pacer.round(io, progressed, cqs.as_slice(), until, &wakes).await?;
        self.drive_slow_checks(due, conn)
    }

    /// When the session must look at its clock next: the machine's deadline, a held-back
    /// answer, the test flood's next message.
    fn next_deadline(&self) -> Deadline {
        let at = |t: Option<Instant>| t.map_or(Deadline::never(), Deadline::at);
        let mut until = at(self.machine.poll_timeout());
        if let Some(Some(tarpit)) = self.tarpit {
            until = until.min(Deadline::at(tarpit));
        }
        #[cfg(feature = "fault-injection")]
        if let Some(last) = self.flood {
            until = until.min(Deadline::at(last + FLOOD_EVERY));
        }
        until
    }

    /// When `due`: the machine's timeout, whether the peer left, whether the receiver stops.
    fn drive_slow_checks(&mut self, due: bool, conn: &rdma_cm::Connection<'static>) -> Result<(), Error> {
        if due {
            self.machine.handle_timeout(Instant::now());
            if peer_left(conn)? {
                return Err(Error::PeerDisconnected);
            }
            if self.opts.stop.is_set() {
                return Err(Error::Stopped);
            }
            if let Some((route, _)) = &self.route {
                // The lanes handed over are taken by the next round.
                route.handed.heard();
            }
            if self.place.displaced() {
                // Not proved in `preempt_after`, with every place taken: a newer connection
                // has this one's place.
                return Err(Error::Preempted);
            }
            if !self.machine.hello_received() && self.tally.closing.is_set() {
                // The server took the transfers it serves; this connection asked for none.
                return Err(Error::Stopped);
            }
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
    if let (fd, true) = place.displaced_fd() {
        wakes = wakes.and(fd);
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
const FLOOD_EVERY: Duration = Duration::from_millis(1);

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

    /// Review L2: the wrong proofs of many addresses are remembered up to a bound, while each
    /// address's own count still holds its answers back.
    #[test]
    fn wrong_proofs_from_many_addresses_are_remembered_up_to_a_bound() {
        use std::net::{IpAddr, Ipv6Addr};
        use std::time::Duration;
        let (attempts, opts) = (super::Attempts::default(), super::ReceiveOptions::default());
        let ip = |n: u32| IpAddr::V6(Ipv6Addr::from(u128::from(n)));
        for n in 0..super::Attempts::MOST as u32 + 100 {
            assert_eq!(attempts.wrong_proof(ip(n), &opts), Duration::ZERO);
        }
        assert_eq!(attempts.0.lock().unwrap().len(), super::Attempts::MOST);
        let me = ip(u32::MAX);
        let holds: Vec<_> = (0..opts.auth_attempts + 2).map(|_| attempts.wrong_proof(me, &opts)).collect();
        let allowed = opts.auth_attempts as usize;
        assert!(holds[..allowed].iter().all(|h| h.is_zero()), "{holds:?}");
        assert_eq!(holds[allowed..], [Duration::from_secs(1), Duration::from_secs(2)]);
        assert!(attempts.0.lock().unwrap().len() <= super::Attempts::MOST);
        // A flood from as many new addresses does not make it forget the one held back.
        for n in 0..super::Attempts::MOST as u32 {
            attempts.wrong_proof(ip(1 << 20 | n), &opts);
        }
        assert_eq!(attempts.wrong_proof(me, &opts), Duration::from_secs(4));
    }
}
