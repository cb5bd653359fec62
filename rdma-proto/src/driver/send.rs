//! [`send_file`]: connect to a receiver and send one file.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rdma_cm::CmId;
use rdma_verbs::{AccessFlags, RemoteRegion, SendQueue, Slot, SlotPool, SlotRequest};
use xxhash_rust::xxh3::Xxh3;

use super::link::{
    conn_params, peer_left, send_control, take_arrivals, Endpoint, Pacer, CONTROL_WR_ID, DISCONNECT_WAIT, DRAIN,
};
use super::{Error, Phases};
use crate::sender::{Action, Input, Sender, SenderConfig};
use crate::wire::{self, Message};
use crate::{Outcome, ProtocolError, Status};

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
    /// Test hook: offer these protocol versions and send the name unchecked.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_offer: Option<std::ops::RangeInclusive<u16>>,
    /// Test hook: a hostile sender that follows its FIN at once with this (to prove the
    /// receiver's verdict still matches its disk).
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub test_after_fin: Option<AfterFin>,
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
    /// Defaults for sending to `to`: 1 MiB chunks, 16 in flight (measured on rxe:
    /// `docs/protocol.md`), 10 s to connect, 30 s without progress.
    pub fn new(to: SocketAddr) -> Self {
        SendOptions {
            to,
            from: None,
            name: None,
            chunk: 1 << 20,
            depth: 16,
            connect_timeout: Duration::from_secs(10),
            timeout: Duration::from_secs(30),
            #[cfg(feature = "fault-injection")]
            test_offer: None,
            #[cfg(feature = "fault-injection")]
            test_after_fin: None,
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
}

/// Sends `path` to a receiver; `progress(bytes_written, total)` is called as chunks complete.
///
/// # Errors
/// [`Error::Refused`] with the receiver's status when it did not store the file; otherwise
/// the connection, file, protocol or timeout error.
pub fn send_file(path: &Path, opts: &SendOptions, mut progress: impl FnMut(u64, u64)) -> Result<SendReport, Error> {
    let start = Instant::now();
    let file_err = |e| Error::File { path: path.display().to_string(), source: e };
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
    // Non-blocking, so that a FIFO does not hang the open; then only regular files are sent
    // (a device or /proc file reports no size, a directory no data).
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(file_err)?;
    let meta = file.metadata().map_err(file_err)?;
    if !meta.is_file() {
        return Err(file_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
    }
    let size = meta.len();
    let session = session_id();
    let cfg = SenderConfig::new(opts.chunk, opts.depth, opts.timeout);
    let mut machine = match offer {
        None => Sender::new(session, &name, size, cfg, Instant::now())?,
        Some(v) => Sender::offering(session, &name, size, cfg, Instant::now(), v)?,
    };
    tracing::info!(session = format_args!("{session:016x}"), %name, size, to = %opts.to, "sending");

    // Connect, with the receive ring posted before the peer can send.
    let id = CmId::new()?.resolve(opts.from, opts.to, opts.connect_timeout)?;
    let ctx = id.open_context()?;
    let ep = Endpoint::new(ctx, opts.depth, 32, |qp| id.init_qp(qp, AccessFlags::LOCAL_WRITE))?;
    let Endpoint { pd, qp, mut ring, control } = ep;
    let conn = id.connect(qp, &conn_params(), opts.connect_timeout).map_err(refusal)?;
    let mut phases = Phases { connect: start.elapsed(), ..Phases::default() };
    let data = SlotPool::new(pd.clone(), opts.chunk as usize, opts.depth as usize, AccessFlags::LOCAL_WRITE)?;
    let mut sq = SendQueue::new(conn.qp(), DRAIN)?;

    let mut hasher = Xxh3::new();
    let mut read: VecDeque<(u64, Slot<'static>)> = VecDeque::new();
    let mut done: Vec<u64> = Vec::new();
    let mut failed: Option<Error> = None;
    let (mut granted_at, mut data_end, mut fin_at) = (None, None, None);
    let mut pacer = Pacer::default();
    // The control message being sent: the machine writes each into it (no allocation per message).
    let mut out: Vec<u8> = Vec::new();
    let outcome = 'run: loop {
        // Do what the machine asks.
        let mut pushed = false;
        while let Some(action) = machine.poll_action() {
            match action {
                Action::Send => {
                    machine.transmit(&mut out);
                    // After the HELLO, the only message a sender sends is its FIN.
                    let fin = machine.grant().is_some() && fin_at.is_none();
                    if fin {
                        fin_at = Some(Instant::now());
                    }
                    let r = send_control(&mut sq, &control, &out, opts.timeout, |c| collect(c, &mut done, &mut failed));
                    if let Err(e) = r {
                        break 'run Err(e.into());
                    }
                    #[cfg(feature = "fault-injection")]
                    if let Some(after) = opts.test_after_fin.filter(|_| fin) {
                        let r = send_after_fin(after, &mut sq, &control, &out, &machine, opts.timeout);
                        if let Err(e) = r {
                            break 'run Err(e.into());
                        }
                    }
                }
                Action::ReadChunk { seq, offset, len } => {
                    let Some(mut slot) = data.try_take() else {
                        break 'run Err(ProtocolError::Local("no free data slot: depth exceeded".into()).into());
                    };
                    match slot.read_file(&file, offset, len as usize) {
                        Ok(n) if n == len as usize => {}
                        Ok(n) => {
                            let e = std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                format!("file shrank: {n} of {len} bytes at {offset}"),
                            );
                            break 'run Err(file_err(e));
                        }
                        Err(e) => break 'run Err(file_err(e)),
                    }
                    // The data pool is not remotely writable: a plain slice of it is sound.
                    if let Ok(bytes) = slot.as_slice() {
                        hasher.update(&bytes[..len as usize]);
                    }
                    read.push_back((seq, slot));
                    machine.handle(Input::ChunkRead { seq }, Instant::now());
                }
                Action::WriteChunk { seq, len, remote_addr, rkey, imm } => {
                    let Some(pos) = read.iter().position(|(s, _)| *s == seq) else {
                        break 'run Err(ProtocolError::Local(format!("chunk {seq} was not read")).into());
                    };
                    let (_, slot) = read.remove(pos).expect("position found above");
                    let remote = RemoteRegion { addr: remote_addr, rkey, len: u64::from(len) };
                    let req = SlotRequest::write(slot, len as usize, remote).with_imm(imm).with_wr_id(seq);
                    if let Err(r) = sq.push(req) {
                        break 'run Err(r.error.into());
                    }
                    pushed = true;
                }
                Action::NeedDigest => {
                    let digest = hasher.digest128().to_be_bytes();
                    machine.handle(Input::Digest(digest.to_vec()), Instant::now());
                }
                Action::Finish(o) => break 'run Ok(o),
            }
        }
        if pushed {
            if let Err(e) = sq.submit() {
                break 'run Err(e.into());
            }
        }
        // Completions.
        let mut progressed = pushed;
        match sq.poll(|c| collect(c, &mut done, &mut failed)) {
            Ok(n) => progressed |= n > 0,
            Err(e) => break 'run Err(e.into()),
        }
        if let Some(e) = failed.take() {
            break 'run Err(e);
        }
        if let Some(&last) = done.last() {
            done.clear();
            machine.handle(Input::WriteDone { seq: last }, Instant::now());
            let written = machine.chunks_written();
            progress((written * u64::from(machine.grant().map_or(1, |g| g.slot_size))).min(size), size);
            if written == machine.chunks() && data_end.is_none() {
                data_end = Some(Instant::now());
            }
        }
        // Control messages.
        let arrivals = take_arrivals(&mut ring, |msg| {
            let was_granted = machine.grant().is_some();
            machine.handle(Input::Message(msg.bytes()), Instant::now());
            if !was_granted && machine.grant().is_some() {
                granted_at = Some(Instant::now());
            }
        });
        match arrivals {
            Ok(n) => progressed |= n > 0,
            Err(e) => break 'run Err(e),
        }
        let slow = match pacer.round(progressed, [sq.cq(), ring.cq()]) {
            Ok(slow) => slow,
            Err(e) => break 'run Err(e),
        };
        if slow {
            machine.handle_timeout(Instant::now());
            if peer_left(&conn) {
                break 'run Err(Error::PeerDisconnected);
            }
        }
    };
    let end = Instant::now();
    tracing::debug!(ok = outcome.is_ok(), after = ?end - start, "session over; tearing down");
    // Let the last sends complete before the connection goes.
    let _ = sq.drain(DRAIN, drop);
    drop(sq);
    tracing::debug!(after = ?end.elapsed(), "send queue drained");
    // The peer's answer to the disconnect only confirms what is already decided; a peer that
    // withholds it (measured: a never-ACKing receiver held a timed-out sender 10 s here) must
    // not delay the exit. The connection is torn down either way.
    let _ = conn.disconnect(DISCONNECT_WAIT.min(opts.connect_timeout));
    tracing::debug!(after = ?end.elapsed(), "disconnected");
    drop(ring);
    tracing::debug!(after = ?end.elapsed(), "receive ring released");
    match outcome? {
        Outcome::Acked { status: Status::Ok, .. } => {
            let g = *machine.grant().expect("an OK ACK follows a grant");
            let fin = fin_at.unwrap_or(end);
            let data_start = granted_at.unwrap_or(start);
            phases.grant = data_start.duration_since(start).saturating_sub(phases.connect);
            phases.data = data_end.unwrap_or(fin).duration_since(data_start);
            phases.digest = end.duration_since(fin);
            Ok(SendReport { session, bytes: size, chunk: g.slot_size, slots: g.slot_count, phases, total: end - start })
        }
        Outcome::Acked { status, detail } => Err(Error::Refused { status, detail }),
        Outcome::Failed(e) => Err(e.into()),
    }
}

/// The protocol versions a test sender offers instead of this build's (and then sends its
/// name unchecked): the test hook [`SendOptions::test_offer`].
#[cfg(feature = "fault-injection")]
fn offered_versions(opts: &SendOptions) -> Option<std::ops::RangeInclusive<u16>> {
    opts.test_offer.clone()
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

/// Sorts a completion: data WRITEs report their chunk; a failure ends the session.
fn collect(c: rdma_verbs::SlotCompletion<'static>, done: &mut Vec<u64>, failed: &mut Option<Error>) {
    if let Err(e) = c.ok() {
        failed.get_or_insert(e.into());
        return;
    }
    if c.wr_id != CONTROL_WR_ID {
        done.push(c.wr_id);
    }
}

/// A session id: random enough to tell sessions apart in logs and on the wire.
pub(crate) fn session_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: `b` is writable for its 8 bytes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let id = u64::from_ne_bytes(b);
    if n == 8 && id != 0 {
        id
    } else {
        (std::process::id() as u64) << 32 | Instant::now().elapsed().subsec_nanos() as u64 | 1
    }
}
