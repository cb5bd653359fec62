//! Shared by the echo example's servers and clients: the connection's verbs resources, the
//! message format, and the latency summary.
//!
//! Each connection is a [`Link`]: an RC queue pair whose send and receive CQs report to
//! completion channels of their own (so a wait on either sleeps on its own fd), a
//! [`RecvRing`] of receives kept posted, a [`SendQueue`] and a pool of send slots, all on
//! shared (`Arc`) resources: `'static`, so that a thread or a tokio task owns the connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::ValueEnum;
use rdma_cm::{Connection, Event};
use rdma_verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, Init, ProtectionDomain, QpCaps, QpCreateAttr, QueuePair,
    Rc, RecvRing, Reset, SendQueue, SlotCompletion, SlotMessage, SlotPool, SlotRequest, WaitPolicy,
};

/// The example's error type: rdma-cm's, rdma-verbs', or a message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// The bound of one connection step (resolve, connect, accept) and of one wait for a message.
pub const T: Duration = Duration::from_secs(10);
/// How long dropping a queue waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(2);
/// The largest message a client may ask for.
pub const MAX_SIZE: usize = 1 << 20;
/// Receives each side keeps posted, and send slots each side has.
const DEPTH: usize = 8;
/// The first bytes of a client's connect request; its message size follows (u32, LE).
const MAGIC: &[u8; 4] = b"ECHO";

/// How a connection is served or driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A thread per connection, blocking waits.
    Threads,
    /// A task per connection on one current-thread tokio runtime.
    Async,
}

/// How the waits wait for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Wait {
    /// Spin until the deadline (`WaitPolicy::spin_then_sleep(Duration::MAX)`): a core each.
    Spin,
    /// The default policy: spin 50 µs, then sleep on the completion channel.
    Block,
}

impl Wait {
    pub fn policy(self) -> WaitPolicy {
        match self {
            Wait::Spin => WaitPolicy::spin_then_sleep(Duration::MAX),
            Wait::Block => WaitPolicy::default(),
        }
    }
}

/// The private data of a connect request: the magic and the message size.
pub fn hello(size: usize) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(MAGIC);
    b[4..].copy_from_slice(&(size as u32).to_le_bytes());
    b
}

/// The message size of a connect request's private data, if it is an echo client's.
pub fn size_of_hello(private_data: &[u8]) -> Option<usize> {
    let size = u32::from_le_bytes(private_data.get(4..8)?.try_into().ok()?) as usize;
    (private_data.starts_with(MAGIC) && (1..=MAX_SIZE).contains(&size)).then_some(size)
}

/// An opened device: its context and one PD, shared by every connection on it.
type Opened = (Arc<Context>, Arc<ProtectionDomain<'static>>);

/// The devices opened so far, by name.
#[derive(Default)]
pub struct Devices(Mutex<Vec<(String, Opened)>>);

impl Devices {
    /// The context and PD of `device`, opened with `open` the first time.
    fn get(&self, device: &str, open: impl FnOnce() -> rdma_cm::Result<Context>) -> Result<Opened> {
        let mut opened = self.0.lock().unwrap();
        if let Some((_, known)) = opened.iter().find(|(name, _)| name == device) {
            return Ok(known.clone());
        }
        let ctx = Arc::new(open()?);
        let pd = Arc::new(ProtectionDomain::new(ctx.clone())?);
        opened.push((device.to_owned(), (ctx.clone(), pd.clone())));
        Ok((ctx, pd))
    }
}

/// One side's queue pair in `Init`, with its receives posted, before the CM connects it.
pub struct Half {
    qp: QueuePair<'static, Rc, Init>,
    ring: RecvRing<'static>,
    pool: SlotPool<'static>,
}

impl Half {
    /// Makes the QP on `device` (opened with `open` unless already), moves it to `Init` with
    /// `init` (the CM's `init_qp`), and posts `DEPTH` receives of `size` bytes.
    pub fn new(
        devices: &Devices,
        device: &str,
        open: impl FnOnce() -> rdma_cm::Result<Context>,
        init: impl FnOnce(QueuePair<'static, Rc, Reset>) -> rdma_cm::Result<QueuePair<'static, Rc, Init>>,
        size: usize,
    ) -> Result<Half> {
        let (ctx, pd) = devices.get(device, open)?;
        let cq = || -> Result<Arc<CompletionQueue<'static>>> {
            let channel = Arc::new(CompletionChannel::new(ctx.clone())?);
            Ok(Arc::new(CompletionQueue::new(ctx.clone(), 2 * DEPTH as u32, Some(channel.into()))?))
        };
        let caps = QpCaps { max_send_wr: DEPTH as u32, max_recv_wr: DEPTH as u32, ..QpCaps::default() };
        let qp = QueuePair::<Rc, Reset>::create(pd.clone(), QpCreateAttr::new(cq()?, cq()?).caps(caps))?;
        let qp = init(qp)?;
        let access = AccessFlags::LOCAL_WRITE;
        let ring = RecvRing::new(&qp, SlotPool::new(pd.clone(), size, DEPTH, access)?, DEPTH, DRAIN)?;
        let pool = SlotPool::new(pd, size, DEPTH, access)?;
        Ok(Half { qp, ring, pool })
    }

    /// The QP, for the CM's `connect` or `accept`.
    pub fn take_qp(self) -> (QueuePair<'static, Rc, Init>, Rest) {
        (self.qp, Rest { ring: self.ring, pool: self.pool })
    }
}

/// What a [`Half`] keeps while its QP is being connected.
pub struct Rest {
    ring: RecvRing<'static>,
    pool: SlotPool<'static>,
}

/// An established echo connection. Fields drop in order: the connection (disconnect), then
/// the queue and the ring (the QP goes with the last of them).
pub struct Link {
    pub conn: Connection<'static>,
    pub sq: SendQueue<'static, Rc>,
    pub ring: RecvRing<'static>,
    pool: SlotPool<'static>,
}

impl Link {
    /// The link of `conn`, its waits waiting as `wait` says.
    pub fn new(conn: Connection<'static>, rest: Rest, wait: Wait) -> Result<Link> {
        let mut sq = SendQueue::new(conn.qp(), DRAIN)?;
        let Rest { mut ring, pool } = rest;
        sq.set_wait_policy(wait.policy());
        ring.set_wait_policy(wait.policy());
        Ok(Link { conn, sq, ring, pool })
    }

    pub fn peer(&self) -> SocketAddr {
        self.conn.peer_addr()
    }

    /// Posts `bytes` as a SEND from a free slot, taking completions (blocking) while none is.
    pub fn send(&mut self, bytes: &[u8]) -> Result<()> {
        while self.pool.available() == 0 || self.sq.room() == 0 {
            let mut failed = None;
            self.sq.wait(T, |c| note_failure(&mut failed, c))?;
            failed.map_or(Ok(()), Err)?;
        }
        self.post(bytes)
    }

    /// [`send`](Self::send), awaiting completions while no slot is free.
    pub async fn send_async(&mut self, bytes: &[u8]) -> Result<()> {
        while self.pool.available() == 0 || self.sq.room() == 0 {
            let mut failed = None;
            self.sq.wait_async(|c| note_failure(&mut failed, c)).await?;
            failed.map_or(Ok(()), Err)?;
        }
        self.post(bytes)
    }

    fn post(&mut self, bytes: &[u8]) -> Result<()> {
        let mut slot = self.pool.try_take().expect("a free slot");
        slot.write_at(0, bytes)?;
        self.sq.post(SlotRequest::send(slot, bytes.len()))?;
        Ok(())
    }

    /// Whether the peer has left: reads the connection's pending event without waiting.
    pub fn peer_left(&self) -> rdma_cm::Result<bool> {
        Ok(self.conn.peer_disconnected() || matches!(self.conn.try_recv_event()?, Some(Event::Disconnected)))
    }

    /// Whether the peer leaves within `within` (after a failed receive or send).
    pub fn peer_leaves(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if self.peer_left().unwrap_or(false) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Drops the link without blocking the runtime: the connection (which sends a DREQ if the
    /// peer is still there, and waits for nothing), then the queue and the ring through their
    /// `close_async`, whose blocking parts run on tokio's blocking pool.
    pub async fn close_async(self) {
        let Link { conn, sq, ring, pool } = self;
        drop(conn);
        let _ = sq.close_async().await;
        let _ = ring.close_async().await;
        drop(pool);
    }
}

/// Keeps the first failed completion.
fn note_failure(failed: &mut Option<rdma_verbs::Error>, c: SlotCompletion<'_>) {
    if let Err(e) = c.ok() {
        failed.get_or_insert(e);
    }
}

/// The message of client `id`'s round trip `round`, `size` bytes: its numbers, then a pattern
/// of them, so that a reply from another client or round trip differs in every byte run.
pub fn fill(buf: &mut Vec<u8>, size: usize, id: u32, round: u32) {
    let seed = u64::from(id) << 32 | u64::from(round);
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    buf.clear();
    buf.extend_from_slice(&seed.to_le_bytes());
    while buf.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        buf.extend_from_slice(&x.to_le_bytes());
    }
    buf.truncate(size);
}

/// Checks a reply against the message sent, byte for byte.
pub fn check(reply: &SlotMessage<'_>, sent: &[u8], id: u32, round: u32) -> std::result::Result<(), String> {
    reply.ok().map_err(|e| format!("client {id}, round trip {round}: {e}"))?;
    let got = reply.bytes();
    if got == sent {
        return Ok(());
    }
    let at = got.iter().zip(sent).position(|(a, b)| a != b).unwrap_or(got.len().min(sent.len()));
    Err(format!(
        "client {id}, round trip {round}: the reply differs from the message at byte {at} ({} bytes back, {} sent)",
        got.len(),
        sent.len()
    ))
}

/// The figures of a run: round trips in nanoseconds, and the run's wall time.
pub fn summary(mut rtts: Vec<u64>, wall: Duration) -> String {
    rtts.sort_unstable();
    let n = rtts.len().max(1);
    let at = |p: f64| rtts.get(((n as f64 * p).ceil() as usize).clamp(1, n) - 1).copied().unwrap_or(0) as f64 / 1e3;
    let mean = rtts.iter().sum::<u64>() as f64 / n as f64 / 1e3;
    let rate = rtts.len() as f64 / wall.as_secs_f64();
    format!("p50 {:.1} us, p99 {:.1} us, mean {:.1} us, {rate:.0} msgs/s", at(0.50), at(0.99), mean)
}
