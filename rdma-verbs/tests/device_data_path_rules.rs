//! Device tests of the ownership rules of the data path: a slot returns only with its completion,
//! a ring never posts past its capacity, an SRQ has one ring, and a CQ changes owners empty.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rdma_verbs::*;

/// One ring owns an SRQ, and every QP of it must use the ring's CQ: were the SRQ's receives
/// completed on another CQ, a send queue there (whose generation could repeat) might count them
/// as its own sends and hand back slots of READs still in flight.
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

/// `release` re-posts only up to the ring's depth: re-posting whatever it was given, a ring
/// could have more receives posted after a `refill` than its depth (and than its CQ was sized
/// for).
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

/// A send queue dropped with a 1 MiB READ in flight, on a QP someone else still holds, hands
/// the slot back only with its (flushed) completion: the QP ends in the error state, never
/// reset, and nothing changes behind the slice. rxe can finish copying a packet of the READ
/// response after a reset returns (4 KiB have landed behind a live slice that way), so a
/// reset after the drain timeout would not do.
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

#[test]
fn a_ring_that_destroys_its_srq_leaves_no_completion_behind_in_its_cq() {
    let topo = testkit::require_topology!();
    let SrqSetup { pool, recv_cq, srq, ring, server, client } = srq_setup(&topo);
    // Five receives complete; the application never takes them.
    send_messages(&client, 5);
    std::thread::sleep(Duration::from_millis(200));
    // The ring becomes the SRQ's last holder, and its drop destroys the SRQ.
    drop((server, srq));
    drop(ring);
    assert_eq!(pool.available(), 16, "every slot is back in the pool");
    // The next owner of the CQ must find nothing of the old ring's: with a wrapped generation
    // it would take those completions for receives of its own that the NIC still holds.
    let mut wcs: [WorkCompletion; 16] = Default::default();
    let left = recv_cq.poll(&mut wcs).unwrap().len();
    assert_eq!(left, 0, "{left} completions of a dropped ring were left in its CQ for the next owner");
}

#[test]
fn a_ring_dropped_before_its_srq_keeps_the_srq_and_cq_from_other_owners() {
    let topo = testkit::require_topology!();
    let SrqSetup { pool, recv_cq, srq, ring, server, client } = srq_setup(&topo);
    send_messages(&client, 2);
    // Dropped while the QP and our handle still hold the SRQ: its 8 receives stay posted there.
    drop(ring);
    assert_eq!(pool.available(), 8, "the posted slots stay out of the pool while the SRQ lives");
    // They can still be consumed: no other ring may own the SRQ or the CQ meanwhile.
    let again = RecvRing::with_srq(srq.clone(), recv_cq.clone(), pool.clone(), 4, T);
    assert!(matches!(again, Err(Error::Busy { .. })), "a second ring on the SRQ: {again:?}");
    let mut wcs: [WorkCompletion; 4] = Default::default();
    assert!(matches!(recv_cq.poll(&mut wcs), Err(Error::Busy { .. })), "the CQ is not free to poll");
    send_messages(&client, 3);
    // The SRQ goes with its last holder, and gives every slot back.
    drop((server, srq));
    assert_eq!(pool.available(), 16, "the SRQ returned the slots when it was destroyed");
}
