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
//! In the VM about one connection in a few hundred stalls: no connect response ever comes
//! (`examples/cmtime -c 300` hits it too, even with a 40 s timeout). An attempt still waiting
//! after 2 s is therefore given up, counted, left out of the time and retried; the bench prints
//! how many stalled. Now and then the server's accept gives up on a connection the client
//! completed: in 5 of 30 runs of 200-300 connections, one such (in the run that printed its
//! counts: 283 made, 282 served, 1 accept given up after 2 s, 0 stalls). The bench prints
//! that too, and fails only if a connection never reached the server or the counts cannot add
//! up.
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
use std::time::{Duration, Instant};

use common::T;
use criterion::{criterion_group, criterion_main, Criterion};
use rdma_cm::{CmId, ConnParams, Listener};
use rdma_verbs::{AccessFlags, Context, QpCreateAttr, Rc};

/// The listener's port (fixed, so a capture or a firewall rule can name it).
const PORT: u16 = 7471;

/// The bound on one attempt to connect (and on the server's accept): a setup takes tens of
/// milliseconds in the VM, so an attempt still waiting after this long has stalled.
const ATTEMPT: Duration = Duration::from_secs(2);

/// Accepts connections on fresh QPs, each until its peer disconnects, until `stop` is set.
/// Returns how many it served and how many accepts failed (their client gave up).
fn serve(listener: &Listener, stop: &AtomicBool) -> (u64, u64) {
    let (mut served, mut failed) = (0, 0);
    let mut verbs: Option<Context> = None;
    while !stop.load(Ordering::Relaxed) {
        let req = match listener.recv_request(Duration::from_millis(200)) {
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
        match req.accept(qp, &ConnParams::new()).wait(ATTEMPT) {
            Ok(conn) => {
                conn.peer_disconnect().wait(T).expect("the client disconnects");
                served += 1;
            }
            // The client's attempt stalled and it gave up (it counts the stall).
            Err(_) => failed += 1,
        };
    }
    (served, failed)
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
    let (connections, stalls, (served, refused)) = std::thread::scope(|s| {
        let server = s.spawn(|| serve(&listener, &stop));
        let _stop = StopOnDrop(&stop);
        // The client's verbs resources, opened once through a first resolution.
        let probe = CmId::new().and_then(|id| id.resolve(Some(src), dst).wait(T)).expect("resolving the server");
        let ctx = probe.open_context().expect("opening the client's device");
        drop(probe);
        let pd = ctx.alloc_pd().expect("ibv_alloc_pd");
        let cq = ctx.create_cq(64, None).expect("ibv_create_cq");
        // One connection, set up and torn down; `Err` when the handshake stalled.
        let connect = || -> Result<(), rdma_cm::Error> {
            let id = CmId::new()?.resolve(Some(src), dst).wait(T)?;
            let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).expect("ibv_create_qp");
            let qp = id.init_qp(qp, AccessFlags::empty())?;
            let conn = match id.connect(qp, &ConnParams::new()).wait(ATTEMPT) {
                Err(e) if e.is_timeout() => return Err(e),
                r => r.expect("connect"),
            };
            drop(conn.disconnect().wait(T).expect("disconnect"));
            Ok(())
        };

        let mut g = c.benchmark_group("cm");
        g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
        let (mut connections, mut stalls) = (0u64, 0u64);
        g.bench_function("connect_disconnect", |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    // A stalled attempt is counted and left out of the time, then retried.
                    loop {
                        let t = Instant::now();
                        match connect() {
                            Ok(()) => break timed += t.elapsed(),
                            Err(_) => stalls += 1,
                        }
                    }
                    connections += 1;
                }
                timed
            })
        });
        g.finish();
        drop(_stop);
        (connections, stalls, server.join().expect("the server thread panicked"))
    });
    if stalls > 0 || served != connections {
        println!(
            "cm: {stalls} of {} connection attempts stalled (no connect response within {ATTEMPT:?}) and were \
             left out of the figures; the client made {connections} connections, the server served {served} \
             and gave up on {refused} accepts (its client gave up, or the client's RTU came later than {ATTEMPT:?})",
            connections + stalls
        );
    }
    // Every connection the client made reached the server, and the server served no more than
    // the client made.
    assert!(
        served <= connections && connections <= served + refused,
        "connections made ({connections}) and served ({served}, {refused} accepts given up) do not match"
    );
}

criterion_group!(benches, connection_setup);
criterion_main!(benches);
