//! [`send_file`]: connect to a receiver and send one file.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rdma_verbs::{
    AccessFlags, Deadline, ProtectionDomain, Rc, RecvRing, RemoteRegion, SendQueue, Slot, SlotPool, SlotRequest,
    WcStatus,
};

use super::digest::Hasher;
use super::flag::Flag;
#[cfg(feature = "tokio")]
use super::io::Tokio;
use super::io::{block_on, Blocking, Io, Wakes};
use super::link::{
    conn_params, explain_loss, peer_left, send_control, take_arrivals, Endpoint, EndpointParts, LaneBase, Pacer,
    SessionCqs, Side, CONTROL_WR_ID, DISCONNECT_WAIT, DRAIN,
};
use super::retry::{Attempt, Retries};
use super::{Error, Phases};
use crate::sender::{Action, Input, Sender, SenderConfig};
use crate::wire::{self, Message};
use crate::{Digest, Outcome, ProtocolError, Status};

/// How to send. Made by [`new`](Self::new) (it is `#[non_exhaustive]`: fields may be added),
/// then changed field by field.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SendOptions {
    /// The receiver's address.
    pub to: SocketAddr,
    /// The local address to send from (picks the RDMA device); `None`: the route decides.
    pub from: Option<SocketAddr>,
    /// The name the receiver stores the file under (default: the file's own name).
    pub name: Option<String>,
    /// Bytes per chunk (one WRITE).
    pub chunk: u32,
    /// Chunks in flight.
    pub depth: u32,
    /// Bound on address/route resolution and the connection handshake.
    pub connect_timeout: Duration,
    /// How long a phase may make no progress.
    pub timeout: Duration,
    /// The QP's local ACK timeout, an exponent: a WRITE not acknowledged within 4.096 µs ×
    /// 2^`ack_timeout` is sent again (1..=31; the default's reason: [`docs/protocol.md`,
    /// "Recovery under loss"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#recovery-under-loss)).
    pub ack_timeout: u8,
    /// How the session's loop waits for completions once a round made no progress: by
    /// default it sleeps on the CQs' channel at once ([`rdma_verbs::WaitPolicy::sleep_at_once`]; why:
    /// [`docs/protocol.md`, "Speed, and the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)). A spin budget
    /// ([`rdma_verbs::WaitPolicy::spin_then_sleep`]) trades a core for the wake-up latency.
    pub wait: rdma_verbs::WaitPolicy,
    /// [Set](Flag::set) it to cancel the send: it ends with [`Error::Cancelled`] at the end
    /// of the current round (a session asleep wakes at once; a wait between retries too) once
    /// connected (connecting itself is bounded by `connect_timeout`), and the receiver keeps
    /// what it stored for a resume. Another thread or task can set it.
    pub cancel: Flag,
    /// Keep each file's and directory's permission bits and modification time on the receiver
    /// ([`send_files`] only).
    pub preserve: bool,
    /// Offer to resume: a receiver holding the first bytes of this version of the file (from
    /// an interrupted transfer) is sent only the rest. The version is the file's name, size,
    /// device, inode and modification time; the whole-file digest covers every byte either way.
    pub resume: bool,
    /// The shared secret, if any ([`crate::auth`]): proven to a receiver that requires it,
    /// and data goes only to a receiver that proves it too. Load it from a file or the
    /// environment ([`Secret::new`](crate::auth::Secret::new)), never from a command line.
    pub secret: Option<crate::auth::Secret>,
    /// Connections (lanes) to stripe the chunks over, 1 ..= [`wire::MAX_LANES`]: a receiver
    /// that takes striping ([`wire::caps::LANES`]) grants at most this many, and chunk `n`
    /// goes on lane `n % lanes`; one that does not is sent everything on one connection.
    /// Each extra lane is another connection to the receiver, made after its GRANT within
    /// `connect_timeout`, presenting the GRANT's token.
    pub lanes: u16,
    /// How many times a send whose connection failed mid-session ([`Error::is_transient`]:
    /// the peer disconnected, or the connection was lost) is made again, after a wait of 0.5 s
    /// that doubles each time (at most 4 s); the receiver then resumes it where it kept data
    /// (with [`resume`](Self::resume)). A retry that cannot connect (the receiver restarting)
    /// uses up a retry too; if the last one cannot, the send ends with the error that started
    /// the retries. A verdict is never retried; a retry told `Exists` says that the failed
    /// attempt may have stored the file. Default 0: [`send_file`] reports the first failure.
    /// [`send_files`] does not retry. The rules: [`docs/protocol.md`, "Resuming"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#resuming-capability-resume).
    pub retries: u32,
    /// Test hook: offer these protocol versions and send the name unchecked.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_offer: Option<std::ops::RangeInclusive<u16>>,
    /// Test hook: a hostile sender that follows its FIN at once with this (to prove the
    /// receiver's verdict still matches its disk).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_after_fin: Option<AfterFin>,
    /// Test hook: use this session id instead of a random one (to prove two senders with the
    /// same id are both served).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_session: Option<u64>,
    /// Test hook: extra lanes present this token instead of the GRANT's (to prove the
    /// receiver refuses them).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_lane_token: Option<[u8; wire::LANE_TOKEN_LEN]>,
    /// Test hook: connecting the extra lanes takes this much longer (within `connect_timeout`),
    /// as when a CM message is lost and resent (to prove it does not count against `timeout`).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_lane_delay: Option<Duration>,
    /// Test hook: an on-path forger. Chunk N's first byte is changed after it was hashed
    /// (as a rewrite on the wire would change it), and the FIN carries the digest of what was
    /// sent, computed without the secret (to prove a keyed digest fails the verdict).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_tamper: Option<u64>,
    /// Test hook: a trickling sender, that waits this long before reading each chunk (to prove
    /// the receiver's pace floor, `ReceiveOptions::min_rate`, ends it).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_chunk_delay: Option<Duration>,
}

/// What a hostile test sender sends right after its FIN ([`SendOptions::test_after_fin`]).
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFin {
    /// Bytes that decode as no message.
    Junk,
    /// The FIN again.
    SecondFin,
    /// A WRITE with immediate into slot 0, tagged as the chunk after the last.
    Write,
}

impl SendOptions {
    /// Defaults for sending to `to`: 512 KiB chunks, 4 in flight, one lane (each chosen by
    /// measurement: [`docs/protocol.md`, "Speed, and the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)), 10 s to connect, 30 s
    /// without progress.
    pub fn new(to: SocketAddr) -> Self {
        SendOptions {
            to,
            from: None,
            name: None,
            chunk: 512 << 10,
            depth: 4,
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            ack_timeout: super::link::ACK_TIMEOUT,
            wait: super::link::WAIT,
            cancel: Flag::new(),
            resume: true,
            preserve: false,
            secret: None,
            lanes: 1,
            retries: 0,
            #[cfg(feature = "fault-injection")]
            test_offer: None,
            #[cfg(feature = "fault-injection")]
            test_after_fin: None,
            #[cfg(feature = "fault-injection")]
            test_session: None,
            #[cfg(feature = "fault-injection")]
            test_lane_token: None,
            #[cfg(feature = "fault-injection")]
            test_lane_delay: None,
            #[cfg(feature = "fault-injection")]
            test_tamper: None,
            #[cfg(feature = "fault-injection")]
            test_chunk_delay: None,
        }
    }
}

/// What a finished send did.
#[derive(Debug, Clone)]
pub struct SendReport {
    /// The session id.
    pub session: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Chunk size and depth the receiver granted.
    pub chunk: u32,
    /// Slots the receiver granted.
    pub slots: u32,
    /// Time per phase.
    pub phases: Phases,
    /// Wall time from start to ACK.
    pub total: Duration,
    /// Bytes the receiver already held (an interrupted transfer resumed): not sent again.
    pub resumed_from: u64,
    /// Connections the chunks went over (1 when the receiver does not stripe).
    pub lanes: u16,
    /// The whole-file digest the receiver chose ([`ReceiveOptions::digest`](super::ReceiveOptions::digest)).
    pub digest: Digest,
    /// Attempts that failed before this one succeeded ([`SendOptions::retries`]); the other
    /// fields are of the attempt that succeeded.
    pub retries: u32,
}

/// Sends `path` to a receiver; `progress(bytes_written, total)` is called as chunks complete
/// (after a retry, [`SendOptions::retries`], from where the receiver resumed it: it may go
/// back). Blocks the calling thread; `send_file_async` (feature `tokio`) is the same transfer
/// for async code.
///
/// # Errors
/// [`Error::Refused`] with the receiver's status when it did not store the file; otherwise
/// the connection, file, protocol or timeout error; [`Error::Cancelled`] once
/// [`SendOptions::cancel`] is set. After retries that could not connect, the error that
/// started them.
pub fn send_file(path: &Path, opts: &SendOptions, progress: impl FnMut(u64, u64)) -> Result<SendReport, Error> {
    block_on(send_with(&Blocking, path, opts, progress))
}

/// [`send_file`] for async code (feature `tokio`): the same session, its waits awaited on the
/// tokio reactor instead of blocking the thread (the connection steps, and an idle round's
/// sleep on the CQs' completion channel). Many transfers can run on one runtime, a task each;
/// no thread is started.
///
/// What still blocks the task briefly: reading the file (`pread`, from the page cache in the
/// common case). The teardown does not block: the drains are awaited and the drops that wait
/// for the device run on tokio's blocking pool (`close_async`).
///
/// Cancellation: dropping the future abandons the transfer (the receiver discards it, as for a
/// killed sender); the queues are then dropped in place, which may block the thread for the
/// drain timeout.
///
/// # Errors
/// As [`send_file`]; [`Error::Verbs`]/[`Error::Cm`] with `NoRuntime` outside a tokio runtime.
///
/// # Panics
/// In a runtime without IO and time enabled, as tokio's own types.
#[cfg(feature = "tokio")]
pub async fn send_file_async(
    path: &Path,
    opts: &SendOptions,
    progress: impl FnMut(u64, u64),
) -> Result<SendReport, Error> {
    send_with(&Tokio, path, opts, progress).await
}

/// Sends `path` with its retries: the one body of [`send_file`] and `send_file_async`.
async fn send_with<I: Io>(
    io: &I,
    path: &Path,
    opts: &SendOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<SendReport, Error> {
    let mut retries = Retries::new(opts);
    loop {
        let start = Instant::now();
        let retry = retries.options(opts);
        let opts_now = retry.as_ref().unwrap_or(opts);
        let attempt = match SourceFile::open(path, opts_now) {
            Err(e) => Attempt::Done(Err(e)),
            Ok(file) => attempt_of(run(io, path, file, None, opts_now, &mut progress, start).await, retries.made()),
        };
        match retries.after(attempt, opts) {
            Ok(wait) => super::retry::sleep(io, wait, opts).await?,
            Err(result) => return result,
        }
    }
}

/// How one attempt of a send ended, for the retry rule: `ran` is what [`run`] returned,
/// `made` the retries before it.
fn attempt_of(ran: Result<Ran, Error>, made: u32) -> Attempt<SendReport> {
    match ran {
        Err(e) => Attempt::ConnectFailed(e),
        Ok((outcome, summary, _)) => match summary.report(outcome) {
            Err(e) => Attempt::SessionFailed(e),
            Ok(report) => Attempt::Done(Ok(SendReport { retries: made, ..report })),
        },
    }
}

/// A session that ran: its outcome, its summary, and a batch's state.
type Ran = (Result<Outcome, Error>, SendSummary, Option<BatchState>);

/// The connection parameters of a session's first connection: with a secret, its KNOCK as
/// the private data ([`super::knock`]), so that a receiver whose places are all taken by
/// connections that proved nothing gives it one of theirs.
fn first_params<'a>(opts: &SendOptions, knock: Option<&'a [u8]>) -> rdma_cm::ConnParams<'a> {
    let params = conn_params(opts.ack_timeout);
    match knock {
        Some(knock) => params.private_data(knock),
        None => params,
    }
}

/// Connects, drives the session to its end and tears the connection down: what a send of a
/// file or a batch does, blocking or async. `Err` when no session started (connecting failed).
async fn run<I: Io>(
    io: &I,
    path: &Path,
    file: SourceFile,
    batch: Option<BatchState>,
    opts: &SendOptions,
    mut progress: impl FnMut(u64, u64),
    start: Instant,
) -> Result<Ran, Error> {
    // Connect, with the receive ring posted before the peer can send; `connect_timeout`
    // bounds the whole of it, not each step, and its end is said as the caller's bound, not as
    // what was left of it.
    super::link::check_ack_timeout(opts.ack_timeout)?;
    let deadline = Deadline::after(opts.connect_timeout);
    let after = opts.connect_timeout;
    let timed_out = |e: rdma_cm::Error| match e.is_timeout() {
        true => Error::from(rdma_cm::Error::Timeout { what: "connecting", device: None, after }),
        false => refusal(e),
    };
    let id = io.resolve(opts.from, opts.to, deadline).await.map_err(timed_out)?;
    let ctx = id.open_context()?;
    let ep = Endpoint::new(ctx, opts.depth, 32, |qp| id.init_qp(qp, AccessFlags::LOCAL_WRITE))?;
    let (qp, parts) = ep.split();
    let knock =
        opts.secret.as_ref().map(|s| super::knock::knock(s, SystemTime::now(), id.local_addr().ip(), id.peer_addr()));
    let conn = io.connect(id, qp, &first_params(opts, knock.as_deref()), deadline).await.map_err(timed_out)?;
    let mut s = SendSession::new(opts, path, file, parts, &conn, start)?;
    s.batch = batch;
    let outcome = loop {
        match s.drive_round(&mut progress) {
            Ok(ControlFlow::Break(o)) => break o,
            Ok(ControlFlow::Continue(progressed)) => {
                if let Err(e) = s.connect_lanes(io).await {
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
        Err(e) => Err(explain_loss(io, e, Side::Sender, &conn, s.pd.context()).await),
        ok => ok,
    };
    let (sq, ring, summary, batch, lanes) = s.into_parts();
    tracing::debug!(ok = outcome.is_ok(), after = ?start.elapsed(), "session over; tearing down");
    // Let the last sends complete before the connections go. The peer's answer to the
    // disconnect only confirms what is already decided; a peer that withholds it (measured: a
    // never-ACKing receiver held a timed-out sender 10 s here) must not delay the exit. The
    // connection is torn down either way.
    let goodbye = || Deadline::after(DISCONNECT_WAIT.min(opts.connect_timeout));
    io.close_queue(sq, Deadline::after(DRAIN)).await;
    for SendLane { conn, sq } in lanes {
        io.close_queue(sq, Deadline::after(DRAIN)).await;
        io.disconnect(conn, goodbye()).await;
    }
    io.disconnect(conn, goodbye()).await;
    io.close_ring(ring).await;
    Ok((outcome, summary, batch))
}

/// The file to send, opened and checked, and the machine made for it (for a batch: no file
/// yet, and the batch's machine).
struct SourceFile {
    file: Option<std::fs::File>,
    size: u64,
    session: u64,
    machine: Sender,
    identity: Identity,
}

impl SourceFile {
    fn open(path: &Path, opts: &SendOptions) -> Result<Self, Error> {
        let name = match &opts.name {
            Some(n) => n.clone(),
            None => match path.file_name().map(|n| n.to_str()) {
                Some(Some(n)) => n.to_owned(),
                Some(None) => {
                    return Err(Error::Usage(format!("{}: the file name is not UTF-8: give a name", path.display())))
                }
                None => return Err(Error::Usage(format!("{}: no file name: give a name", path.display()))),
            },
        };
        let offer = offered_versions(opts);
        if offer.is_none() {
            crate::name::check(&name).map_err(|why| Error::Usage(format!("{name:?}: {why}")))?;
        }
        let (file, meta) = open_regular(path)?;
        let size = meta.len();
        let session = test_session(opts).unwrap_or_else(session_id);
        let mut cfg = SenderConfig::new(opts.chunk, opts.depth, opts.timeout);
        cfg.secret = opts.secret.clone();
        cfg.lanes = opts.lanes;
        cfg.resume_key = opts.resume.then(|| resume_key(&name, &meta));
        let machine = match offer {
            None => Sender::new(session, &name, size, cfg, Instant::now())?,
            Some(v) => Sender::offering(session, &name, size, cfg, Instant::now(), v)?,
        }
        .with_nonce(super::random_bytes());
        tracing::info!(session = format_args!("{session:016x}"), %name, size, to = %opts.to, "sending");
        Ok(SourceFile { file: Some(file), size, session, machine, identity: Identity::of(&meta) })
    }
}

/// Opens `path` for sending and checks it is a regular file with the size it reports.
fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), Error> {
    let file_err = |e| Error::File { path: path.display().to_string(), source: e };
    // Non-blocking, so that a FIFO does not hang the open; then only regular files are sent
    // (a device or /proc file reports no size, a directory no data).
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(file_err)?;
    let meta = file.metadata().map_err(file_err)?;
    if !meta.is_file() {
        return Err(file_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
    }
    if meta.len() == 0 && has_data(&file).map_err(file_err)? {
        // /proc and some other pseudo-files report a size of 0 and yield data: sent as
        // what they report, they would arrive empty.
        let why = "reports a size of 0 but has data (a /proc or /sys file?): copy it to a regular file first";
        return Err(file_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why)));
    }
    Ok((file, meta))
}

#[path = "batch.rs"]
mod batch;
#[cfg(feature = "tokio")]
pub use batch::send_files_async;
use batch::BatchState;
pub use batch::{send_files, BatchReport, SentEntry};

/// What tells a file changed since it was opened, as rsync and tar tell it: its inode, size,
/// modification and status-change times. Compared once every chunk was read, before the FIN:
/// a source rewritten while it was read would otherwise be stored torn, with a digest that
/// matches the torn bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The key of this version of a file, which a receiver's partial of it carries: a hash of the
/// name it is stored under, its size, device, inode and modification time (another file, or
/// this one changed, has another key).
fn resume_key(name: &str, meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"rdcp resume key v1\0");
    h.update(name.as_bytes());
    for v in [meta.size(), meta.dev(), meta.ino(), meta.mtime() as u64, meta.mtime_nsec() as u64] {
        h.update(&v.to_be_bytes());
    }
    h.digest()
}

/// Whether a file that reports a size of 0 yields data when read.
fn has_data(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    loop {
        match file.read_at(&mut b, 0) {
            Ok(n) => return Ok(n > 0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// What the report of a send is made of, once its queues are gone.
struct SendSummary {
    machine: Sender,
    size: u64,
    session: u64,
    start: Instant,
    connect: Duration,
    granted_at: Option<Instant>,
    /// When the extra lanes were connected (none on one lane).
    lanes_at: Option<Instant>,
    data_end: Option<Instant>,
    fin_at: Option<Instant>,
}

impl SendSummary {
    /// The session's outcome as the caller sees it.
    fn report(self, outcome: Result<Outcome, Error>) -> Result<SendReport, Error> {
        let SendSummary { machine, size, session, start, connect, granted_at, lanes_at, data_end, fin_at } = self;
        let end = Instant::now();
        match outcome? {
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
                })
            }
            Outcome::Acked { status, detail } => Err(Error::Refused { status, detail }),
            Outcome::Failed(e) => Err(e.into()),
        }
    }
}

/// One send in progress: the machine, the file, and the connection's queues. Each `drive_*`
/// method does one part of a round; `send_file`'s loop calls them in turn.
struct SendSession<'a> {
    opts: &'a SendOptions,
    path: PathBuf,
    machine: Sender,
    /// The file being sent (none yet in a batch before its first file).
    file: Option<std::fs::File>,
    /// A batch's entries and results.
    batch: Option<BatchState>,
    /// The file as it was opened ([`Identity`]).
    identity: Identity,
    size: u64,
    session: u64,
    start: Instant,
    connect: Duration,
    /// The connection's PD (and, through it, its device context).
    pd: Arc<ProtectionDomain<'static>>,
    /// The local slots chunks are read into and written from.
    data: SlotPool<'static>,
    control: SlotPool<'static>,
    sq: SendQueue<'static, Rc>,
    ring: RecvRing<'static>,
    /// What extra lanes are made on (this connection's PD and channel).
    lane_base: LaneBase,
    /// The extra lanes, once connected: lane `n` is `lanes[n - 1]`.
    lanes: Vec<SendLane>,
    hasher: Hasher,
    /// The forger's digest of what is sent ([`SendOptions::test_tamper`]).
    #[cfg(feature = "fault-injection")]
    forger: Option<Hasher>,
    /// Chunks read and not yet pushed, with their slots.
    read: VecDeque<(u64, Slot<'static>)>,
    /// Chunks whose WRITE completed since the machine was last told.
    done: Vec<u64>,
    failed: Option<Error>,
    granted_at: Option<Instant>,
    /// When the extra lanes were connected.
    lanes_at: Option<Instant>,
    /// Whether the bytes the receiver already held were hashed.
    held_hashed: bool,
    data_end: Option<Instant>,
    fin_at: Option<Instant>,
    pacer: Pacer,
    /// The control message being sent: the machine writes each into it (no allocation per
    /// message).
    out: Vec<u8>,
}

impl<'a> SendSession<'a> {
    fn new(
        opts: &'a SendOptions,
        path: &Path,
        source: SourceFile,
        parts: EndpointParts,
        conn: &rdma_cm::Connection<'static>,
        start: Instant,
    ) -> Result<Self, Error> {
        let EndpointParts { pd, lane_base, ring, control } = parts;
        let connect = start.elapsed();
        let data = SlotPool::new(pd.clone(), opts.chunk as usize, opts.depth as usize, AccessFlags::LOCAL_WRITE)?;
        let sq = SendQueue::new(conn.qp(), DRAIN)?;
        let SourceFile { file, size, session, machine, identity } = source;
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
            out: Vec::new(),
        })
    }

    /// One round: the machine's actions, then the completions and arrivals. `Break` with the
    /// session's outcome once it is over, else `Continue` saying whether anything progressed.
    fn drive_round(
        &mut self,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<ControlFlow<Result<Outcome, Error>, bool>, Error> {
        let pushed = match self.drive_actions()? {
            ControlFlow::Break(o) => return Ok(ControlFlow::Break(Ok(o))),
            ControlFlow::Continue(pushed) => pushed,
        };
        let completed = self.drive_completions(progress)?;
        let arrived = self.drive_arrivals()?;
        Ok(ControlFlow::Continue(pushed || completed || arrived))
    }

    /// The file being sent.
    fn file(&self) -> Result<&std::fs::File, Error> {
        self.file.as_ref().ok_or_else(|| ProtocolError::Local("a chunk read without a file".into()).into())
    }

    fn file_err(&self, e: std::io::Error) -> Error {
        Error::File { path: self.path.display().to_string(), source: e }
    }

    /// Does what the machine asks: `Break` with the outcome once it finished, else `Continue`
    /// saying whether WRITEs were submitted.
    fn drive_actions(&mut self) -> Result<ControlFlow<Outcome, bool>, Error> {
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

    fn send_message(&mut self) -> Result<(), Error> {
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
    fn check_unchanged(&self) -> Result<(), Error> {
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

    fn read_chunk(&mut self, seq: u64, offset: u64, len: u32) -> Result<(), Error> {
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

    /// Takes the send queue's completions and tells the machine; whether any came.
    fn drive_completions(&mut self, progress: &mut impl FnMut(u64, u64)) -> Result<bool, Error> {
        let (done, failed) = (&mut self.done, &mut self.failed);
        let mut n = self.sq.poll(|c| collect(c, done, failed))?;
        for lane in &mut self.lanes {
            n += lane.sq.poll(|c| collect(c, done, failed))?;
        }
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if !self.done.is_empty() {
            let slot = u64::from(self.machine.grant().map_or(1, |g| g.slot_size));
            let held = self.machine.resumed_from();
            let (before, total) = self.batch.as_ref().map_or((0, self.size), |b| (b.done_bytes, b.total));
            // Per chunk, not per batch of completions: a caller's progress moves as each WRITE
            // completes (with lanes, as the chunks before it completed too).
            for &seq in &self.done {
                self.machine.handle(Input::WriteDone { seq }, Instant::now());
                let written = self.machine.chunks_written();
                progress(before + held.saturating_add(written * slot).min(self.size), total);
            }
            self.done.clear();
            let written = self.machine.chunks_written();
            if written == self.machine.chunks() && self.data_end.is_none() {
                self.data_end = Some(Instant::now());
            }
        }
        Ok(n > 0)
    }

    /// Takes the control messages that arrived; whether any came.
    fn drive_arrivals(&mut self) -> Result<bool, Error> {
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
    fn hash_held(&mut self) -> Result<(), Error> {
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

    /// Ends the round: spins or sleeps on the CQs ([`Pacer`]), and when the slow checks are due,
    /// the machine's timeout and whether the peer left.
    async fn drive_timers<I: Io>(
        &mut self,
        io: &I,
        progressed: bool,
        conn: &rdma_cm::Connection<'static>,
    ) -> Result<(), Error> {
        let cqs = SessionCqs::new(self.sq.cq(), self.ring.cq(), self.lanes.iter().map(|l| l.sq.cq()));
        // Asleep until a completion, the peer's CM event, the cancel, or the machine's deadline.
        let until = self.machine.poll_timeout().map_or(Deadline::never(), Deadline::at);
        let wakes = Wakes::new(conn.as_fd()).and(self.opts.cancel.fd());
        let due = self.pacer.round(io, progressed, cqs.as_slice(), until, &wakes).await?;
        self.drive_slow_checks(due, conn)
    }

    /// Whether the GRANT asks for lanes not yet connected.
    fn lanes_due(&self) -> Option<(u16, [u8; wire::LANE_TOKEN_LEN])> {
        let l = self.machine.grant()?.lanes?;
        (self.lanes.len() + 1 < usize::from(l.count)).then_some((l.count, l.token))
    }

    /// The LANE message lane `lane` presents as its connect private data.
    fn lane_message(&self, lane: u16, token: [u8; wire::LANE_TOKEN_LEN]) -> Result<Vec<u8>, Error> {
        #[cfg(feature = "fault-injection")]
        let token = self.opts.test_lane_token.unwrap_or(token);
        let mut bytes = Vec::new();
        wire::encode(self.session, &Message::Lane(wire::Lane { lane, token }), &mut bytes)
            .map_err(|e| Error::Protocol(e.into()))?;
        Ok(bytes)
    }

    /// Connects the extra lanes the GRANT granted, each a connection to the receiver in this
    /// connection's PD, within `connect_timeout` together.
    async fn connect_lanes<I: Io>(&mut self, io: &I) -> Result<(), Error> {
        let Some((count, token)) = self.lanes_due() else { return Ok(()) };
        let after = self.opts.connect_timeout;
        let deadline = Deadline::after(after);
        let timed_out = |e: rdma_cm::Error| match e.is_timeout() {
            true => Error::from(rdma_cm::Error::Timeout { what: "connecting a lane", device: None, after }),
            false => refusal(e),
        };
        #[cfg(feature = "fault-injection")]
        if let Some(delay) = self.opts.test_lane_delay {
            io.sleep(delay.min(deadline.remaining())).await;
        }
        for lane in self.lanes.len() as u16 + 1..count {
            let private = self.lane_message(lane, token)?;
            let id = io.resolve(self.opts.from, self.opts.to, deadline).await.map_err(timed_out)?;
            let (qp, _) = self.lane_base.lane(self.opts.depth, 0, |qp| id.init_qp(qp, AccessFlags::LOCAL_WRITE))?;
            let params = conn_params(self.opts.ack_timeout).private_data(&private);
            let conn = io.connect(id, qp, &params, deadline).await.map_err(timed_out)?;
            let sq = SendQueue::new(conn.qp(), DRAIN)?;
            self.lanes.push(SendLane { conn, sq });
        }
        tracing::debug!(session = format_args!("{:016x}", self.session), lanes = count, "lanes connected");
        self.lanes_connected();
        Ok(())
    }

    /// The lanes are up: the data phase starts now, and its timeout counts from now
    /// ([`Input::LanesConnected`]).
    fn lanes_connected(&mut self) {
        let now = Instant::now();
        self.lanes_at = Some(now);
        self.machine.handle(Input::LanesConnected, now);
    }

    /// Whether the send is cancelled (every round: one relaxed load), and when `due`: the
    /// machine's timeout and whether the peer left.
    fn drive_slow_checks(&mut self, due: bool, conn: &rdma_cm::Connection<'static>) -> Result<(), Error> {
        if self.opts.cancel.is_set() {
            return Err(Error::Cancelled);
        }
        if due {
            self.machine.handle_timeout(Instant::now());
            if peer_left(conn)? {
                return Err(Error::PeerDisconnected);
            }
        }
        Ok(())
    }

    /// Splits the session, once over, into its queues (to tear down) and its summary.
    fn into_parts(self) -> (SendQueue<'static, Rc>, RecvRing<'static>, SendSummary, Option<BatchState>, Vec<SendLane>) {
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
struct SendLane {
    conn: rdma_cm::Connection<'static>,
    sq: SendQueue<'static, Rc>,
}

/// The protocol versions a test sender offers instead of this build's (and then sends its
/// name unchecked): the test hook [`SendOptions::test_offer`].
#[cfg(feature = "fault-injection")]
fn offered_versions(opts: &SendOptions) -> Option<std::ops::RangeInclusive<u16>> {
    opts.test_offer.clone()
}

/// The session id a test sender uses instead of a random one ([`SendOptions::test_session`]).
#[cfg(feature = "fault-injection")]
fn test_session(opts: &SendOptions) -> Option<u64> {
    opts.test_session
}

/// Without fault injection every session id is random.
#[cfg(not(feature = "fault-injection"))]
fn test_session(_: &SendOptions) -> Option<u64> {
    None
}

/// Without fault injection a sender offers this build's versions.
#[cfg(not(feature = "fault-injection"))]
fn offered_versions(_: &SendOptions) -> Option<std::ops::RangeInclusive<u16>> {
    None
}

/// The test hook [`SendOptions::test_after_fin`]: what a hostile sender sends right after its
/// FIN (`fin`), without waiting for anything.
#[cfg(feature = "fault-injection")]
fn send_after_fin(
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

/// A rejected connection request whose private data is an ACK (a receiver past its limits
/// answers `Busy` so) is that ACK's verdict; any other CM error stays one.
fn refusal(e: rdma_cm::Error) -> Error {
    if let rdma_cm::Error::Rejected { private_data, .. } = &e {
        if let Ok((_, Message::Ack(ack))) = wire::decode(private_data) {
            return Error::Refused { status: ack.status, detail: ack.detail };
        }
    }
    e.into()
}

/// Sorts a completion: data WRITEs report their chunk; a failure ends the session. A request
/// that failed on the peer's or the path's account is [`Error::ConnectionLost`] (which the
/// session's loop explains: [`explain_loss`]); one refused for a local reason (a bug of ours)
/// stays the verbs error.
fn collect(c: rdma_verbs::SlotCompletion<'static>, done: &mut Vec<u64>, failed: &mut Option<Error>) {
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

/// A session id: random enough to tell sessions apart in logs and on the wire.
pub(crate) fn session_id() -> u64 {
    let id = u64::from_ne_bytes(super::random_bytes());
    if id != 0 {
        id
    } else {
        1
    }
}
