//! Device tests: what the second adversarial review of the data path found, each attacked with
//! safe code only. Each test failed (or hung) on the code before its fix.
//!
//! - a receive ring that destroys its SRQ leaves its completed, untaken receives in the CQ,
//!   where a later owner whose `wr_id` generation wrapped around takes them for its own;
//! - waits with nothing to wait for (`Duration::MAX`) spin forever;
//! - an address handle of another protection domain or device is accepted.

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Runs `f` on its own thread and returns its result, or fails the test if it has not
/// returned after `limit` (the thread is left behind: a hang must fail, not hang the suite).
fn returns_within<R: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("{what}: still waiting after {limit:?}"))
}

fn caps(send: u32, recv: u32) -> QpCaps {
    QpCaps { max_send_wr: send, max_recv_wr: recv, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Whether `e` is the error of a wait that nothing can end.
fn nothing_to_wait_for(e: &Error) -> bool {
    // By name, so that this file also builds against the code before the fix (which lacks the
    // variant) and shows how it failed there.
    format!("{e:?}").starts_with("NothingToWaitFor")
}

/// Sends `n` inline messages from `client` and waits until the peer acknowledged them all.
fn send_messages(client: &QueuePair<'static, Rc, ReadyToSend>, n: u64) {
    let mut sq = SendQueue::new(client, T).unwrap();
    for i in 0..n {
        sq.send_inline(&i.to_le_bytes(), None, i).unwrap();
    }
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}

/// A ring of 8 receives on an SRQ whose one QP is connected to a client on the other device.
struct SrqSetup {
    pool: SlotPool<'static>,
    recv_cq: Arc<CompletionQueue<'static>>,
    srq: Arc<SharedReceiveQueue<'static>>,
    ring: RecvRing<'static>,
    server: QueuePair<'static, Rc, ReadyToSend>,
    client: QueuePair<'static, Rc, ReadyToSend>,
}

fn srq_setup(topo: &testkit::Topology) -> SrqSetup {
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let srq = Arc::new(SharedReceiveQueue::new(pd_r.clone(), 16, 1).unwrap());
    let recv_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 64, None).unwrap());
    let pool = SlotPool::new(pd_r.clone(), 64, 16, AccessFlags::LOCAL_WRITE).unwrap();
    let ring = RecvRing::with_srq(srq.clone(), recv_cq.clone(), pool.clone(), 8, T).unwrap();
    let send_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 16, None).unwrap());
    let attr = QpCreateAttr::new(send_cq, recv_cq.clone()).srq(srq.clone()).caps(caps(16, 0));
    let server = QueuePair::<Rc, Reset>::create(pd_r.clone(), attr)
        .unwrap()
        .init(InitAttr::new(topo.port).access(AccessFlags::LOCAL_WRITE))
        .unwrap();
    let client = owned_qp(topo, &ctx_c, &pd_c, caps(16, 1), 16, AccessFlags::LOCAL_WRITE);
    let (client, server) = connect_pair(topo, client, server);
    SrqSetup { pool, recv_cq, srq, ring, server, client }
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

#[test]
fn waits_that_nothing_can_end_return_at_once() {
    let topo = testkit::require_topology!();
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let client = owned_qp(&topo, &ctx_c, &pd_c, caps(16, 16), 64, AccessFlags::LOCAL_WRITE);
    let server = owned_qp(&topo, &ctx_r, &pd_r, caps(16, 16), 64, AccessFlags::LOCAL_WRITE);
    let (client, server) = connect_pair(&topo, client, server);
    let limit = Duration::from_secs(5);
    let ring_pool = SlotPool::new(pd_r.clone(), 64, 2, AccessFlags::LOCAL_WRITE).unwrap();
    let mut ring = RecvRing::new(&server, ring_pool, 2, T).unwrap();

    // A send queue with nothing in flight (one request pushed, not submitted).
    let pool = SlotPool::new(pd_c.clone(), 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let (client, pool) = returns_within("SendQueue::wait with nothing in flight", limit, move || {
        let mut sq = SendQueue::new(&client, T).unwrap();
        sq.push(SlotRequest::send(pool.try_take().unwrap(), 8)).unwrap();
        let t = Instant::now();
        let e = sq.wait(Duration::MAX, drop).unwrap_err();
        assert!(nothing_to_wait_for(&e), "{e:?}");
        assert!(t.elapsed() < Duration::from_millis(100), "it spun {:?} first", t.elapsed());
        // With a request in flight it still waits for it.
        sq.submit().unwrap();
        assert_eq!(sq.wait(T, drop).unwrap(), 1);
        drop(sq);
        (client, pool)
    });

    // A ring whose every slot is out in a message the application holds.
    returns_within("RecvRing::next with nothing posted", limit, move || {
        let first = ring.recv(T).unwrap(); // the send above
        send_messages_from(&client, &pool, 1);
        let second = ring.recv(T).unwrap();
        assert_eq!(ring.posted(), 0);
        let e = ring.recv(Duration::MAX).unwrap_err();
        assert!(nothing_to_wait_for(&e), "{e:?}");
        drop((first, second, ring, client, pool));
    });

    // A scope asked for more completions than it has requests outstanding.
    let pd = pd_r.clone();
    returns_within("PostScope::wait with fewer outstanding", 2 * limit, move || {
        let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        // The QP is in error (the ring's drop flushed it): the scope flushes its receive at once.
        let r = server.scope(Duration::ZERO, |s| -> Result<()> {
            let mut wcs: [WorkCompletion; 2] = Default::default();
            let e = s.wait(1, &mut wcs, Duration::MAX).unwrap_err();
            assert!(nothing_to_wait_for(&e), "none outstanding: {e:?}");
            let sge = [mr.sge(..).unwrap()];
            s.post_recv(&mut [RecvRequest::new(1, &sge)])?;
            let e = s.wait(2, &mut wcs, Duration::MAX).unwrap_err();
            assert!(nothing_to_wait_for(&e), "2 wanted, 1 outstanding: {e:?}");
            Ok(())
        });
        // The receive never completed: the scope flushed it at its end.
        assert!(r.is_err(), "{r:?}");
        drop(mr);
        drop(server);
    });
    drop((ctx_c, pd_c, ctx_r, pd_r));
}

/// Sends `n` messages from `qp`'s slots of `pool`.
fn send_messages_from(qp: &QueuePair<'static, Rc, ReadyToSend>, pool: &SlotPool<'static>, n: usize) {
    let mut sq = SendQueue::new(qp, T).unwrap();
    for _ in 0..n {
        sq.post(SlotRequest::send(pool.try_take().unwrap(), 8)).unwrap();
    }
    sq.drain(T, |c| c.ok().unwrap()).unwrap();
}

#[test]
fn an_address_handle_of_another_pd_or_device_is_refused() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let other_ctx = Context::open(&topo.client.device).unwrap();
    let (pd, other_pd, foreign_pd) = (ctx.alloc_pd().unwrap(), ctx.alloc_pd().unwrap(), other_ctx.alloc_pd().unwrap());
    let (cq_s, cq_r) = (ctx.create_cq(16, None).unwrap(), ctx.create_cq(16, None).unwrap());
    let (sender, receiver) = (ud_qp(&pd, &cq_s, topo.port), ud_qp(&pd, &cq_r, topo.port));
    let gid = ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let other_gid = other_ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let own = pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
    let another_pds = other_pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
    let another_devices = foreign_pd.create_ah(&AddressVector::roce(topo.port, other_gid, topo.gid_index)).unwrap();
    let (src, dst) =
        (pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap(), pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    for (what, ah) in [("another PD", &another_pds), ("another device", &another_devices)] {
        let r = sender.scope(T, |s| {
            let sge = [src.sge(0..16).unwrap()];
            s.post_send(&mut [SendRequest::send(1, &sge).to(ah, receiver.qp_num(), QKEY)])
        });
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "an address handle of {what}: {r:?}");
    }
    // The QP's own PD's handle is taken, and the datagram arrives.
    receiver
        .scope(T, |rs| -> Result<()> {
            let buf = [dst.sge(..).unwrap()];
            rs.post_recv(&mut [RecvRequest::new(7, &buf)])?;
            sender.scope(T, |s| -> Result<()> {
                let sge = [src.sge(0..16).unwrap()];
                s.post_send(&mut [SendRequest::send(1, &sge).to(&own, receiver.qp_num(), QKEY)])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                s.wait(1, &mut wcs, T)?[0].ok()?;
                Ok(())
            })?;
            let mut wcs: [WorkCompletion; 1] = Default::default();
            rs.wait(1, &mut wcs, T)?[0].ok()?;
            Ok(())
        })
        .unwrap();
}

// Found by the adversarial review of the fixes above.

/// A send with data on a QP that takes no SGE was accepted into a batch; the provider then
/// refused it mid-chain, leaving the request before it posted unsignaled: no completion ever came
/// for it, waits spun forever, and dropping the queue leaked the slot, the CQ and the parents.
#[test]
fn a_request_the_qp_cannot_take_is_refused_before_it_can_split_a_batch() {
    let topo = testkit::require_topology!();
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let no_sge = QpCaps { max_send_wr: 16, max_recv_wr: 1, max_send_sge: 0, max_recv_sge: 1, max_inline_data: 0 };
    let client = owned_qp(&topo, &ctx_c, &pd_c, no_sge, 16, AccessFlags::LOCAL_WRITE);
    let server = owned_qp(&topo, &ctx_r, &pd_r, caps(16, 16), 16, AccessFlags::LOCAL_WRITE);
    let mut ring =
        RecvRing::new(&server, SlotPool::new(pd_r.clone(), 64, 8, AccessFlags::LOCAL_WRITE).unwrap(), 8, T).unwrap();
    let (client, _server) = connect_pair(&topo, client, server);
    let pool = SlotPool::new(pd_c.clone(), 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sq = SendQueue::new(&client, T).unwrap();
    sq.push(SlotRequest::send(pool.try_take().unwrap(), 0)).unwrap(); // no data: no SGE needed
    let refused = sq.push(SlotRequest::send(pool.try_take().unwrap(), 8));
    assert!(
        matches!(refused, Err(Rejected { error: Error::InvalidArgument { .. }, .. })),
        "8 bytes on a QP without SGEs: {refused:?}"
    );
    assert_eq!(sq.submit().unwrap(), 1);
    let limit = Duration::from_secs(10);
    let (sq, pool) = returns_within("the batch's completion", limit, move || {
        let mut sq = sq;
        assert_eq!(sq.wait(Duration::MAX, |c| c.ok().unwrap()).unwrap(), 1);
        (sq, pool)
    });
    drop((refused, sq));
    assert_eq!(pool.available(), 4, "every slot is back");
    ring.recv(T).unwrap().ok().unwrap();
    drop((ctx_c, ctx_r));
}

/// Receives posted to a QP already in the error state complete flushed (the verbs spec); rxe
/// completes them only when the QP is moved to error again, so a ring's `next` and a scope's
/// `wait` spun forever on them.
#[test]
fn receives_posted_to_a_qp_in_error_complete_flushed() {
    let topo = testkit::require_topology!();
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let client = owned_qp(&topo, &ctx_c, &pd_c, caps(16, 16), 16, AccessFlags::LOCAL_WRITE);
    let server = owned_qp(&topo, &ctx_r, &pd_r, caps(16, 16), 16, AccessFlags::LOCAL_WRITE);
    let mut ring =
        RecvRing::new(&server, SlotPool::new(pd_r.clone(), 64, 4, AccessFlags::LOCAL_WRITE).unwrap(), 4, T).unwrap();
    let (_client, server) = connect_pair(&topo, client, server);
    server.flush().unwrap();
    for _ in 0..4 {
        let msg = ring.recv(T).unwrap();
        assert_eq!(msg.status(), WcStatus::WrFlushError);
        ring.release(msg).unwrap(); // posted again, to a QP in error
    }
    let limit = Duration::from_secs(10);
    let ring = returns_within("RecvRing::next on a QP in error", limit, move || {
        let msg = ring.recv(Duration::MAX).unwrap();
        assert_eq!(msg.status(), WcStatus::WrFlushError);
        drop(msg);
        ring
    });
    drop(ring);
    let pd = pd_r.clone();
    returns_within("PostScope::wait on a QP in error", limit, move || {
        let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        server
            .scope(T, |s| -> Result<()> {
                let sge = [mr.sge(..).unwrap()];
                s.post_recv(&mut [RecvRequest::new(1, &sge)])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                let wc = &s.wait(1, &mut wcs, Duration::MAX)?[0];
                assert_eq!(wc.status(), WcStatus::WrFlushError);
                Ok(())
            })
            .unwrap();
        drop((mr, server));
    });
    drop((ctx_c, pd_c, ctx_r, pd_r));
}

#[test]
fn an_srq_ring_on_a_cq_of_another_device_is_refused() {
    let topo = testkit::require_topology!();
    let (_ctx_r, pd_r) = open_shared(&topo.server.device);
    let (ctx_o, _pd_o) = open_shared(&topo.client.device);
    let srq = Arc::new(SharedReceiveQueue::new(pd_r.clone(), 16, 1).unwrap());
    let foreign_cq = Arc::new(CompletionQueue::new(ctx_o.clone(), 16, None).unwrap());
    let pool = SlotPool::new(pd_r.clone(), 64, 8, AccessFlags::LOCAL_WRITE).unwrap();
    let ring = RecvRing::with_srq(srq, foreign_cq, pool.clone(), 8, T);
    assert!(matches!(ring, Err(Error::InvalidArgument { .. })), "{ring:?}");
    assert_eq!(pool.available(), 8, "nothing was posted");
}

/// `CompletionQueue::wait` on a channel other CQs report to read their events too, and could
/// not give them back: the other CQ's waiter never woke.
#[test]
fn waiting_on_a_cq_whose_channel_other_cqs_share_is_refused() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    let cq1 = ctx.create_cq(16, Some(&channel)).unwrap();
    {
        let _cq2 = ctx.create_cq(16, Some(&channel)).unwrap();
        let r = cq1.wait(Duration::from_millis(200));
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "with a second CQ on the channel: {r:?}");
    }
    // Alone on its channel again: it waits (and times out, nothing completes).
    let r = cq1.wait(Duration::from_millis(200));
    assert!(matches!(r, Err(Error::Timeout { .. })), "alone: {r:?}");
}
