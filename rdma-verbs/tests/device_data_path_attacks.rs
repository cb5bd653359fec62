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
    let msg = ring.next(T).unwrap();
    assert_eq!(ring.posted(), 3);
    assert_eq!(ring.refill().unwrap(), 1, "refill tops the ring up to its depth");
    ring.release(msg).unwrap();
    assert_eq!(ring.posted(), 4, "release beyond the depth returns the slot to the pool");
    assert_eq!(pool.available(), 4);
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}
