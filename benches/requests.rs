//! Building, checking and linking work requests, with and without the device's round trip.
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `requests_build/SendRequest::write_x32` | 64 `MemoryRegion::sge` (bounds-checked) and 32 `SendRequest::write` of 2 SGEs each: a chain as the posting scope takes it, not posted |
//! | `requests_build/Request::write_x32` | 32 slots taken from a `SlotPool`, each moved into a `Request::write`, then dropped (the slots go back): the owned-buffer path's per-request work, not posted |
//! | `requests_post/scope_chain/N` | a posting scope (`QueuePair::scope`): N WRITEs of 2 SGEs (16 B) built, checked and linked into one chain, one doorbell, then waited for (N signaled completions), N = 1 and 32 |
//! | `requests_post/send_queue_chain/N` | `SendQueue::push` of N `Request::write` (8 B), one `submit` (one doorbell, the last signaled), polled until every slot is back, N = 1 and 32 |
//!
//! The `requests_post` figures include the device: the chain's WRITEs cross the wire
//! (rxe1 -> rxe0 in the VM) and the last one's completion ends the iteration. The difference
//! between N = 32 and N = 1, divided by 31, is what one more request in a chain costs. The
//! library's checking and linking of a chain (`wr::link_send`) is private to `rdma-verbs`, so
//! it is measured as part of the post, not alone.
//!
//! The slots, regions and QPs need a device (a slot pool is registered memory):
//! ```sh
//! scripts/bench -- requests_          # in the Soft-RoCE VM, results in target/criterion
//! cargo bench --bench requests        # on a host with RDMA devices
//! ```
//! Without a device it prints one line and measures nothing; under `RDMA_TEST_REQUIRE_DEVICE=1`
//! (set in the VM) a missing device fails.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{spin, RcPair, QP_ACCESS, T};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_verbs::*;

const CHAIN: usize = 32;
/// Bytes each SGE of the scope's requests names.
const SGE_LEN: usize = 8;

fn requests(c: &mut Criterion) {
    let Some(topo) = common::topology("requests", "building and posting work requests") else { return };
    let pair = RcPair::connect(&topo);
    let src = MemoryRegion::alloc(pair.client_dev.pd.clone(), 64 << 10, AccessFlags::LOCAL_WRITE).expect("source");
    let target = MemoryRegion::alloc(pair.server_dev.pd.clone(), 64 << 10, QP_ACCESS).expect("target region");
    let remote = target.remote();
    // Request `i` writes 2 SGEs from [i KiB, i KiB + 16) to the same place at the peer.
    let part = |i: usize, half: usize| {
        let at = i * 1024 + half * SGE_LEN;
        src.sge(at..at + SGE_LEN)
    };
    let dest = |i: usize| remote.slice(i as u64 * 1024, 2 * SGE_LEN as u64).expect("within the target");

    let mut g = c.benchmark_group("requests_build");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(CHAIN as u64));
    g.bench_function("SendRequest::write_x32", |b| {
        b.iter(|| {
            let sges: [[Sge<'_>; 2]; CHAIN] =
                std::array::from_fn(|i| [part(i, 0).expect("in bounds"), part(i, 1).expect("in bounds")]);
            let wrs: [SendRequest<'_, '_>; CHAIN] =
                std::array::from_fn(|i| SendRequest::write(i as u64, &sges[i], dest(i)).unsignaled());
            black_box(&wrs);
        })
    });
    let pool = SlotPool::new(pair.client_dev.pd.clone(), 1024, CHAIN, AccessFlags::LOCAL_WRITE).expect("pool");
    let mut staged: Vec<SlotRequest<'static>> = Vec::with_capacity(CHAIN);
    g.bench_function("Request::write_x32", |b| {
        b.iter(|| {
            staged.extend((0..CHAIN).map(|i| SlotRequest::write(pool.try_take().expect("a free slot"), 16, dest(i))));
            black_box(&staged);
            staged.clear(); // the slots return to the pool
        })
    });
    g.finish();

    let mut g = c.benchmark_group("requests_post");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mut wcs = [WorkCompletion::default(); CHAIN];
    for n in [1, CHAIN] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("scope_chain", n), |b| {
            b.iter(|| {
                pair.client
                    .scope(T, |s| -> Result<()> {
                        let sges: [[Sge<'_>; 2]; CHAIN] =
                            std::array::from_fn(|i| [part(i, 0).unwrap(), part(i, 1).unwrap()]);
                        let mut wrs: [SendRequest<'_, '_>; CHAIN] =
                            std::array::from_fn(|i| SendRequest::write(i as u64, &sges[i], dest(i)));
                        s.post_send(&mut wrs[..n])?;
                        for wc in s.wait(n, &mut wcs, T)? {
                            wc.ok()?;
                        }
                        Ok(())
                    })
                    .expect("posting and completing the chain")
            })
        });
    }
    // After the scopes: a send queue owns the send CQ while it lives.
    let mut sq = SendQueue::new(&pair.client, T).expect("SendQueue::new");
    let mut free: Vec<Slot<'static>> = Vec::with_capacity(CHAIN);
    for n in [1, CHAIN] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(BenchmarkId::new("send_queue_chain", n), |b| {
            b.iter(|| {
                for i in 0..n {
                    let slot = free.pop().or_else(|| pool.try_take()).expect("a free slot");
                    sq.push(SlotRequest::write(slot, 8, dest(i))).map_err(Error::from).expect("push");
                }
                sq.submit().expect("ibv_post_send");
                let mut back = 0;
                spin("the chain's completion", || {
                    back += sq
                        .poll(|c| {
                            c.ok().unwrap_or_else(|e| panic!("WRITE failed: {e}"));
                            free.extend(c.slot);
                        })
                        .expect("ibv_poll_cq");
                    (back == n).then_some(())
                });
            })
        });
    }
    g.finish();
}

criterion_group!(benches, requests);
criterion_main!(benches);
