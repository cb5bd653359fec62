//! Fixtures shared by rdma-verbs' device tests.
#![allow(dead_code)]

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
    let ctx_a = Context::open(dev_a).unwrap();
    let ctx_b = Context::open(dev_b).unwrap();
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (ctx_a.create_cq(256, None).unwrap(), ctx_b.create_cq(256, None).unwrap());
    let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 4, max_recv_sge: 4, max_inline_data: 64 };
    let qp_a = pd_a.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a).caps(caps)).unwrap();
    let qp_b = pd_b.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b).caps(caps)).unwrap();
    let init = InitAttr::new(topo.port).access(access);
    let (qp_a, qp_b) = (qp_a.init(init).unwrap(), qp_b.init(init).unwrap());
    let ep_a = qp_a.endpoint(topo.gid_index, 100).unwrap();
    let ep_b = qp_b.endpoint(topo.gid_index, 200).unwrap();
    let mtu = ctx_a.query_port(topo.port).unwrap().active_mtu;
    let sgid = topo.gid_index;
    let qp_a = qp_a.ready_to_receive(&RtrAttr::new(ep_b, topo.port, sgid, mtu)).unwrap();
    let qp_b = qp_b.ready_to_receive(&RtrAttr::new(ep_a, topo.port, sgid, mtu)).unwrap();
    // Short timeouts so that error tests finish quickly.
    let rts = |psn| RtsAttr::new(psn).timeout(12).retry_cnt(2).rnr_retry(2);
    let qp_a = qp_a.ready_to_send(&rts(100)).unwrap();
    let qp_b = qp_b.ready_to_send(&rts(200)).unwrap();
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
    let mtu = a.pd().context().query_port(topo.port).unwrap().active_mtu;
    let rtr = |ep| RtrAttr::new(ep, topo.port, topo.gid_index, mtu).min_rnr_timer(1).max_dest_rd_atomic(4);
    let a = a.ready_to_receive(&rtr(ep_b)).unwrap();
    let b = b.ready_to_receive(&rtr(ep_a)).unwrap();
    let rts = |psn| RtsAttr::new(psn).timeout(14).retry_cnt(7).rnr_retry(7);
    (a.ready_to_send(&rts(1000)).unwrap(), b.ready_to_send(&rts(2000)).unwrap())
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
