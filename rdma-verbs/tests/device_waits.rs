//! Device tests of waits: every wait has a timeout (`Duration::MAX`: none, never a panic), ends at
//! once when nothing can arrive, and ends on a QP in the error state.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Timeouts too large for an `Instant` (`Duration::MAX`) wait without end, never a panic.
#[test]
fn unbounded_timeouts_wait_without_panicking() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_completion_channel().unwrap();
    let cq = ctx.create_cq(256, Some(&ch)).unwrap();
    let qp = self_connected(&pd, &cq, QpCaps::default());
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let to = mr.remote().slice(8, 8).unwrap();
    qp.scope(Duration::MAX, |s| -> rdma_verbs::Result<_> {
        let src = [mr.sge(0..8).unwrap()];
        s.post_send(&mut [SendRequest::write(1, &src, to)]).unwrap();
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, Duration::MAX).unwrap()[0].ok().unwrap();
        s.post_send(&mut [SendRequest::write(2, &src, to)]).unwrap();
        // Left for the scope's drain, whose deadline is Duration::MAX away.
        Ok(())
    })
    .unwrap();
    // CompletionQueue::wait and CompletionChannel::recv: poll by hand outside a scope.
    let src = [mr.sge(0..8).unwrap()];
    // Armed before posting: a completion that comes before arming raises no event.
    cq.arm(false).unwrap();
    // SAFETY: `mr` is not sliced; the completion is polled below.
    unsafe { qp.post_send(&mut [SendRequest::write(3, &src, mr.remote().slice(8, 8).unwrap())]).unwrap() };
    cq.wait(Duration::MAX).unwrap();
    let mut wcs: [WorkCompletion; 1] = Default::default();
    let deadline = Instant::now() + T;
    while cq.poll(&mut wcs).unwrap().is_empty() {
        assert!(Instant::now() < deadline);
    }
    cq.arm(false).unwrap();
    // SAFETY: as above.
    unsafe { qp.post_send(&mut [SendRequest::write(4, &src, mr.remote().slice(8, 8).unwrap())]).unwrap() };
    ch.recv(Duration::MAX).unwrap();
    while cq.poll(&mut wcs).unwrap().is_empty() {
        assert!(Instant::now() < deadline);
    }
}

/// Threads waiting on one channel all return in time: one that loses the event to another must
/// not block past its timeout (the fd is non-blocking, so `ibv_get_cq_event` after poll(2) said
/// readable cannot block).
#[test]
fn threads_waiting_on_one_channel_all_return_in_time() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_completion_channel().unwrap();
    let cq = ctx.create_cq(256, Some(&ch)).unwrap();
    let qp = self_connected(&pd, &cq, QpCaps::default());
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let src = [mr.sge(0..8).unwrap()];
    let wait = Duration::from_millis(400);
    const WAITERS: usize = 4;
    for round in 0..10 {
        cq.arm(false).unwrap();
        let (tx, rx) = mpsc::channel();
        let ch = &ch;
        std::thread::scope(|t| {
            for _ in 0..WAITERS {
                let tx = tx.clone();
                t.spawn(move || {
                    let start = Instant::now();
                    let r = ch.recv(wait).map(|_| ());
                    let _ = tx.send((r.is_ok(), start.elapsed()));
                });
            }
            std::thread::sleep(Duration::from_millis(50)); // the waiters are in poll(2)
                                                           // SAFETY: `mr` is never sliced; the completion is polled below.
            unsafe { qp.post_send(&mut [SendRequest::write(round, &src, mr.remote().slice(8, 8).unwrap())]).unwrap() };
            let mut results = Vec::new();
            for _ in 0..WAITERS {
                match rx.recv_timeout(wait + Duration::from_secs(2)) {
                    Ok(r) => results.push(r),
                    Err(_) => {
                        // The blocked thread would keep this scope from ever ending.
                        eprintln!("round {round}: a waiter blocked past its timeout; returned: {results:?}");
                        std::process::exit(101);
                    }
                }
            }
            assert_eq!(results.iter().filter(|r| r.0).count(), 1, "one waiter gets the event: {results:?}");
            let mut wcs: [WorkCompletion; 1] = Default::default();
            let deadline = Instant::now() + T;
            while cq.poll(&mut wcs).unwrap().is_empty() {
                assert!(Instant::now() < deadline);
            }
        });
    }
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
