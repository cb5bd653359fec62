//! Building one side of a stream: the device's context and protection domain (shared by the
//! streams on it), the CQs, the queue pair with its receives posted, and, once the CM has
//! connected it, the send queue and the state.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use rdma_cm::Connection;
use rdma_verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, Context, Init, ProtectionDomain, QpCaps, QpCreateAttr, QueuePair,
    Rc, RecvRing, Reset, SendQueue, SlotPool,
};

use crate::credits::Credits;
use crate::link::{Shared, State};
use crate::wire::Hello;
use crate::{Error, Options, Result};

/// An opened device: its context and one PD, shared by every stream on it while any lives.
type Opened = (Arc<Context>, Arc<ProtectionDomain<'static>>);

/// The devices streams have opened, by name. Kept open for the process, as librdmacm keeps its
/// own: opening a device and its PD per connection would cost more than the connection.
static DEVICES: Mutex<Vec<(String, Opened)>> = Mutex::new(Vec::new());

/// The context and PD of `device`, opened with `open` the first time.
fn opened(device: &str, open: impl FnOnce() -> rdma_cm::Result<Context>) -> Result<Opened> {
    let mut devices = DEVICES.lock();
    if let Some((_, known)) = devices.iter().find(|(name, _)| name == device) {
        return Ok(known.clone());
    }
    let ctx = Arc::new(open()?);
    let pd = Arc::new(ProtectionDomain::new(ctx.clone())?);
    devices.push((device.to_owned(), (ctx.clone(), pd.clone())));
    Ok((ctx, pd))
}

/// One side before the CM connects it: the QP in `Init` with every receive posted.
pub(crate) struct Half {
    pub(crate) qp: QueuePair<'static, Rc, Init>,
    ring: RecvRing<'static>,
    pd: Arc<ProtectionDomain<'static>>,
    send_cq: Arc<CompletionQueue<'static>>,
    recv_cq: Arc<CompletionQueue<'static>>,
    options: Options,
}

impl Half {
    /// Makes the QP on `device` (opened with `open` unless already), moves it to `Init` with
    /// `init` (the CM's `init_qp`), and posts `options.messages` receives of
    /// `options.message_size` bytes. The QP's send side is sized for the largest window a peer
    /// may grant (this side's own `messages`: a peer's larger one is not used).
    pub(crate) fn new(
        device: &str,
        open: impl FnOnce() -> rdma_cm::Result<Context>,
        init: impl FnOnce(QueuePair<'static, Rc, Reset>) -> rdma_cm::Result<QueuePair<'static, Rc, Init>>,
        options: &Options,
    ) -> Result<Half> {
        options.check()?;
        let (ctx, pd) = opened(device, open)?;
        let attr = ctx.attr();
        let n = options.messages;
        // Each message and each report is one send request; reports ride beside the data.
        let send_wr = n + 2;
        let cqe = send_wr.max(n);
        if n > attr.max_qp_wr || send_wr > attr.max_qp_wr || cqe > attr.max_cqe {
            return Err(Error::Options(format!(
                "{n} messages: {device} takes at most {} requests per queue and {} per CQ",
                attr.max_qp_wr, attr.max_cqe
            )));
        }
        if options.message_size as u64 > attr.max_mr_size {
            return Err(Error::Options(format!(
                "message size {}: {device} registers at most {} bytes",
                options.message_size, attr.max_mr_size
            )));
        }
        let channel = Arc::new(CompletionChannel::new(ctx.clone())?);
        let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), send_wr, Some(channel.clone().into()))?);
        let recv_cq = Arc::new(CompletionQueue::new(ctx.clone(), n, Some(channel.into()))?);
        let caps = QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: n,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: options.inline,
        };
        let create = |caps: QpCaps| {
            QueuePair::<Rc, Reset>::create(pd.clone(), QpCreateAttr::new(send_cq.clone(), recv_cq.clone()).caps(caps))
        };
        // A device that takes less inline data than asked: without inline data.
        let qp = match create(caps) {
            Ok(qp) => qp,
            Err(_) if caps.max_inline_data > 0 => create(QpCaps { max_inline_data: 0, ..caps })?,
            Err(e) => return Err(e.into()),
        };
        let qp = init(qp)?;
        let pool = SlotPool::new(pd.clone(), options.message_size, n as usize, AccessFlags::LOCAL_WRITE)?;
        let ring = RecvRing::new(&qp, pool, n as usize, options.drain_timeout)?;
        Ok(Half { qp, ring, pd, send_cq, recv_cq, options: options.clone() })
    }

    /// This side's hello: how its receives are made.
    pub(crate) fn hello(&self) -> Hello {
        Hello { message_size: self.options.message_size as u32, messages: self.options.messages }
    }

    /// The QP for the CM's `connect` or `accept`, and the rest for [`Rest::establish`].
    pub(crate) fn take_qp(self) -> (QueuePair<'static, Rc, Init>, Rest) {
        let Half { qp, ring, pd, send_cq, recv_cq, options } = self;
        (qp, Rest { ring, pd, send_cq, recv_cq, options })
    }
}

/// What a [`Half`] keeps while its QP is being connected.
pub(crate) struct Rest {
    ring: RecvRing<'static>,
    pd: Arc<ProtectionDomain<'static>>,
    send_cq: Arc<CompletionQueue<'static>>,
    recv_cq: Arc<CompletionQueue<'static>>,
    options: Options,
}

impl Rest {
    /// The stream of `conn`, whose peer said `peer` in its hello.
    pub(crate) fn establish(self, conn: Connection<'static>) -> Result<Arc<Shared>> {
        let Some(peer) = Hello::decode(conn.private_data()) else {
            return Err(Error::NotAStream { peer: conn.peer_addr() });
        };
        if !peer.in_range() {
            return Err(Error::Protocol("a hello with a message size of 0 or a window out of range"));
        }
        let Rest { ring, pd, send_cq, recv_cq, options } = self;
        // Send no larger messages than the peer receives, and hold no more send buffers than
        // this side would receive into: a peer's hello never sizes this side's memory.
        let send_size = (peer.message_size as usize).min(options.message_size);
        let send_slots = peer.messages.min(options.messages);
        let pool = SlotPool::new(pd, send_size, send_slots as usize, AccessFlags::LOCAL_WRITE)?;
        let sq = SendQueue::new(conn.qp(), options.drain_timeout)?;
        let inline_max = conn.qp().caps().max_inline_data as usize;
        let credits = Credits::between(options.messages, peer.messages);
        let state = State::new(sq, ring, pool, inline_max, credits, options.wait);
        Ok(Arc::new(Shared {
            state: Mutex::new(state),
            turn: Condvar::new(),
            send_cq,
            recv_cq,
            policy: options.wait,
            drain: options.drain_timeout,
            conn,
            #[cfg(feature = "tokio")]
            handles: std::sync::atomic::AtomicUsize::new(1),
        }))
    }
}
