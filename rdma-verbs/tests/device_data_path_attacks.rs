//! Device tests: attacks from an adversarial review of the data path (slot pools, send
//! queues, receive rings), kept as regressions. Each failed on the code before its fix.

mod common;

use std::sync::Arc;

use common::*;
use rdma_verbs::*;

fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps { max_send_wr: send, max_recv_wr: recv, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Before: a ring took any SRQ, and QPs of the SRQ could complete its receives on another CQ,
/// where a send queue (whose generation could repeat) might count them as its own sends and
/// hand back slots of READs still in flight. Now one ring owns an SRQ and every QP of it must
/// use the ring's CQ.
#[test]
fn an_srq_has_one_ring_and_one_receive_cq() {
    let topo = testkit::require_topology!();
    let (ctx, pd) = open_shared(&topo.server.device);
    let ring_cq = Arc::new(CompletionQueue::new(ctx.clone(), 64, None).unwrap());
    let other_cq = Arc::new(CompletionQueue::new(ctx.clone(), 64, None).unwrap());
    let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), 64, None).unwrap());
    let pool = SlotPool::new(pd.clone(), 64, 32, AccessFlags::LOCAL_WRITE).unwrap();

    // A QP of the SRQ already completing on another CQ: the ring is refused.
    let srq = Arc::new(SharedReceiveQueue::new(pd.clone(), 64, 1).unwrap());
    let early = QpCreateAttr::new(send_cq.clone(), other_cq.clone()).srq(srq.clone()).caps(caps(4, 0));
    let _early = QueuePair::<Rc, Reset>::create(pd.clone(), early).unwrap();
    let refused = RecvRing::with_srq(srq.clone(), ring_cq.clone(), pool.clone(), 8, T);
    assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{refused:?}");

    // A fresh SRQ: the ring attaches; a QP with another receive CQ is refused, one with the
    // ring's CQ is not, and a second ring is busy.
    let srq = Arc::new(SharedReceiveQueue::new(pd.clone(), 64, 1).unwrap());
    let ring = RecvRing::with_srq(srq.clone(), ring_cq.clone(), pool.clone(), 8, T).unwrap();
    let wrong = QpCreateAttr::new(send_cq.clone(), other_cq.clone()).srq(srq.clone()).caps(caps(4, 0));
    let wrong = QueuePair::<Rc, Reset>::create(pd.clone(), wrong);
    assert!(matches!(wrong, Err(Error::InvalidArgument { .. })), "{wrong:?}");
    let right = QpCreateAttr::new(send_cq.clone(), ring_cq.clone()).srq(srq.clone()).caps(caps(4, 0));
    let _right = QueuePair::<Rc, Reset>::create(pd.clone(), right).unwrap();
    let second_cq = Arc::new(CompletionQueue::new(ctx.clone(), 64, None).unwrap());
    let second = RecvRing::with_srq(srq.clone(), second_cq, pool.clone(), 8, T);
    assert!(matches!(second, Err(Error::Busy { .. })), "{second:?}");
    drop(ring);
}

/// Before: `release` re-posted whatever it was given, so after a `refill` a ring could have
/// more receives posted than its depth (and than its CQ was sized for).
#[test]
fn a_ring_never_posts_more_than_its_depth() {
    let topo = testkit::require_topology!();
    let (ctx_s, pd_s) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let qp_s = owned_qp(&topo, &ctx_s, &pd_s, caps(16, 4), 32, AccessFlags::LOCAL_WRITE);
    let qp_r = owned_qp(&topo, &ctx_r, &pd_r, caps(4, 16), 32, AccessFlags::LOCAL_WRITE);
    let (qp_s, qp_r) = connect_pair(&topo, qp_s, qp_r);
    let pool = SlotPool::new(pd_r, 64, 8, AccessFlags::LOCAL_WRITE).unwrap();
    let mut ring = RecvRing::new(&qp_r, pool.clone(), 4, T).unwrap();
    let mut sq = SendQueue::new(&qp_s, T).unwrap();
    sq.send_inline(b"one", None, 1).unwrap();
    let msg = ring.recv(T).unwrap();
    assert_eq!(ring.posted(), 3);
    assert_eq!(ring.refill().unwrap(), 1, "refill tops the ring up to its depth");
    ring.release(msg).unwrap();
    assert_eq!(ring.posted(), 4, "release beyond the depth returns the slot to the pool");
    assert_eq!(pool.available(), 4);
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}

fn changed_bytes(p: *const u8, len: usize) -> usize {
    // SAFETY: the caller passes a pointer into a live slice of at least `len` bytes.
    (0..len).filter(|&i| unsafe { std::ptr::read_volatile(p.add(i)) } != 0).count()
}

/// Before: a send queue dropped with a 1 MiB READ in flight, on a QP someone else still held,
/// flushed the QP, waited only its drain timeout for the flushed completion, then reset the
/// QP and handed the slot back. rxe can finish copying a packet of the READ response after the
/// reset returns (CI saw 4 KiB land behind a live slice that way in a posting scope). Now the
/// slot returns only with its (flushed) completion, so the QP ends in the error state, never
/// reset, and nothing changes behind the slice.
#[test]
fn a_slot_returns_from_a_dropped_queue_only_with_its_completion() {
    let topo = testkit::require_topology!();
    let (ctx_a, pd_a) = open_shared(&topo.client.device);
    let (ctx_b, pd_b) = open_shared(&topo.server.device);
    const LEN: usize = 1 << 20;
    let remote = MemoryRegion::alloc(pd_b.clone(), LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
    remote.write_at(0, &vec![0x5a; LEN]).unwrap();
    let pool = SlotPool::new(pd_a.clone(), LEN, 1, AccessFlags::LOCAL_WRITE).unwrap();
    let mut changed = Vec::new();
    for run in 0..16 {
        let qa = owned_qp(&topo, &ctx_a, &pd_a, caps(4, 4), 8, AccessFlags::LOCAL_WRITE);
        let qb = owned_qp(&topo, &ctx_b, &pd_b, caps(4, 4), 8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ);
        let (qa, _qb) = connect_pair(&topo, qa, qb);
        let mut sq = SendQueue::new(&qa, std::time::Duration::ZERO).unwrap();
        sq.push(SlotRequest::read(pool.try_take().unwrap(), LEN, remote.remote())).unwrap();
        sq.submit().unwrap();
        drop(sq);
        let state = qa.state().unwrap();
        let Some(mut slot) = pool.try_take() else {
            panic!("run {run}: the slot was leaked although its completion came (QP {state:?})");
        };
        let s = slot.as_mut_slice().unwrap();
        s.fill(0);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let nz = changed_bytes(s.as_ptr(), LEN);
        eprintln!("run {run}: QP {state:?} after the drop; {nz} bytes changed behind the slice");
        assert_ne!(state, QpState::Reset, "run {run}: the queue reset the QP instead of waiting for the flush");
        if nz != 0 {
            changed.push((run, nz));
        }
    }
    assert!(changed.is_empty(), "late READ data behind a live &mut [u8]: {changed:?}");
}
