//! Fixtures shared by the device benches (`#[path]`-free: `mod common;` in each bench file).
//!
//! - [`topology`]: the devices to measure on, or `None` after printing one line when there are
//!   none; inside the harness (`RDMA_TEST_REQUIRE_DEVICE=1`) a missing device panics instead.
//! - [`RcPair`]: an RC connection from the client device (rxe1) to the server device (rxe0),
//!   built with the verbs directly (as `rdma-verbs/tests/common` does), on shared (`'static`)
//!   resources and separate send and receive CQs, so that a `SendQueue` and a `RecvRing` can
//!   each own one.
//! - [`spin`]: polls until a condition holds, reading the clock only every few thousand polls
//!   (under the VM's emulation a clock read is a system call of about 1 us).
#![allow(dead_code)]

use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use rdma_verbs::*;

/// The bound on every wait of a bench: far above any figure measured, so only a hang hits it.
pub const T: Duration = Duration::from_secs(10);

/// The devices the benches use, if present.
///
/// Without them: panics when the harness requires devices (`RDMA_TEST_REQUIRE_DEVICE=1`, set
/// by `scripts/softroce`); otherwise prints, once per bench binary,
/// `<bench>: no RDMA device ...; <what> not measured` and returns `None`.
pub fn topology(bench: &str, what: &str) -> Option<testkit::Topology> {
    if testkit::device_required() {
        // Panics, naming what is missing and what is present, when a device is missing.
        return testkit::topology();
    }
    let topo = testkit::configured();
    let present = testkit::present_devices();
    let missing: Vec<&str> =
        topo.endpoints().iter().map(|e| e.device.as_str()).filter(|d| !present.iter().any(|p| p == d)).collect();
    if missing.is_empty() {
        return Some(topo);
    }
    static LINE: Once = Once::new();
    LINE.call_once(|| {
        let present = if present.is_empty() { "none".to_string() } else { present.join(", ") };
        println!(
            "{bench}: no RDMA device {} (present: {present}); {what} not measured \
             (scripts/bench runs the benches in the Soft-RoCE VM)",
            missing.join("/")
        );
    });
    None
}

/// Shared verbs resources of one device.
pub struct Device {
    pub ctx: Arc<Context>,
    pub pd: Arc<ProtectionDomain<'static>>,
}

impl Device {
    pub fn open(name: &str) -> Self {
        let ctx = Arc::new(Context::open(name).unwrap_or_else(|e| panic!("opening {name}: {e}")));
        let pd = Arc::new(ProtectionDomain::new(ctx.clone()).expect("ibv_alloc_pd"));
        Device { ctx, pd }
    }
}

/// A connected RC pair: `client` on the topology's client device, `server` on its server
/// device, each with its own send CQ and receive CQ.
pub struct RcPair {
    pub client: QueuePair<'static, Rc, ReadyToSend>,
    pub server: QueuePair<'static, Rc, ReadyToSend>,
    pub client_dev: Device,
    pub server_dev: Device,
}

/// Queue sizes of [`RcPair`]'s QPs: room for the deepest pipeline measured (128 writes) and
/// a posting scope's chain of 32 requests of up to 4 SGEs.
pub const CAPS: QpCaps =
    QpCaps { max_send_wr: 256, max_recv_wr: 256, max_send_sge: 4, max_recv_sge: 1, max_inline_data: 64 };

/// Access of both QPs: the peer may write (WRITE benches) and send.
pub const QP_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

fn owned_qp(topo: &testkit::Topology, dev: &Device) -> QueuePair<'static, Rc, Init> {
    let cq = || Arc::new(CompletionQueue::new(dev.ctx.clone(), 512, None).expect("ibv_create_cq"));
    let attr = QpCreateAttr::new(cq(), cq()).caps(CAPS);
    QueuePair::<Rc, Reset>::create(dev.pd.clone(), attr)
        .expect("ibv_create_qp")
        .init(InitAttr::new(topo.port).access(QP_ACCESS))
        .expect("QP to INIT")
}

impl RcPair {
    /// Connects the client device's QP to the server device's (across the veth wire in the VM).
    pub fn connect(topo: &testkit::Topology) -> Self {
        let (client_dev, server_dev) = (Device::open(&topo.client.device), Device::open(&topo.server.device));
        let (a, b) = (owned_qp(topo, &client_dev), owned_qp(topo, &server_dev));
        let ep_a = a.endpoint(topo.gid_index, 1000).expect("client endpoint");
        let ep_b = b.endpoint(topo.gid_index, 2000).expect("server endpoint");
        // A short RNR timer: a bench's receiver is posted again at once.
        let tune = |rtr: RtrAttr, rts| (rtr.min_rnr_timer(1), rts);
        let client = a.handshake_with(ep_b, topo.gid_index, 1000, tune).expect("client QP to RTS");
        let server = b.handshake_with(ep_a, topo.gid_index, 2000, tune).expect("server QP to RTS");
        RcPair { client, server, client_dev, server_dev }
    }
}

/// Calls `poll` until it returns `Some`, checking the deadline [`T`] only every 4096 polls.
///
/// # Panics
/// After [`T`] without a result: `what` did not happen.
pub fn spin<R>(what: &str, mut poll: impl FnMut() -> Option<R>) -> R {
    let mut deadline = None;
    let mut n = 0u32;
    loop {
        if let Some(r) = poll() {
            return r;
        }
        n = n.wrapping_add(1);
        if n % 4096 == 0 {
            let d = *deadline.get_or_insert_with(|| Instant::now() + T);
            assert!(Instant::now() < d, "{what}: nothing after {T:?}");
        }
    }
}

/// Waits for the completion of a send queue's one request in flight and returns its slot.
///
/// # Panics
/// When the request failed or never completed.
pub fn complete_one<T: rdma_verbs::qp::state::Connected>(sq: &mut SendQueue<'static, T>) -> Slot<'static> {
    spin("a send completion", || {
        let mut slot = None;
        sq.poll(|c| {
            c.ok().unwrap_or_else(|e| panic!("request failed: {e}"));
            slot = c.slot;
        })
        .expect("ibv_poll_cq");
        slot
    })
}

/// `n` bytes as the benches name sizes (no spaces, for filters): `8B`, `4KiB`, `64KiB`, `1MiB`.
pub fn size_name(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}
