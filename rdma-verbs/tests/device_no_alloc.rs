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
