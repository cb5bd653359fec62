//! [`send_file`]: connect to a receiver and send one file.

mod session;
mod source;

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use rdma_verbs::{AccessFlags, Deadline};

use crate::driver::flag::Flag;
#[cfg(feature = "tokio")]
use crate::driver::io::Tokio;
use crate::driver::io::{block_on, Blocking, Io};
use crate::driver::link::{conn_params, explain_loss, Endpoint, Side, DISCONNECT_WAIT, DRAIN};
use crate::driver::retry::{Attempt, Retries};
use crate::driver::{Error, Phases};
use crate::wire::{self, Message};
use crate::{Digest, Outcome};

use crate::driver::batch::BatchState;
use session::SendLane;
pub(crate) use session::SendSession;
pub(crate) use session::SendSummary;
pub(crate) use source::{open_regular, resume_key, test_session, Identity, SourceFile};

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
    /// Bytes per chunk (one WRITE), at most: a single file smaller than a chunk is sent as one
    /// chunk of its size rounded up to 4 KiB (a batch's files use the chunk given).
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
    /// ([`send_files`](crate::driver::send_files) only).
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
    /// [`send_files`](crate::driver::send_files) does not retry. The rules: [`docs/protocol.md`, "Resuming"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#resuming-capability-resume).
    pub retries: u32,
    /// How long a send may wait, in all, for a receiver that answers [`Status::Busy`] (every
    /// place taken), before it reports that answer: each time it waits what the receiver's
    /// hint says ([`wire::Ack::retry_after_ms`]; without one 0.5 s, doubling to 4 s), times a
    /// random factor of 0.5 to 1.5 so that senders turned away together do not come back
    /// together, then sends again (resuming what the receiver kept). These waits are not
    /// [`retries`](Self::retries). Default zero: the first `Busy` is reported.
    /// [`send_files`](crate::driver::send_files) waits so for a receiver that refuses the whole
    /// batch `Busy`; an entry it offered is never sent again.
    ///
    /// [`Status::Busy`]: crate::Status::Busy
    pub busy_wait: Duration,
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

/// The chunk size a file of `size` bytes is sent with, under `chunk`: the file's size rounded
/// up to 4 KiB when that is smaller. A sender registers chunk x depth bytes, and the receiver
/// as much again for its slots: at the 4 MiB, depth-4 defaults a 4 KiB file would pin 16 MiB at
/// each end, and registering it costs more than the file's transfer. The depth is left alone:
/// the receiver may grant smaller slots than asked (its `max_chunk` and memory share), and
/// then needs it.
pub(crate) fn fitted_chunk(chunk: u32, size: u64) -> u32 {
    const PAGE: u64 = 4096;
    let fitted = size.max(1).next_multiple_of(PAGE);
    if fitted < u64::from(chunk) {
        fitted as u32
    } else {
        chunk
    }
}

impl SendOptions {
    /// Defaults for sending to `to`: 4 MiB chunks, 4 in flight, one lane (each chosen by
    /// measurement: [`docs/protocol.md`, "Speed, and the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)), 10 s to connect, 30 s
    /// without progress.
    pub fn new(to: SocketAddr) -> Self {
        SendOptions {
            to,
            from: None,
            name: None,
            chunk: 4 << 20,
            depth: 4,
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            ack_timeout: crate::driver::link::SEND_ACK_TIMEOUT,
            wait: crate::driver::link::WAIT,
            cancel: Flag::new(),
            resume: true,
            preserve: false,
            secret: None,
            lanes: 1,
            retries: 0,
            busy_wait: Duration::ZERO,
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
    /// The whole-file digest the receiver chose ([`ReceiveOptions::digest`](crate::driver::ReceiveOptions::digest)).
    pub digest: Digest,
    /// Attempts that failed before this one succeeded ([`SendOptions::retries`]); the other
    /// fields are of the attempt that succeeded.
    pub retries: u32,
    /// The receiver had the file in place already, identical (size and digest, proved as a
    /// resume's prefix is): nothing was sent, and `resumed_from` is its size.
    pub already_stored: bool,
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
/// In a runtime without IO enabled, as tokio's own types. (Its deadlines and pauses are
/// `timerfd`s on the reactor, not tokio timers: a runtime built without time works.)
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
            Ok(wait) => crate::driver::retry::sleep(io, wait, opts).await?,
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
pub(crate) type Ran = (Result<Outcome, Error>, SendSummary, Option<BatchState>);

/// The connection parameters of a session's first connection: with a secret, its KNOCK as
/// the private data ([`crate::policy::knock`]), so that a receiver whose places are all taken by
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
pub(crate) async fn run<I: Io>(
    io: &I,
    path: &Path,
    file: SourceFile,
    batch: Option<BatchState>,
    opts: &SendOptions,
    mut progress: impl FnMut(u64, u64),
    start: Instant,
) -> Result<Ran, Error> {
    // Connect, with the receive ring posted before the peer can send. `connect_timeout` bounds
    // the whole of it, not each step: one deadline, handed to each step as it is, and a step
    // that runs out of it says which call it waited for and the whole bound.
    crate::driver::link::check_ack_timeout(opts.ack_timeout)?;
    let deadline = Deadline::after(opts.connect_timeout);
    // Every failure names both addresses (`Error::Connect`).
    let connect_error = |e: rdma_cm::Error| match refusal(e) {
        Error::Cm(source) => Error::Connect { from: opts.from, to: opts.to, source: Box::new(source) },
        refused => refused,
    };
    let id = io.finish(rdma_cm::CmId::new()?.resolve(opts.from, opts.to), deadline).await.map_err(connect_error)?;
    let ctx = id.open_context()?;
    // REMOTE_WRITE lets the receiver probe (a zero-length WRITE, `driver::probe`); no region
    // of the sender is remotely writable, so no other WRITE of the peer lands.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let ep = Endpoint::new(ctx, opts.depth, 32, |qp| id.init_qp(qp, access))?;
    let (qp, parts) = ep.split();
    let knock = opts.secret.as_ref().map(|s| {
        crate::policy::knock::knock(
            s,
            u64::from_be_bytes(crate::driver::random_bytes()),
            SystemTime::now(),
            id.local_addr().ip(),
            id.peer_addr(),
        )
    });
    let conn =
        io.finish(id.connect(qp, &first_params(opts, knock.as_deref())), deadline).await.map_err(connect_error)?;
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
        let _ = io.finish(conn.disconnect(), goodbye()).await;
    }
    let _ = io.finish(conn.disconnect(), goodbye()).await;
    io.close_ring(ring).await;
    Ok((outcome, summary, batch))
}

/// A rejected connection request whose private data is an ACK (a receiver past its limits
/// answers `Busy` so) is that ACK's verdict; any other CM error stays one.
pub(crate) fn refusal(e: rdma_cm::Error) -> Error {
    if let rdma_cm::Error::Rejected { private_data, .. } = &e {
        if let Ok((_, Message::Ack(ack))) = wire::decode(private_data) {
            let retry_after = (ack.retry_after_ms > 0).then(|| Duration::from_millis(u64::from(ack.retry_after_ms)));
            return Error::Refused { status: ack.status, detail: ack.detail, retry_after };
        }
    }
    e.into()
}

/// A session id: random enough to tell sessions apart in logs and on the wire.
pub(crate) fn session_id() -> u64 {
    let id = u64::from_ne_bytes(crate::driver::random_bytes());
    if id != 0 {
        id
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::fitted_chunk;

    #[test]
    fn a_file_smaller_than_a_chunk_is_one_chunk_of_its_size_in_pages() {
        const MIB: u32 = 1 << 20;
        assert_eq!(fitted_chunk(4 * MIB, 0), 4096);
        assert_eq!(fitted_chunk(4 * MIB, 1), 4096);
        assert_eq!(fitted_chunk(4 * MIB, 4096), 4096);
        assert_eq!(fitted_chunk(4 * MIB, 4097), 8192);
        assert_eq!(fitted_chunk(4 * MIB, u64::from(MIB) + 12_345), MIB + 16_384);
        // As large as a chunk or larger: the chunk given.
        assert_eq!(fitted_chunk(4 * MIB, u64::from(4 * MIB) - 1), 4 * MIB);
        assert_eq!(fitted_chunk(4 * MIB, u64::from(10 * MIB)), 4 * MIB);
        assert_eq!(fitted_chunk(64 << 10, 1 << 30), 64 << 10);
        // A chunk that is no multiple of 4 KiB is kept for a file as large as it.
        assert_eq!(fitted_chunk(5000, 5000), 5000);
        assert_eq!(fitted_chunk(5000, 4000), 4096);
    }
}
