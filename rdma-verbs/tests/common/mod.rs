//! Fixtures shared by rdma-verbs' device tests.
#![allow(dead_code)]

use std::sync::{mpsc, Arc};
use std::time::Duration;

use rdma_verbs::*;

pub const T: Duration = Duration::from_secs(5);
pub const MR_LEN: usize = 64 * 1024;

/// One end of a connected RC pair: every resource it needs, borrowed from the fixture's stack.
pub struct End<'r> {
    pub ctx: &'r Context,
    pub pd: &'r ProtectionDomain<'r>,
    pub qp: QueuePair<'r, Rc, ReadyToSend>,
    pub mr: MemoryRegion<'r>,
}

impl End<'_> {
    pub fn remote(&self) -> RemoteRegion {
        self.mr.remote()
    }
}

/// Which devices the two ends use: loopback (both on the server's device) or across the wire
/// (client device -> server device).
pub fn device_pairs(topo: &testkit::Topology) -> [(String, String); 2] {
    [(topo.server.device.clone(), topo.server.device.clone()), (topo.client.device.clone(), topo.server.device.clone())]
}

/// Builds a connected RC pair `a` (on `dev_a`) -> `b` (on `dev_b`) with `access` on both MRs and
/// both QPs, and runs `f` with it.
pub fn with_rc_pair(
    topo: &testkit::Topology,
    dev_a: &str,
    dev_b: &str,
    access: AccessFlags,
    f: impl FnOnce(&End<'_>, &End<'_>),
) {
    with_rc_pair_ops(topo, dev_a, dev_b, access, None, f)
}

/// [`with_rc_pair`], both QPs extended with `ops` when given (`QpCreateAttr::send_ops`).
pub fn with_rc_pair_ops(
    topo: &testkit::Topology,
    dev_a: &str,
    dev_b: &str,
    access: AccessFlags,
    ops: Option<SendOps>,
    f: impl FnOnce(&End<'_>, &End<'_>),
) {
    let ctx_a = Context::open(dev_a).unwrap();
    let ctx_b = Context::open(dev_b).unwrap();
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (ctx_a.create_cq(256, None).unwrap(), ctx_b.create_cq(256, None).unwrap());
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 };
    let (mut attr_a, mut attr_b) =
        (QpCreateAttr::new(&cq_a, &cq_a).caps(caps), QpCreateAttr::new(&cq_b, &cq_b).caps(caps));
    if let Some(ops) = ops {
        (attr_a, attr_b) = (attr_a.send_ops(ops), attr_b.send_ops(ops));
    }
    let qp_a = pd_a.create_qp::<Rc>(attr_a).unwrap();
    let qp_b = pd_b.create_qp::<Rc>(attr_b).unwrap();
    let init = InitAttr::new(topo.port).access(access);
    let (qp_a, qp_b) = (qp_a.init(init).unwrap(), qp_b.init(init).unwrap());
    let ep_a = qp_a.endpoint(topo.gid_index, 100).unwrap();
    let ep_b = qp_b.endpoint(topo.gid_index, 200).unwrap();
    // Short timeouts so that error tests finish quickly.
    let tune = |rtr, rts: RtsAttr| (rtr, rts.timeout(12).retry_cnt(2).rnr_retry(2));
    let qp_a = qp_a.handshake_with(ep_b, topo.gid_index, 100, tune).unwrap();
    let qp_b = qp_b.handshake_with(ep_a, topo.gid_index, 200, tune).unwrap();
    let a = End { ctx: &ctx_a, pd: &pd_a, qp: qp_a, mr: pd_a.alloc_mr(MR_LEN, access).unwrap() };
    let b = End { ctx: &ctx_b, pd: &pd_b, qp: qp_b, mr: pd_b.alloc_mr(MR_LEN, access).unwrap() };
    f(&a, &b);
}

pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// A recognisable pattern of `len` bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub fn read(mr: &MemoryRegion<'_>, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    mr.read_at(offset, &mut v).unwrap();
    v
}

/// Waits for `n` completions of the scope, all successful, and returns (wr_id, opcode, byte_len, imm).
pub fn complete<S: rdma_verbs::qp::state::TypeState>(
    s: &mut PostScope<'_, '_, Rc, S>,
    n: usize,
) -> Vec<(u64, WcOpcode, u32, Option<u32>)> {
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let got = s.wait(n, &mut wcs, T).unwrap();
    got.iter()
        .map(|wc| {
            wc.ok().unwrap_or_else(|e| panic!("{e}"));
            (wc.wr_id(), wc.opcode(), wc.byte_len(), wc.imm())
        })
        .collect()
}

/// Moves a connected QP to ReadyToSend towards `peer`; `my_psn` is the PSN this QP's own
/// endpoint announced (the peer expects it).
pub fn connect<'r, X: rdma_verbs::qp::state::Connected>(
    qp: QueuePair<'r, X, Init>,
    my_psn: u32,
    peer: QpEndpoint,
    topo: &testkit::Topology,
) -> QueuePair<'r, X, ReadyToSend> {
    qp.handshake(peer, topo.gid_index, my_psn).unwrap()
}

/// A QP in `Init` whose parents are all shared (`Arc`): `'static`, so a thread can own it.
/// Separate send and receive CQs of `cq_entries` each, so a `SendQueue` and a `RecvRing` can
/// each own one.
pub fn owned_qp(
    topo: &testkit::Topology,
    ctx: &std::sync::Arc<Context>,
    pd: &std::sync::Arc<ProtectionDomain<'static>>,
    caps: QpCaps,
    cq_entries: u32,
    access: AccessFlags,
) -> QueuePair<'static, Rc, Init> {
    use std::sync::Arc;
    let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), cq_entries, None).unwrap());
    let recv_cq = Arc::new(CompletionQueue::new(ctx.clone(), cq_entries, None).unwrap());
    let attr = QpCreateAttr::new(send_cq, recv_cq).caps(caps);
    QueuePair::<Rc, Reset>::create(pd.clone(), attr).unwrap().init(InitAttr::new(topo.port).access(access)).unwrap()
}

/// Opens `device` as a shared context and a shared PD of it.
pub fn open_shared(device: &str) -> (std::sync::Arc<Context>, std::sync::Arc<ProtectionDomain<'static>>) {
    let ctx = std::sync::Arc::new(Context::open(device).unwrap());
    let pd = std::sync::Arc::new(ProtectionDomain::new(ctx.clone()).unwrap());
    (ctx, pd)
}

/// Connects two QPs in `Init` to each other (RC), retrying receiver-not-ready for good.
pub fn connect_pair<'a, 'b>(
    topo: &testkit::Topology,
    a: QueuePair<'a, Rc, Init>,
    b: QueuePair<'b, Rc, Init>,
) -> (QueuePair<'a, Rc, ReadyToSend>, QueuePair<'b, Rc, ReadyToSend>) {
    let ep_a = a.endpoint(topo.gid_index, 1000).unwrap();
    let ep_b = b.endpoint(topo.gid_index, 2000).unwrap();
    let tune = |rtr: RtrAttr, rts| (rtr.min_rnr_timer(1).max_dest_rd_atomic(4), rts);
    (
        a.handshake_with(ep_b, topo.gid_index, 1000, tune).unwrap(),
        b.handshake_with(ep_a, topo.gid_index, 2000, tune).unwrap(),
    )
}

/// The Q_Key the UD fixtures use.
pub const QKEY: u32 = 0x1111_2222;

/// A UD QP on `cq` (both queues), ready to send, taking datagrams with [`QKEY`].
pub fn ud_qp<'r>(
    pd: &'r ProtectionDomain<'r>,
    cq: &'r CompletionQueue<'r>,
    port: u8,
) -> QueuePair<'r, Ud, ReadyToSend> {
    let qp = pd.create_qp::<Ud>(QpCreateAttr::new(cq, cq)).unwrap().init(InitAttr::new(port).qkey(QKEY)).unwrap();
    qp.ready_to_receive().unwrap().ready_to_send(0).unwrap()
}

// Helpers of the tests of the safety rules (scope, request checks, waits, data path).

pub fn volatile_bytes(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the caller passes a pointer into a live slice of at least `len` bytes.
    (0..len).map(|i| unsafe { std::ptr::read_volatile(p.add(i)) }).collect()
}

/// RC QP in Init with ALL access.
pub fn rc_init<'r>(pd: &'r ProtectionDomain<'r>, cq: &'r CompletionQueue<'r>, port: u8) -> QueuePair<'r, Rc, Init> {
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };
    pd.create_qp::<Rc>(QpCreateAttr::new(cq, cq).caps(caps)).unwrap().init(InitAttr::new(port).access(ALL)).unwrap()
}

/// Sends `msg` (bytes of `mr` at 0) from `qp`, waiting up to `t` for the send completion.
pub fn scoped_send(qp: &QueuePair<'_, Rc, ReadyToSend>, mr: &MemoryRegion<'_>, msg: &[u8], t: Duration) -> Result<()> {
    mr.write_at(0, msg).unwrap();
    qp.scope(t, |s| -> rdma_verbs::Result<_> {
        let src = [mr.sge(0..msg.len()).unwrap()];
        s.post_send(&mut [SendRequest::send(90, &src)])?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, t)?[0].ok()?;
        Ok(())
    })
}

/// A loopback RC pair on the server's device with infinite RNR retries (RtsAttr's defaults): a
/// send to a side with no receive posted stays outstanding until one is.
pub fn with_patient_pair(f: impl FnOnce(&End<'_>, &End<'_>)) {
    let topo = testkit::require_topology!();
    let dev = topo.server.device.clone();
    let ctx = Context::open(&dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (ctx.create_cq(256, None).unwrap(), ctx.create_cq(256, None).unwrap());
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };
    let init = InitAttr::new(topo.port).access(ALL);
    let qa = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a).caps(caps)).unwrap().init(init).unwrap();
    let qb = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b).caps(caps)).unwrap().init(init).unwrap();
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let a = End { ctx: &ctx, pd: &pd, qp: connect(qa, 1, eb, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    let b = End { ctx: &ctx, pd: &pd, qp: connect(qb, 2, ea, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    f(&a, &b);
}

/// An RC QP on `cq` connected to itself (loopback), ready to send.
pub fn self_connected<'r>(
    pd: &'r ProtectionDomain<'r>,
    cq: &'r CompletionQueue<'r>,
    caps: QpCaps,
) -> QueuePair<'r, Rc, ReadyToSend> {
    let topo = testkit::configured();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(cq, cq).caps(caps)).unwrap();
    let qp = qp.init(InitAttr::new(topo.port).access(ALL)).unwrap();
    let me = qp.endpoint(topo.gid_index, 1).unwrap();
    connect(qp, 1, me, &topo)
}

/// Sends `msg` from `a` (its region's first bytes) and waits for the send's completion.
pub fn send_from(a: &End<'_>, msg: &[u8]) {
    a.mr.write_at(0, msg).unwrap();
    a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
        let src = [a.mr.sge(0..msg.len()).unwrap()];
        s.post_send(&mut [SendRequest::send(90, &src)]).unwrap();
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
        Ok(())
    })
    .unwrap();
}

/// The 16 bytes of a `struct ibv_sge` naming all of `mr`.
pub fn sge_bytes(mr: &MemoryRegion<'_>) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&mr.addr().to_ne_bytes());
    b[8..12].copy_from_slice(&(mr.len() as u32).to_ne_bytes());
    b[12..].copy_from_slice(&mr.lkey().to_ne_bytes());
    b
}

/// Runs `f` on its own thread and returns its result, or fails the test if it has not
/// returned after `limit` (the thread is left behind: a hang must fail, not hang the suite).
pub fn returns_within<R: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("{what}: still waiting after {limit:?}"))
}

pub fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps { max_send_wr: send, max_recv_wr: recv, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Whether `e` is the error of a wait that nothing can end.
pub fn nothing_to_wait_for(e: &Error) -> bool {
    matches!(e, Error::NothingToWaitFor { .. })
}

/// Sends `n` inline messages from `client` and waits until the peer acknowledged them all.
pub fn send_messages(client: &QueuePair<'static, Rc, ReadyToSend>, n: u64) {
    let mut sq = SendQueue::new(client, T).unwrap();
    for i in 0..n {
        sq.send_inline(&i.to_le_bytes(), None, i).unwrap();
    }
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}

/// A ring of 8 receives on an SRQ whose one QP is connected to a client on the other device.
pub struct SrqSetup {
    pub pool: SlotPool<'static>,
    pub recv_cq: Arc<CompletionQueue<'static>>,
    pub srq: Arc<SharedReceiveQueue<'static>>,
    pub ring: RecvRing<'static>,
    pub server: QueuePair<'static, Rc, ReadyToSend>,
    pub client: QueuePair<'static, Rc, ReadyToSend>,
}

pub fn srq_setup(topo: &testkit::Topology) -> SrqSetup {
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let srq = Arc::new(SharedReceiveQueue::new(pd_r.clone(), 16, 1).unwrap());
    let recv_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 64, None).unwrap());
    let pool = SlotPool::new(pd_r.clone(), 64, 16, AccessFlags::LOCAL_WRITE).unwrap();
    let ring = RecvRing::with_srq(srq.clone(), recv_cq.clone(), pool.clone(), 8, T).unwrap();
    let send_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 16, None).unwrap());
    let attr = QpCreateAttr::new(send_cq, recv_cq.clone()).srq(srq.clone()).caps(caps(16, 0));
    let server = QueuePair::<Rc, Reset>::create(pd_r.clone(), attr)
        .unwrap()
        .init(InitAttr::new(topo.port).access(AccessFlags::LOCAL_WRITE))
        .unwrap();
    let client = owned_qp(topo, &ctx_c, &pd_c, caps(16, 1), 16, AccessFlags::LOCAL_WRITE);
    let (client, server) = connect_pair(topo, client, server);
    SrqSetup { pool, recv_cq, srq, ring, server, client }
}

/// Sends `n` messages from `qp`'s slots of `pool`.
pub fn send_messages_from(qp: &QueuePair<'static, Rc, ReadyToSend>, pool: &SlotPool<'static>, n: usize) {
    let mut sq = SendQueue::new(qp, T).unwrap();
    for _ in 0..n {
        sq.post(SlotRequest::send(pool.try_take().unwrap(), 8)).unwrap();
    }
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}

pub fn changed_bytes(p: *const u8, len: usize) -> usize {
    // SAFETY: the caller passes a pointer into a live slice of at least `len` bytes.
    (0..len).filter(|&i| unsafe { std::ptr::read_volatile(p.add(i)) } != 0).count()
}

/// One end of an echo link: a send queue and a receive ring on a QP whose two CQs report to one
/// completion channel, all owned (`'static`), with a pool to send from.
pub struct Link {
    pub sq: SendQueue<'static, Rc>,
    pub ring: RecvRing<'static>,
    pub pool: SlotPool<'static>,
}

/// `n` connected pairs of [`Link`]s, client (on the client's device) and server (on the
/// server's), each QP's CQs on a channel of their own when `channels`, else none (spin only).
pub fn echo_links(topo: &testkit::Topology, n: usize, channels: bool) -> Vec<(Link, Link)> {
    echo_links_with(topo, n, channels, false)
}

/// [`echo_links`], on extended CQs (`CompletionQueue::new_ex`) when `extended`.
pub fn echo_links_with(topo: &testkit::Topology, n: usize, channels: bool, extended: bool) -> Vec<(Link, Link)> {
    echo_links_draining(topo, n, channels, extended, T)
}

/// [`echo_links_with`], each send queue and ring with `drain` as its drain timeout (`T` in the
/// others): for a test that waits for a drop's or a close's drain timeout to run out, which
/// needs only that it runs out, not how long it is.
pub fn echo_links_draining(
    topo: &testkit::Topology,
    n: usize,
    channels: bool,
    extended: bool,
    drain: Duration,
) -> Vec<(Link, Link)> {
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_s, pd_s) = open_shared(&topo.server.device);
    let end = |ctx: &Arc<Context>, pd: &Arc<ProtectionDomain<'static>>| {
        let ch = channels.then(|| Arc::new(CompletionChannel::new(ctx.clone()).unwrap()));
        let cq = || {
            let ch = ch.clone().map(Into::into);
            Arc::new(if extended {
                CompletionQueue::new_ex(ctx.clone(), 64, ch, WcFields::empty()).unwrap()
            } else {
                CompletionQueue::new(ctx.clone(), 64, ch).unwrap()
            })
        };
        let attr = QpCreateAttr::new(cq(), cq()).caps(caps(32, 32));
        let qp = QueuePair::<Rc, Reset>::create(pd.clone(), attr)
            .unwrap()
            .init(InitAttr::new(topo.port).access(AccessFlags::LOCAL_WRITE))
            .unwrap();
        let ring_pool = SlotPool::new(pd.clone(), 64, 16, AccessFlags::LOCAL_WRITE).unwrap();
        let ring = RecvRing::new(&qp, ring_pool, 16, drain).unwrap();
        let pool = SlotPool::new(pd.clone(), 64, 32, AccessFlags::LOCAL_WRITE).unwrap();
        (qp, ring, pool)
    };
    (0..n)
        .map(|_| {
            let (qc, rc, pc) = end(&ctx_c, &pd_c);
            let (qs, rs, ps) = end(&ctx_s, &pd_s);
            let (qc, qs) = connect_pair(topo, qc, qs);
            let link = |qp: QueuePair<'static, Rc, ReadyToSend>, ring, pool| Link {
                sq: SendQueue::new(&qp, drain).unwrap(),
                ring,
                pool,
            };
            (link(qc, rc, pc), link(qs, rs, ps))
        })
        .collect()
}

/// Sends `bytes` from a slot of `link`'s pool, taking completions (and checking them) as room
/// is needed.
pub fn send_bytes(link: &mut Link, bytes: &[u8]) {
    while link.sq.room() == 0 || link.pool.available() == 0 {
        link.sq.wait(T, |c| c.ok().unwrap()).unwrap();
    }
    let mut slot = link.pool.try_take().unwrap();
    slot.write_at(0, bytes).unwrap();
    link.sq.post(SlotRequest::send(slot, bytes.len())).map_err(Error::from).unwrap();
}

/// The CPU time the calling thread has used.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) }, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Polls `f` by hand, outside any runtime, until it is ready (at most 100 polls; `None` if it
/// never was).
pub fn poll_outside_a_runtime<F: std::future::Future>(f: F) -> Option<F::Output> {
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: every function of the vtable ignores the (null) data pointer.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    (0..100).find_map(|_| match f.as_mut().poll(&mut cx) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    })
}
