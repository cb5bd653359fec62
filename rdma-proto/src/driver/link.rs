//! One side's verbs resources for a session, and its control channel: a send queue shared by
//! control messages and data WRITEs, and a receive ring posted before the connection exists.

use std::sync::Arc;
use std::time::Duration;

use rdma_verbs::qp::state::Rc;
use rdma_verbs::qp::state::{Init, Reset};
use rdma_verbs::{
    AccessFlags, AsyncEvent, CompletionChannel, CompletionQueue, Context, CqWaiter, Deadline, Idle, ProtectionDomain,
    QpCaps, QpCreateAttr, QueuePair, RecvRing, SendQueue, SlotMessage, SlotPool, SlotRequest, WaitPolicy, WcStatus,
};

use super::io::{Io, Registrations, Wakes};
use super::Error;
use crate::wire::MAX_MESSAGE_LEN;

/// `wr_id` of control sends; data WRITEs use their chunk number (below 2^63).
pub(crate) const CONTROL_WR_ID: u64 = u64::MAX;
/// Control messages one side may have in flight.
const CONTROL_SLOTS: u32 = 16;
/// Send requests a QP keeps for probes beyond its data and control ones: one
/// ([`SendQueue::probe`](rdma_verbs::SendQueue::probe) keeps one in flight at most).
pub(crate) const PROBE_WRS: u32 = 1;
/// How long a sender waits for the peer to confirm its disconnect once the session is over.
pub(crate) const DISCONNECT_WAIT: Duration = Duration::from_secs(1);
/// How long a dropped queue or ring waits for its requests before flushing.
pub(crate) const DRAIN: Duration = Duration::from_millis(200);

/// A QP in `Init` with its receive ring posted, on resources the thread owns.
pub(crate) struct Endpoint {
    pub(crate) pd: Arc<ProtectionDomain<'static>>,
    /// The channel every CQ of the session shares, its extra lanes' too.
    pub(crate) channel: Arc<CompletionChannel<'static>>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) qp: QueuePair<'static, Rc, Init>,
    pub(crate) ring: RecvRing<'static>,
    pub(crate) control: SlotPool<'static>,
}

impl Endpoint {
    /// Creates the PD, CQs, QP (in `Reset`, handed to `init`) and the control pools; posts
    /// `ring_depth` receives. `send_depth` is the data requests in flight.
    pub(crate) fn new(
        ctx: Context,
        send_depth: u32,
        ring_depth: u32,
        init: impl FnOnce(QueuePair<'static, Rc, Reset>) -> rdma_cm::Result<QueuePair<'static, Rc, Init>>,
    ) -> rdma_cm::Result<Self> {
        let ctx = Arc::new(ctx);
        let pd = Arc::new(ProtectionDomain::new(ctx.clone())?);
        // One spare for a probe (`SendQueue::probe`: one in flight at most), so that a probe never
        // takes the entry a chunk or a control message needs.
        let send_wr = send_depth + CONTROL_SLOTS + PROBE_WRS;
        // One channel for both CQs: an idle loop blocks on it (`Pacer`).
        let channel = Arc::new(CompletionChannel::new(ctx.clone())?);
        let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), send_wr, Some(channel.clone().into()))?);
        let recv_cq = Arc::new(CompletionQueue::new(ctx.clone(), ring_depth, Some(channel.clone().into()))?);
        let caps = QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: ring_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = QueuePair::<Rc, Reset>::create(pd.clone(), QpCreateAttr::new(send_cq, recv_cq).caps(caps))?;
        let qp = init(qp)?;
        let ring_pool = SlotPool::new(pd.clone(), MAX_MESSAGE_LEN, ring_depth as usize, AccessFlags::LOCAL_WRITE)?;
        let ring = RecvRing::new(&qp, ring_pool, ring_depth as usize, DRAIN)?;
        let control = SlotPool::new(pd.clone(), MAX_MESSAGE_LEN, CONTROL_SLOTS as usize, AccessFlags::LOCAL_WRITE)?;
        Ok(Endpoint { pd, channel, ctx, qp, ring, control })
    }
}

/// What a session's extra lanes are made on: its context, protection domain (so that one
/// registered ring and one rkey serve every lane) and completion channel (so that an idle
/// round sleeps on every lane's CQs at once).
#[derive(Clone)]
pub(crate) struct LaneBase {
    pub(crate) ctx: Arc<Context>,
    pub(crate) pd: Arc<ProtectionDomain<'static>>,
    pub(crate) channel: Arc<CompletionChannel<'static>>,
}

impl LaneBase {
    /// An extra lane's QP (to `init`) and, with `ring_depth` above 0, its receive ring posted
    /// (`ring_depth` receives: each WRITE with immediate takes one). `send_wr` requests may be
    /// in flight on it.
    pub(crate) fn lane(
        &self,
        send_wr: u32,
        ring_depth: u32,
        init: impl FnOnce(QueuePair<'static, Rc, Reset>) -> rdma_cm::Result<QueuePair<'static, Rc, Init>>,
    ) -> rdma_cm::Result<(QueuePair<'static, Rc, Init>, Option<RecvRing<'static>>)> {
        let ctx = &self.ctx;
        let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), send_wr.max(1), Some(self.channel.clone().into()))?);
        let recv_cq =
            Arc::new(CompletionQueue::new(ctx.clone(), ring_depth.max(1), Some(self.channel.clone().into()))?);
        let caps = QpCaps {
            max_send_wr: send_wr.max(1),
            max_recv_wr: ring_depth.max(1),
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = QueuePair::<Rc, Reset>::create(self.pd.clone(), QpCreateAttr::new(send_cq, recv_cq).caps(caps))?;
        let qp = init(qp)?;
        if ring_depth == 0 {
            return Ok((qp, None));
        }
        // A WRITE with immediate uses no receive buffer's bytes; a Send on a lane is refused.
        let pool = SlotPool::new(self.pd.clone(), LANE_RECV_LEN, ring_depth as usize, AccessFlags::LOCAL_WRITE)?;
        let ring = RecvRing::new(&qp, pool, ring_depth as usize, DRAIN)?;
        Ok((qp, Some(ring)))
    }
}

/// Bytes of an extra lane's receive buffers: only WRITEs with immediate come there (which
/// use none); a Send that does not fit fails, the peer's violation.
const LANE_RECV_LEN: usize = 64;

/// An endpoint's resources other than its QP, once the QP went to the connection.
pub(crate) struct EndpointParts {
    pub(crate) pd: Arc<ProtectionDomain<'static>>,
    pub(crate) lane_base: LaneBase,
    pub(crate) ring: RecvRing<'static>,
    pub(crate) control: SlotPool<'static>,
}

impl Endpoint {
    /// The QP (for connecting or accepting) and the rest.
    pub(crate) fn split(self) -> (QueuePair<'static, Rc, Init>, EndpointParts) {
        let Endpoint { pd, channel, ctx, qp, ring, control } = self;
        let lane_base = LaneBase { ctx, pd: pd.clone(), channel };
        (qp, EndpointParts { pd, lane_base, ring, control })
    }
}

/// Sends one encoded control message, waiting (as `SendQueue::wait` does: spin, then sleep on
/// the CQ's channel; every completion goes to `on_completion`) up to `timeout` for a free
/// control slot and room in the queue.
pub(crate) fn send_control(
    sq: &mut SendQueue<'static, Rc>,
    control: &SlotPool<'static>,
    bytes: &[u8],
    timeout: Duration,
    mut on_completion: impl FnMut(rdma_verbs::SlotCompletion<'static>),
) -> rdma_verbs::Result<()> {
    let deadline = rdma_verbs::Deadline::after(timeout);
    let mut slot = loop {
        if let Some(s) = control.try_take() {
            if sq.room() > 0 {
                break s;
            }
            drop(s);
        }
        if sq.staged() > 0 {
            // Requests pushed and not yet submitted hold the room: they go first (the control
            // message follows them in the queue either way).
            sq.submit()?;
            continue;
        }
        match sq.wait(deadline.remaining(), &mut on_completion) {
            Ok(_) => {}
            Err(rdma_verbs::Error::Timeout { .. }) => {
                return Err(rdma_verbs::Error::Timeout { what: "a free control slot", after: timeout })
            }
            Err(e) => return Err(e),
        }
    };
    slot.write_at(0, bytes)?;
    let mut request = SlotRequest::send(slot, bytes.len()).with_wr_id(CONTROL_WR_ID);
    if quiet(bytes, control) {
        request = request.unsignaled();
    }
    sq.push(request).map_err(|r| r.error)?;
    sq.submit()?;
    Ok(())
}

/// Whether a control message is posted without a completion of its own: a CREDIT (nobody waits
/// for it to complete: the sender answers with WRITEs), while at least half the control slots
/// are free. Each completion of the receiver's send CQ is an event that can wake it, one per
/// chunk when every CREDIT is signaled; this way one in `CONTROL_SLOTS / 2` is, and its
/// completion gives back the slots of the CREDITs before it (a send queue completes in order),
/// so that a signaled message is always in flight before the pool runs dry. A CREDIT that fails
/// still completes, with its error.
fn quiet(bytes: &[u8], control: &SlotPool<'static>) -> bool {
    crate::wire::decode_header(bytes).is_ok_and(|h| h.kind == crate::wire::Kind::Credit)
        && control.available() >= CONTROL_SLOTS as usize / 2
}

/// Paces a session's polling loop: after a round with no progress it waits as every wait of
/// rdma-verbs does ([`CqWaiter`]: spins for the options' [`WaitPolicy`] budget, by default
/// none ([`WAIT`]), arms the CQs, polls once more, then sleeps on their shared completion
/// channel), until a completion, one of the session's [`Wakes`] (its connection's CM events,
/// the flags that stop or displace it, the bell of its lanes), or its next deadline (the
/// machine's [`poll_timeout`](crate::receiver::Receiver::poll_timeout), and the driver's own:
/// a held-back answer). Nothing else wakes it: an idle session sleeps until something happens.
///
/// Why sleep rather than spin (measured under TCG, [`docs/protocol.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md)): a spinning thread takes
/// the vCPU rxe's own packet processing needs (the transfer reached 0.84x `ib_write_bw`), and
/// short sleeps cost a timer interrupt each, tens of thousands a second (0.85x with 20 us
/// sleeps, 0.93x with 1 ms ones). A thread woken by its completions costs neither.
///
/// The slow checks (the machine's timeout, the CM's events, the flags) are due after a sleep
/// that a wake or the deadline ended, once the deadline passed, and every `SLOW_EVERY` busy
/// rounds: a peer that keeps sending messages that are no progress (a repeated CREDIT, say)
/// must not keep them from being made.
pub(crate) struct Pacer {
    waiter: CqWaiter,
    rounds: u32,
    registrations: Registrations,
}

/// How a transfer's loops wait by default ([`SendOptions::wait`](super::SendOptions::wait),
/// [`ReceiveOptions::wait`](super::ReceiveOptions::wait)): they sleep as soon as a round made
/// no progress, spinning not at all. A chunk takes milliseconds to arrive (tens of µs on a
/// 100 Gb/s NIC), so a spin budget of a round trip buys no latency worth having; under TCG it
/// cost the receiver CPU and the transfer speed ([`docs/protocol.md`, "Speed, and the defaults"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#speed-and-the-defaults)).
pub(crate) const WAIT: WaitPolicy = WaitPolicy::sleep_at_once();

impl Pacer {
    /// A pacer whose idle rounds wait as `policy` says.
    pub(crate) fn new(policy: WaitPolicy) -> Self {
        Pacer { waiter: CqWaiter::new(policy), rounds: 0, registrations: Registrations::default() }
    }
}

/// The CQs one round of a session polls, and its idle wait sleeps on: the connection's receive
/// ring's, one per extra lane (a sender's lane's send queue, a receiver's lane's ring), then the
/// connection's send queue's, gathered on the stack (an idle round allocates nothing). The last
/// can be quiet ([`quiet_send`](Self::quiet_send), for a sender).
pub(crate) struct SessionCqs<'a> {
    cqs: [&'a CompletionQueue<'static>; 2 + crate::wire::MAX_LANES as usize],
    len: usize,
    quiet_send: bool,
}

impl<'a> SessionCqs<'a> {
    /// `recv`, `lanes` (at most [`MAX_LANES`](crate::wire::MAX_LANES) of them are kept: a session
    /// has no more), then `send`.
    pub(crate) fn new(
        send: &'a CompletionQueue<'static>,
        recv: &'a CompletionQueue<'static>,
        lanes: impl IntoIterator<Item = &'a CompletionQueue<'static>>,
    ) -> Self {
        let mut set = SessionCqs { cqs: [recv; 2 + crate::wire::MAX_LANES as usize], len: 1, quiet_send: false };
        for cq in lanes.into_iter().take(crate::wire::MAX_LANES as usize) {
            set.cqs[set.len] = cq;
            set.len += 1;
        }
        set.cqs[set.len] = send;
        set.len += 1;
        set
    }

    /// With `quiet`, the idle wait does not arm the connection's send queue's CQ: the session
    /// needs no event of its completions until something changes (a sender waiting for room
    /// at its peer: the room comes as a message, and a WRITE's completion frees nothing it
    /// needs first). Each round still polls it, and a failed request on the connection ends its
    /// receives too (the QP goes to the error state and flushes them), which wakes the wait.
    /// A lane has no receives to flush, so its CQ stays armed.
    pub(crate) fn quiet_send(mut self, quiet: bool) -> Self {
        self.quiet_send = quiet;
        self
    }

    /// The CQs the idle wait arms.
    pub(crate) fn armed(&self) -> &[&'a CompletionQueue<'static>] {
        &self.cqs[..self.len - usize::from(self.quiet_send)]
    }

    /// The CQs the idle wait does not arm, though the session polls them.
    pub(crate) fn quiet(&self) -> &[&'a CompletionQueue<'static>] {
        &self.cqs[self.len - usize::from(self.quiet_send)..self.len]
    }
}

/// Busy rounds between two yields of an async session to its runtime's other tasks: an
/// `await` a chunk or so, costless beside a chunk's own work.
const YIELD_EVERY: u32 = 16;
/// Busy rounds between slow checks.
const SLOW_EVERY: u32 = 256;
/// Arrivals one round takes from the receive ring, so that a flood of messages cannot keep a
/// round from ending.
pub(crate) const ARRIVALS_PER_ROUND: usize = 64;

impl Pacer {
    /// Ends a round of polling `cqs` (which share one completion channel), its idle wait made
    /// by `io` until a completion, one of `wakes`, or `until`; `true` when the slow checks are
    /// due.
    ///
    /// # Errors
    /// [`Error::Verbs`] when arming a CQ or reading the channel fails.
    pub(crate) async fn round<I: Io>(
        &mut self,
        io: &I,
        progressed: bool,
        cqs: &SessionCqs<'_>,
        until: Deadline,
        wakes: &Wakes<'_>,
    ) -> Result<bool, Error> {
        self.rounds = self.rounds.wrapping_add(1);
        if progressed {
            self.waiter.reset();
            if self.rounds % YIELD_EVERY == 0 {
                io.yield_now().await;
            }
            return Ok(self.rounds % SLOW_EVERY == 0 || until.has_passed());
        }
        let idle = io.idle(&mut self.waiter, cqs.armed(), cqs.quiet(), until, wakes, &mut self.registrations).await?;
        Ok(matches!(idle, Idle::Signalled | Idle::Slept) || until.has_passed())
    }
}

/// Takes up to [`ARRIVALS_PER_ROUND`] arrivals from `ring`, hands each to `on_arrival`, and
/// reposts its buffer. Returns how many came.
///
/// # Errors
/// [`Error::ConnectionLost`] with the status when a receive completed in error (the session's
/// loop then tells why with [`explain_loss`]); the ring's errors.
pub(crate) fn take_arrivals(
    ring: &mut RecvRing<'static>,
    mut on_arrival: impl FnMut(&SlotMessage<'static>),
) -> Result<usize, Error> {
    for n in 0..ARRIVALS_PER_ROUND {
        let Some(msg) = ring.try_recv()? else { return Ok(n) };
        if let Err(rdma_verbs::Error::WorkCompletion { status, .. }) = msg.ok() {
            return Err(Error::ConnectionLost { status });
        }
        on_arrival(&msg);
        ring.release(msg)?;
    }
    Ok(ARRIVALS_PER_ROUND)
}

/// The connection parameters both sides use: the local ACK timeout given (`ack_timeout`, an
/// exponent: 4.096 µs × 2^n) rather than the one the CM derives from the path's packet
/// lifetime, the CM's 7 transport retries (the most there are) and RNR retries without end (a
/// receive is posted for every WRITE the receiver grants, so an RNR NAK means a control
/// message outran the peer's reposting, never a failure). Why [`SEND_ACK_TIMEOUT`] and
/// [`RECEIVE_ACK_TIMEOUT`] are the defaults:
/// [`docs/protocol.md`, "Recovery under loss"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#recovery-under-loss).
pub(crate) fn conn_params<'a>(ack_timeout: u8) -> rdma_cm::ConnParams<'a> {
    rdma_cm::ConnParams::new().ack_timeout(ack_timeout)
}

/// The sender's default local ACK timeout exponent
/// ([`SendOptions::ack_timeout`](super::SendOptions)): perftest's 14, 4.096 µs × 2^14 = 67 ms.
/// Its QP carries the chunks, whose losses a probe ([`probe`](super::probe)) cannot always
/// recover: rxe's responder answers one sequence NAK per gap, so a lost NAK, or a lost packet
/// of the go-back-N that followed it, waits for this timeout (at 1% loss, 18 moved 0.1x the
/// bytes of 14). Shorter ones retransmit on a clean wire when the peer is slow to ACK, and
/// Linux 6.1's rxe refuses some retransmitted WRITEs with immediate ([`docs/protocol.md`,
/// "Recovery under loss"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#recovery-under-loss)).
pub(crate) const SEND_ACK_TIMEOUT: u8 = 14;

/// The receiver's default local ACK timeout exponent
/// ([`ReceiveOptions::ack_timeout`](super::ReceiveOptions)): 18, 4.096 µs × 2^18 = 1.07 s. Its
/// QP sends only control messages, one packet each: a lost one that the next reveals is
/// NAKed, a lost last one (or its lost ACK) is recovered by a probe while the session lasts
/// (to a sender that offered `PROBES`), so the timeout is left the rare lost NAK and a lost
/// verdict, which ends the session as it is sent. A short one retried CREDITs on a clean wire: on Linux 6.1, whose rxe
/// fires it against a deadline set before a pause, and on 6.12 when an ACK queued behind 4 MiB
/// of data took longer than 67 ms.
pub(crate) const RECEIVE_ACK_TIMEOUT: u8 = 18;

/// Checks an ACK timeout exponent (5 bits; 0 would mean no timeout at all).
pub(crate) fn check_ack_timeout(n: u8) -> Result<(), Error> {
    if (1..=31).contains(&n) {
        Ok(())
    } else {
        Err(Error::Usage(format!("ack_timeout {n}: the exponent is 1..=31 (4.096 us x 2^n)")))
    }
}

/// Whether the peer disconnected: reads every pending CM event of the connection (so that its
/// fd is quiet again for the next idle sleep, [`Wakes`]).
///
/// # Errors
/// [`Error::Cm`] when the events cannot be read: the session could not hear its peer leave.
pub(crate) fn peer_left(conn: &rdma_cm::Connection<'_>) -> Result<bool, Error> {
    while !conn.peer_disconnected() && conn.try_recv_event()?.is_some() {}
    Ok(conn.peer_disconnected())
}

/// Which side of a transfer a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Sender,
    Receiver,
}

/// Tells why a session's request failed ([`Error::ConnectionLost`] with the device's status;
/// other errors are returned as they are). This is the one place that maps a failed completion
/// to what the caller is told:
///
/// - On the receiver, a receive that failed with a status other than a flush was the peer's
///   request breaking the rules: an oversized Send (`LocalLengthError`), a WRITE outside the
///   granted memory or with a wrong rkey. So is a flush preceded by the responder's
///   `IBV_EVENT_QP_ACCESS_ERR`/`QP_REQ_ERR`/`QP_FATAL` on the context (a WRITE without
///   immediate, or a READ, consumes no receive to fail). [`Error::PeerViolation`].
/// - Otherwise, if the peer's disconnect arrives within [`DISCONNECT_WAIT`] (a killed peer's
///   kernel disconnects for it; the completion often fails first, with whatever the moment gave:
///   `RemoteAccessError` as its memory went, `RetryExceeded`, a flush),
///   [`Error::PeerDisconnected`].
/// - Else the peer or the path stopped answering (a link down, a host gone):
///   [`Error::ConnectionLost`], with the status as the device reported it.
pub(crate) async fn explain_loss<I: Io>(
    io: &I,
    e: Error,
    side: Side,
    conn: &rdma_cm::Connection<'static>,
    ctx: &Context,
) -> Error {
    let Error::ConnectionLost { status } = e else { return e };
    if let Some(v) = violation(status, side, ctx) {
        return v;
    }
    if io.peer_leaves(conn, Deadline::after(DISCONNECT_WAIT)).await {
        Error::PeerDisconnected
    } else {
        Error::ConnectionLost { status }
    }
}

/// The peer's violation a failed receive shows, on the receiver ([`explain_loss`]).
fn violation(status: WcStatus, side: Side, ctx: &Context) -> Option<Error> {
    if side != Side::Receiver {
        return None;
    }
    if status != WcStatus::WrFlushError {
        return Some(Error::PeerViolation { status, event: None });
    }
    while let Ok(Some(event)) = ctx.try_recv_async_event() {
        if matches!(event, AsyncEvent::QpError { .. } | AsyncEvent::QpFatal { .. }) {
            return Some(Error::PeerViolation { status, event: Some(event) });
        }
    }
    None
}
