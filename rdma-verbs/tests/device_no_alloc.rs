//! Device test: the hot path (post + poll) performs no heap allocation.
//!
//! A counting global allocator counts allocations made by the measuring thread only.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use rdma_verbs::*;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator; counting has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if MEASURING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    MEASURING.with(|m| m.set(true));
    f();
    MEASURING.with(|m| m.set(false));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn post_and_poll_allocate_nothing() {
    let topo = testkit::require_topology!();
    // The counter works: a Vec allocates.
    assert_eq!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))), 1);

    with_rc_pair(&topo, &topo.client.device, &topo.server.device, ALL, |a, b| {
        let mut wcs: [WorkCompletion; 16] = Default::default();
        let remote = b.remote().slice(0, 4096).unwrap();
        let src = [a.mr.sge(0..4096).unwrap()];
        // Warm up once (lazy initialisation in libraries is not the hot path).
        a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            s.post_send(&mut [SendRequest::write(0, &src, remote)]).unwrap();
            s.wait(1, &mut wcs, T).unwrap();
            Ok(())
        })
        .unwrap();

        let n = allocations_during(|| {
            // The safe layer: 200 writes, each posted and polled.
            a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
                for i in 0..200u64 {
                    s.post_send(&mut [SendRequest::write(i, &src, remote)]).unwrap();
                    s.wait(1, &mut wcs, T).unwrap();
                }
                Ok(())
            })
            .unwrap();
            // The raw layer: chains of 4 with one doorbell.
            for i in 0..50u64 {
                let mut chain = [
                    SendRequest::write(i, &src, remote).unsignaled(),
                    SendRequest::write(i, &src, remote).unsignaled(),
                    SendRequest::write(i, &src, remote).unsignaled(),
                    SendRequest::write(i, &src, remote),
                ];
                // SAFETY: a.mr is never sliced; each chain completes before the next.
                unsafe { a.qp.post_send(&mut chain).unwrap() };
                while a.qp.send_cq().poll(&mut wcs).unwrap().is_empty() {}
            }
        });
        assert_eq!(n, 0, "heap allocations on the post/poll path");
    });
}

fn data_caps() -> QpCaps {
    QpCaps { max_send_wr: 256, max_recv_wr: 64, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

const REMOTE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

#[test]
fn the_pipelined_data_path_allocates_nothing_per_request() {
    let topo = testkit::require_topology!();
    let (ctx_s, pd_s) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let qp_s = owned_qp(&topo, &ctx_s, &pd_s, data_caps(), 512, AccessFlags::LOCAL_WRITE);
    let qp_r = owned_qp(&topo, &ctx_r, &pd_r, data_caps(), 512, REMOTE);
    let (qp_s, qp_r) = connect_pair(&topo, qp_s, qp_r);
    let target = MemoryRegion::alloc(pd_r.clone(), 128 * 4096, REMOTE).unwrap();
    let pool = SlotPool::new(pd_s.clone(), 4096, 128, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sq = SendQueue::new(&qp_s, T).unwrap();
    let mut ring =
        RecvRing::new(&qp_r, SlotPool::new(pd_r.clone(), 64, 64, AccessFlags::LOCAL_WRITE).unwrap(), 64, T).unwrap();
    let mut free: Vec<Slot<'static>> = Vec::with_capacity(128);
    let (mut sent, mut received) = (0u32, 0u32);
    const TOTAL: u32 = 2000;
    let n = allocations_during(|| {
        while received < TOTAL {
            // Batches of up to 32 writes-with-immediate per doorbell, up to 128 in flight.
            let mut batch = 0;
            while sent < TOTAL && batch < 32 && sq.room() > 0 {
                let Some(slot) = free.pop().or_else(|| pool.try_take()) else { break };
                let at = target.remote().slice(u64::from(sent % 128) * 4096, 4096).unwrap();
                sq.push(SlotRequest::write(slot, 4096, at).with_imm(sent)).unwrap();
                sent += 1;
                batch += 1;
            }
            if batch > 0 {
                sq.submit().unwrap();
            }
            sq.poll(|c| {
                c.ok().unwrap();
                free.push(c.slot.unwrap());
            })
            .unwrap();
            while let Some(msg) = ring.try_recv().unwrap() {
                assert_eq!(msg.imm(), Some(received));
                received += 1;
                ring.release(msg).unwrap();
            }
        }
        sq.drain(T, |c| free.push(c.slot.unwrap())).unwrap();
    });
    assert_eq!(n, 0, "heap allocations while {TOTAL} writes and their receives went through");
}

/// A 64 MiB file goes file -> sender's slots (pread) -> RDMA WRITE -> receiver's remotely
/// writable slots -> file (pwrite), and arrives identical. No intermediate buffer: neither
/// side allocates during the transfer (there is no heap buffer to copy through), and each
/// `pread`/`pwrite` names a slot's registered bytes (printed, for `strace -e pread64,pwrite64`).
#[test]
fn a_64_mib_file_round_trips_through_slots_without_a_copy() {
    let topo = testkit::require_topology!();
    const CHUNK: usize = 1 << 20;
    const SLOTS: u32 = 8;
    const SIZE: usize = 64 << 20;
    let dir = std::env::temp_dir().join(format!("rdma-verbs-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src_path, dst_path) = (dir.join("source"), dir.join("copy"));
    std::fs::write(&src_path, testkit::random_bytes(SIZE, 0x9e37_79b9_7f4a_7c15)).unwrap();
    let (ctx_s, pd_s) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let qp_s = owned_qp(&topo, &ctx_s, &pd_s, data_caps(), 512, AccessFlags::LOCAL_WRITE);
    let qp_r = owned_qp(&topo, &ctx_r, &pd_r, data_caps(), 512, REMOTE);
    let (qp_s, qp_r) = connect_pair(&topo, qp_s, qp_r);
    let granted = SlotPool::new(pd_r.clone(), CHUNK, SLOTS as usize, REMOTE).unwrap();
    let targets: Vec<Slot<'static>> = (0..SLOTS).map(|_| granted.try_take().unwrap()).collect();
    let grants: Vec<RemoteRegion> = targets.iter().map(Slot::remote).collect();
    let pool = SlotPool::new(pd_s.clone(), CHUNK, SLOTS as usize, AccessFlags::LOCAL_WRITE).unwrap();
    println!(
        "sender slots {:#x}+{:#x}, receiver slots {:#x}+{:#x}",
        pool.remote().addr,
        pool.remote().len,
        granted.remote().addr,
        granted.remote().len
    );
    let dst = std::fs::File::create(&dst_path).unwrap();

    let receiver = std::thread::spawn(move || {
        let notes = SlotPool::new(pd_r.clone(), 64, 32, AccessFlags::LOCAL_WRITE).unwrap();
        let mut ring = RecvRing::new(&qp_r, notes, 32, T).unwrap();
        let mut credits = SendQueue::new(&qp_r, T).unwrap();
        let chunks = (SIZE / CHUNK) as u32;
        let n = allocations_during(|| {
            for _ in 0..chunks {
                let msg = ring.recv(T).unwrap();
                msg.ok().unwrap();
                let (k, chunk) = (msg.imm().unwrap() >> 24, msg.imm().unwrap() & 0xff_ffff);
                let len = msg.write_len() as usize;
                ring.release(msg).unwrap();
                // Straight from the remotely writable slot to the file: no slice, no copy.
                targets[k as usize].write_file(&dst, u64::from(chunk) * CHUNK as u64, len).unwrap();
                while credits.room() == 0 {
                    credits.wait(T, drop).unwrap();
                }
                credits.send_inline(&[], Some(k), 0).unwrap();
                credits.poll(drop).unwrap();
            }
            credits.drain(T, drop).unwrap();
        });
        dst.sync_all().unwrap();
        (n, ctx_r)
    });

    let src = std::fs::File::open(&src_path).unwrap();
    let mut ring =
        RecvRing::new(&qp_s, SlotPool::new(pd_s.clone(), 64, 32, AccessFlags::LOCAL_WRITE).unwrap(), 32, T).unwrap();
    let mut sq = SendQueue::new(&qp_s, T).unwrap();
    let mut free: Vec<Slot<'static>> = Vec::with_capacity(SLOTS as usize);
    let mut remote_free: Vec<u32> = (0..SLOTS).rev().collect();
    let start = std::time::Instant::now();
    let sender_allocations = allocations_during(|| {
        let mut offset = 0usize;
        while offset < SIZE {
            while let Some(msg) = ring.try_recv().unwrap() {
                remote_free.push(msg.imm().unwrap());
                ring.release(msg).unwrap();
            }
            sq.poll(|c| {
                c.ok().unwrap();
                free.push(c.slot.unwrap());
            })
            .unwrap();
            let mut batch = 0;
            while offset < SIZE && !remote_free.is_empty() {
                let Some(mut slot) = free.pop().or_else(|| pool.try_take()) else { break };
                let k = remote_free.pop().unwrap();
                // Straight from the file into the registered slot.
                let len = slot.read_file(&src, offset as u64, CHUNK).unwrap();
                let chunk = (offset / CHUNK) as u32;
                sq.push(SlotRequest::write(slot, len, grants[k as usize]).with_imm(k << 24 | chunk)).unwrap();
                offset += len;
                batch += 1;
            }
            if batch > 0 {
                sq.submit().unwrap();
            }
        }
        sq.drain(T, |c| free.push(c.slot.unwrap())).unwrap();
    });
    let (receiver_allocations, _ctx_r) = receiver.join().unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!("64 MiB file -> slots -> WRITE -> slots -> file in {secs:.1} s ({:.0} MB/s)", SIZE as f64 / secs / 1e6);
    assert_eq!((sender_allocations, receiver_allocations), (0, 0), "heap allocations during the transfer");
    // Compare content, chunk by chunk.
    let (a, b) = (std::fs::read(&src_path).unwrap(), std::fs::read(&dst_path).unwrap());
    assert_eq!(a.len(), b.len());
    let first_difference = a.iter().zip(&b).position(|(x, y)| x != y);
    assert_eq!(first_difference, None, "the copy differs from the source");
    std::fs::remove_dir_all(&dir).unwrap();
    drop(ctx_s);
}
