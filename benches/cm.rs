//! Connection setup and teardown through the connection manager (`rdma-cm`).
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `cm/connect_disconnect` | from the client address: `CmId::new`, resolve address and route, create and initialise an RC QP, `connect` (the server thread accepts on a fresh QP of its own), then `disconnect` and destroy |
//!
//! The listener is bound once, on the topology's server address and port 7471 (10.77.0.1 in the
//! Soft-RoCE VM); clients leave from its client address (10.77.0.2), so every handshake crosses
//! the veth wire. The verbs context, PD and CQ of each side are opened once, as in
//! `examples/cmtime.rs`, which times each step of the same sequence.
//!
//! ```sh
//! scripts/bench -- cm/              # in the Soft-RoCE VM, results in target/criterion
//! cargo bench --bench cm            # on a host with RDMA devices (RDMA_TEST_* picks them)
//! ```
//! Without a device it prints one line and measures nothing; under `RDMA_TEST_REQUIRE_DEVICE=1`
//! (set in the VM) a missing device fails.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::T;
use criterion::{criterion_group, criterion_main, Criterion};
use rdma_cm::{CmId, ConnParams, Listener};
use rdma_verbs::{AccessFlags, Context, QpCreateAttr, Rc};

/// The listener's port (fixed, so a capture or a firewall rule can name it).
const PORT: u16 = 7471;

/// Accepts connections on fresh QPs, each until its peer disconnects, until `stop` is set.
/// Returns how many it served.
fn serve(listener: &Listener, stop: &AtomicBool) -> u64 {
    let mut served = 0;
    let mut verbs: Option<Context> = None;
    while !stop.load(Ordering::Relaxed) {
        let req = match listener.get_request(Duration::from_millis(200)) {
            Ok(req) => req,
            Err(e) if e.is_timeout() => continue,
            Err(e) => panic!("listener: {e}"),
        };
        if verbs.is_none() {
            verbs = Some(req.open_context().expect("opening the listener's device"));
        }
        let ctx = verbs.as_ref().expect("opened");
        let pd = ctx.alloc_pd().expect("ibv_alloc_pd");
        let cq = ctx.create_cq(4, None).expect("ibv_create_cq");
        let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).expect("ibv_create_qp");
        let qp = req.init_qp(qp, AccessFlags::empty()).expect("server QP to INIT");
        let conn = req.accept(qp, &ConnParams::new(), T).expect("accept");
        conn.wait_disconnected(T).expect("the client disconnects");
        served += 1;
    }
    served
}

/// Sets the flag when dropped: the server thread stops even if a client panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn connection_setup(c: &mut Criterion) {
    let Some(topo) = common::topology("cm", "connection setup") else { return };
    let dst = SocketAddr::new(topo.server.addr.into(), PORT);
    let src = SocketAddr::new(topo.client.addr.into(), 0);
    let listener = Listener::bind(dst, 16).unwrap_or_else(|e| panic!("listening on {dst}: {e}"));
    let stop = AtomicBool::new(false);
    let served = std::thread::scope(|s| {
        let server = s.spawn(|| serve(&listener, &stop));
        let _stop = StopOnDrop(&stop);
        // The client's verbs resources, opened once through a first resolution.
        let probe = CmId::new().and_then(|id| id.resolve(Some(src), dst, T)).expect("resolving the server");
        let ctx = probe.open_context().expect("opening the client's device");
        drop(probe);
        let pd = ctx.alloc_pd().expect("ibv_alloc_pd");
        let cq = ctx.create_cq(64, None).expect("ibv_create_cq");

        let mut g = c.benchmark_group("cm");
        g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
        let mut connections = 0u64;
        g.bench_function("connect_disconnect", |b| {
            b.iter(|| {
                let id = CmId::new().expect("rdma_create_id").resolve(Some(src), dst, T).expect("resolving");
                let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).expect("ibv_create_qp");
                let qp = id.init_qp(qp, AccessFlags::empty()).expect("client QP to INIT");
                let conn = id.connect(qp, &ConnParams::new(), T).expect("connect");
                drop(conn.disconnect(T).expect("disconnect"));
                connections += 1;
            })
        });
        g.finish();
        drop(_stop);
        let served = server.join().expect("the server thread panicked");
        (connections, served)
    });
    assert_eq!(served.0, served.1, "connections made and served differ");
}

criterion_group!(benches, connection_setup);
criterion_main!(benches);
