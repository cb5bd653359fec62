//! The data path and control verbs on a real device, through the safe APIs users call.
//!
//! | group | what one iteration is |
//! |---|---|
//! | `latency/write/SIZE` | `SendQueue::post` of one RDMA WRITE (8 B, 4 KiB, 64 KiB) from a slot, polled until its completion gives the slot back |
//! | `latency/send/SIZE` | the same with a SEND, and the receiver taking the message from its `RecvRing` and releasing it (re-posting the receive) |
//! | `write_bw/depthD/SIZE` | 4 MiB of WRITEs of SIZE (4 KiB, 64 KiB, 1 MiB) from a `SlotPool` of `D` slots through a `SendQueue`, `D` (64, 128) kept in flight; throughput in bytes |
//! | `mr_register/SIZE`, `mr_deregister/SIZE` | `ibv_reg_mr` (`ProtectionDomain::register`) and `ibv_dereg_mr` (`MemoryRegion::into_inner`) of an already-touched buffer of 4 KiB .. 256 MiB |
//! | `poll_empty/...` | one poll of an empty CQ: `CompletionQueue::poll`, `SendQueue::poll`, `RecvRing::try_recv` |
//!
//! The connection is RC from the topology's client device to its server device (rxe1 -> rxe0
//! in the Soft-RoCE VM, across the veth wire; see `testkit`). The bandwidth stream never
//! drains between iterations or samples: each slot is re-posted as soon as its completion
//! comes back (a completion every `D/4` writes, at most 256 KiB apart), and `iter_custom`
//! times the steady state from one completion to the one that reaches the bytes wanted.
//!
//! ```sh
//! scripts/bench -- latency           # in the Soft-RoCE VM, results in target/criterion
//! cargo bench --bench verbs          # on a host with RDMA devices (RDMA_TEST_* picks them)
//! ```
//! Without a device it prints one line and measures nothing; under `RDMA_TEST_REQUIRE_DEVICE=1`
//! (set in the VM) a missing device fails.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{complete_one, size_name, spin, Device, RcPair, QP_ACCESS, T};
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use rdma_verbs::*;

const NOT_MEASURED: &str = "latency, bandwidth, registration and CQ polls";

fn verbs(c: &mut Criterion) {
    let Some(topo) = common::topology("verbs", NOT_MEASURED) else { return };
    let pair = RcPair::connect(&topo);
    // The server's receives, posted for the whole run: dropping a ring with receives posted
    // flushes its QP (the connection would end).
    let inbox =
        SlotPool::new(pair.server_dev.pd.clone(), 64 << 10, 16, AccessFlags::LOCAL_WRITE).expect("receive pool");
    let mut ring = RecvRing::new(&pair.server, inbox, 16, T).expect("RecvRing::new");
    latency(c, &pair, &mut ring);
    bandwidth(c, &pair);
    registration(c, &pair.server_dev);
    empty_polls(c, &pair, &mut ring);
}

/// One request at a time: post, then poll until it completed.
fn latency(c: &mut Criterion, pair: &RcPair, ring: &mut RecvRing<'static>) {
    const SIZES: [usize; 3] = [8, 4 << 10, 64 << 10];
    let max = SIZES[SIZES.len() - 1];
    let mut g = c.benchmark_group("latency");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));

    let mut sq = SendQueue::new(&pair.client, T).expect("SendQueue::new");
    let src = SlotPool::new(pair.client_dev.pd.clone(), max, 1, AccessFlags::LOCAL_WRITE).expect("source pool");
    let mut slot = src.try_take();
    // The WRITE target: a remotely writable region on the server.
    let target = MemoryRegion::alloc(pair.server_dev.pd.clone(), max, QP_ACCESS).expect("target region");
    let remote = target.remote();
    for size in SIZES {
        g.bench_function(BenchmarkId::new("write", size_name(size)), |b| {
            b.iter(|| {
                let s = slot.take().expect("the slot is back");
                sq.post(SlotRequest::write(s, size, remote)).map_err(Error::from).expect("posting a WRITE");
                slot = Some(complete_one(&mut sq));
            })
        });
    }

    // SEND: into the server's ring (not remotely writable: a message is a plain slice).
    for size in SIZES {
        g.bench_function(BenchmarkId::new("send", size_name(size)), |b| {
            b.iter(|| {
                let s = slot.take().expect("the slot is back");
                sq.post(SlotRequest::send(s, size)).map_err(Error::from).expect("posting a SEND");
                let msg = spin("a received message", || ring.try_recv().expect("polling the ring"));
                msg.ok().expect("the receive completed");
                assert_eq!(black_box(msg.bytes()).len(), size);
                ring.release(msg).expect("re-posting the receive");
                slot = Some(complete_one(&mut sq));
            })
        });
    }
    g.finish();
}

/// Bytes of WRITEs in one iteration of a bandwidth benchmark.
const BW_ITERATION: usize = 4 << 20;

/// A stream of WRITEs kept running across criterion's calls, so that every measurement is of
/// the steady state: `depth` slots, each free or in flight; the pipeline is topped up after
/// every poll and never drained between samples (only after the benchmark).
struct Stream {
    _pool: SlotPool<'static>,
    free: Vec<Slot<'static>>,
    _target: MemoryRegion<'static>,
    remote: RemoteRegion,
    size: usize,
    signal_every: u64,
    posted: u64,
}

impl Stream {
    /// `depth` slots of `size` bytes on the client, one region of `size` bytes at the server
    /// that every WRITE targets (as perftest does).
    fn new(pair: &RcPair, size: usize, depth: u32) -> Self {
        let pool = SlotPool::new(pair.client_dev.pd.clone(), size, depth as usize, AccessFlags::LOCAL_WRITE)
            .expect("source pool");
        let free: Vec<Slot<'static>> = std::iter::from_fn(|| pool.try_take()).collect();
        let target = MemoryRegion::alloc(pair.server_dev.pd.clone(), size, QP_ACCESS).expect("target region");
        let remote = target.remote();
        // A completion every `depth / 4` writes keeps 3/4 of the pipeline busy; at most every
        // 256 KiB, so that the clock starts and stops at fine steps.
        let signal_every = ((256 << 10) / size).clamp(1, depth as usize / 4) as u64;
        Stream { _pool: pool, free, _target: target, remote, size, signal_every, posted: 0 }
    }

    /// Posts a WRITE from every free slot (one doorbell, whose last request is signaled too),
    /// polls once, and returns how many WRITEs completed.
    fn step(&mut self, sq: &mut SendQueue<'static, Rc>) -> u64 {
        while let Some(slot) = self.free.pop() {
            self.posted += 1;
            let wr = SlotRequest::write(slot, self.size, self.remote);
            sq.push(if self.posted % self.signal_every == 0 { wr.signaled() } else { wr })
                .map_err(Error::from)
                .expect("pushing a WRITE");
        }
        sq.submit().expect("ibv_post_send");
        let free = &mut self.free;
        sq.poll(|c| {
            c.ok().unwrap_or_else(|e| panic!("WRITE failed: {e}"));
            free.extend(c.slot);
        })
        .expect("ibv_poll_cq") as u64
    }

    /// The time `want` WRITEs take in the steady state: the clock starts at a completion and
    /// stops at the one that reaches `want`, and the time is scaled from the WRITEs completed
    /// in between (completions come `signal_every` at a time).
    fn measure(&mut self, sq: &mut SendQueue<'static, Rc>, want: u64) -> Duration {
        spin("a WRITE completion", || (self.step(sq) > 0).then_some(()));
        let start = Instant::now();
        let mut done = 0;
        while done < want {
            // Between completions the stream may take longer than `T` in all: wait per step.
            done += spin("a WRITE completion", || Some(self.step(sq)).filter(|&n| n > 0));
        }
        start.elapsed().mul_f64(want as f64 / done as f64)
    }

    /// Waits for every WRITE in flight (before the slots and regions go).
    ///
    /// Up to `depth` WRITEs are in flight: 127 MiB at depth 128 of 1 MiB took rxe under TCG
    /// 5.9-7.3 s to finish in the VM here, and over `T` (10 s) on a CI machine. The wait allows
    /// `T` plus 0.5 s per MiB in flight.
    fn drain(mut self, sq: &mut SendQueue<'static, Rc>) {
        let in_flight = sq.in_flight() as u64 * self.size as u64;
        let timeout = T + Duration::from_secs(in_flight / (2 << 20));
        sq.drain(timeout, |c| {
            c.ok().unwrap_or_else(|e| panic!("WRITE failed: {e}"));
            self.free.extend(c.slot);
        })
        .expect("draining the WRITE stream");
    }
}

/// WRITE bandwidth through a slot pool and a send queue, the pipeline kept full.
fn bandwidth(c: &mut Criterion, pair: &RcPair) {
    const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
    let mut g = c.benchmark_group("write_bw");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    g.sampling_mode(SamplingMode::Flat);
    // One iteration is 4 MiB of WRITEs, whatever their size.
    g.throughput(Throughput::Bytes(BW_ITERATION as u64));
    let mut sq = SendQueue::new(&pair.client, T).expect("SendQueue::new");
    for depth in [64u32, 128] {
        for size in SIZES {
            // Built when the benchmark runs (not when a filter skips it): up to 128 MiB.
            let mut stream = None;
            g.bench_function(BenchmarkId::new(format!("depth{depth}"), size_name(size)), |b| {
                let stream = stream.get_or_insert_with(|| Stream::new(pair, size, depth));
                b.iter_custom(|iters| stream.measure(&mut sq, iters * (BW_ITERATION / size) as u64))
            });
            if let Some(stream) = stream {
                stream.drain(&mut sq);
            }
        }
    }
    g.finish();
}

/// `ibv_reg_mr` and `ibv_dereg_mr` against size, on a buffer whose pages are already present.
fn registration(c: &mut Criterion, dev: &Device) {
    const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20];
    let access = AccessFlags::LOCAL_WRITE;
    for (register, name) in [(true, "mr_register"), (false, "mr_deregister")] {
        let mut g = c.benchmark_group(name);
        g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
        for size in SIZES {
            g.throughput(Throughput::Bytes(size as u64));
            if size >= 16 << 20 {
                g.sample_size(10).sampling_mode(SamplingMode::Flat);
            } else {
                g.sample_size(20).sampling_mode(SamplingMode::Auto);
            }
            let mut fixture = None;
            g.bench_function(size_name(size), |b| {
                let buf = fixture.get_or_insert_with(|| {
                    let mut buf = AlignedBuffer::zeroed(size).expect("allocating the buffer");
                    // Fault every page in now: the measurement is of pinning, not of page faults.
                    buf.as_mut_slice().iter_mut().step_by(4096).for_each(|b| *b = 1);
                    Some(buf)
                });
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        let t = Instant::now();
                        let mr = dev.pd.register(buf.take().expect("the buffer is back"), access).expect("ibv_reg_mr");
                        let reg = t.elapsed();
                        let t = Instant::now();
                        *buf = Some(mr.into_inner().expect("ibv_dereg_mr"));
                        timed += if register { reg } else { t.elapsed() };
                    }
                    timed
                })
            });
        }
        g.finish();
    }
}

/// One poll that finds nothing, through each API.
fn empty_polls(c: &mut Criterion, pair: &RcPair, ring: &mut RecvRing<'static>) {
    let mut g = c.benchmark_group("poll_empty");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let cq = CompletionQueue::new(pair.client_dev.ctx.clone(), 64, None).expect("ibv_create_cq");
    let mut wcs = [WorkCompletion::default(); 32];
    g.bench_function("CompletionQueue::poll", |b| {
        b.iter(|| assert!(cq.poll(black_box(&mut wcs)).expect("ibv_poll_cq").is_empty()))
    });
    let mut sq = SendQueue::new(&pair.client, T).expect("SendQueue::new");
    g.bench_function("SendQueue::poll", |b| {
        b.iter(|| assert_eq!(sq.poll(|_| unreachable!("nothing is in flight")).expect("ibv_poll_cq"), 0))
    });
    g.bench_function("RecvRing::try_recv", |b| b.iter(|| assert!(ring.try_recv().expect("ibv_poll_cq").is_none())));
    g.finish();
}

criterion_group!(benches, verbs);
criterion_main!(benches);
