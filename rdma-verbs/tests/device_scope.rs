//! Device tests of the posting scope: it owns its CQs, counts only its own completions, and drains
//! (wait, flush, reset) before its borrows end, whatever the closure did.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Drain escalation while a big READ is on the wire (cross device): short drain timeouts, then
/// a plain slice of the destination right after the scope returns, and no byte lands behind it.
/// rxe can finish copying a packet after `ibv_modify_qp(RESET)` returns, so a scope waits for
/// the flushed completions (the device's own word that it is done) and does not reset a QP
/// whose flush completes: a `(QP reset)` outcome here fails (runs with a zero drain).
#[test]
fn short_drain_during_a_big_read_leaves_no_late_write() {
    let topo = testkit::require_topology!();
    let ctx_a = Context::open(&topo.client.device).unwrap();
    let ctx_b = Context::open(&topo.server.device).unwrap();
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (ctx_a.create_cq(64, None).unwrap(), ctx_b.create_cq(64, None).unwrap());
    const LEN: usize = 1 << 20;
    let remote = pd_b.alloc_mr(LEN, ALL).unwrap();
    remote.write_at(0, &vec![0x5a; LEN]).unwrap();
    let mut dst = pd_a.alloc_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    let mut changed = Vec::new();
    let mut psn = 10;
    let mut resets = Vec::new();
    for (i, t) in [0u64, 0, 0, 0, 0, 0, 50, 100, 200, 500, 500, 500, 1000, 2000, 5000, 20_000].iter().enumerate() {
        let qa = rc_init(&pd_a, &cq_a, topo.port);
        let qb = rc_init(&pd_b, &cq_b, topo.port);
        let (ea, eb) = (qa.endpoint(topo.gid_index, psn).unwrap(), qb.endpoint(topo.gid_index, psn + 1).unwrap());
        let qa = connect(qa, psn, eb, &topo);
        let _qb = connect(qb, psn + 1, ea, &topo);
        psn += 2;
        let r = qa.scope(Duration::from_micros(*t), |s| -> rdma_verbs::Result<_> {
            let d = [dst.sge(..).unwrap()];
            s.post_send(&mut [SendRequest::read(1, &d, remote.remote())])?;
            Ok(())
        });
        let sl = dst.as_mut_slice().unwrap();
        sl.fill(0);
        std::thread::sleep(Duration::from_millis(100));
        let nz = volatile_bytes(sl.as_ptr(), LEN).iter().filter(|&&b| b != 0).count();
        eprintln!("A3 run {i} drain {t}us: {r:?}; {nz} bytes changed behind the slice; qa {:?}", qa.state());
        if nz != 0 {
            changed.push((t, nz));
        }
        if matches!(r, Err(Error::Timeout { what, .. }) if what.contains("reset")) {
            resets.push(t);
        }
    }
    assert!(changed.is_empty(), "late READ data behind a live &mut [u8]: {changed:?}");
    assert!(resets.is_empty(), "a scope reset the QP although its flush completes (drains {resets:?} us)");
}

/// Nested scopes on two QPs sharing one CQ; and a scope whose recv CQ is another QP's send CQ
/// while that QP's scope runs on another thread.
#[test]
fn scopes_on_qps_sharing_cqs() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (x, y) = (ctx.create_cq(64, None).unwrap(), ctx.create_cq(64, None).unwrap());
    let caps = QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let init = InitAttr::new(topo.port).access(ALL);
    // A: send X, recv Y; B: send Y, recv X.
    let qa = pd.create_qp::<Rc>(QpCreateAttr::new(&x, &y).caps(caps)).unwrap().init(init).unwrap();
    let qb = pd.create_qp::<Rc>(QpCreateAttr::new(&y, &x).caps(caps)).unwrap().init(init).unwrap();
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let qa = connect(qa, 1, eb, &topo);
    let qb = connect(qb, 2, ea, &topo);
    let ma = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let nested = qa.scope(T, |_s| -> rdma_verbs::Result<_> { Ok(qb.scope(T, |_| Ok::<_, Error>(()))) });
    eprintln!("A5 nested on crossed CQs: {nested:?}");
    assert!(matches!(nested, Ok(Err(Error::Busy { .. }))), "{nested:?}");
    let (tx, rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    std::thread::scope(|t| {
        let qb = &qb;
        t.spawn(move || {
            // Its receive never completes: the drain waits its timeout out, then flushes (a
            // short one: what is tested is A's scope meanwhile).
            let r = qb.scope(Duration::from_millis(200), |s| -> rdma_verbs::Result<_> {
                let d = [mb.sge(..).unwrap()];
                s.post_recv(&mut [RecvRequest::new(1, &d)])?;
                tx.send(()).unwrap();
                go_rx.recv().unwrap();
                Ok(())
            });
            eprintln!("A5 thread scope on B: {r:?}");
        });
        rx.recv().unwrap();
        let r = qa.scope(T, |s| -> rdma_verbs::Result<_> {
            let m = [ma.sge(0..8).unwrap()];
            s.post_send(&mut [SendRequest::send(1, &m)])?;
            Ok(())
        });
        eprintln!("A5 scope on A while B's runs: {r:?}");
        let direct = x.poll(&mut [WorkCompletion::default(); 4]).map(|g| g.len());
        eprintln!("A5 direct poll of X while B's scope runs: {direct:?}");
        go_tx.send(()).unwrap();
        assert!(matches!(r, Err(Error::Busy { .. })), "{r:?}");
        assert!(direct.is_err());
    });
}

/// A panic inside a scope with a receive outstanding (never satisfied), caught; then reuse the
/// region as a plain slice and have the peer send to the QP.
#[test]
fn a_panic_in_a_scope_then_reuse_of_its_region() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (ctx.create_cq(64, None).unwrap(), ctx.create_cq(64, None).unwrap());
    let qa = rc_init(&pd, &cq_a, topo.port);
    let qb = rc_init(&pd, &cq_b, topo.port);
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let qa = connect(qa, 1, eb, &topo);
    let qb = connect(qb, 2, ea, &topo);
    let mut victim = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let src = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let start = Instant::now();
    let caught = catch_unwind(AssertUnwindSafe(|| {
        let _ = qb.scope(Duration::from_millis(300), |s| -> rdma_verbs::Result<()> {
            let d = [victim.sge(..).unwrap()];
            s.post_recv(&mut [RecvRequest::new(1, &d), RecvRequest::new(2, &d)])?;
            panic!("boom with {} outstanding", s.outstanding());
        });
    }));
    eprintln!("A6 caught: {} after {:?}; qb {:?}", caught.is_err(), start.elapsed(), qb.state());
    let sl = victim.as_mut_slice().unwrap();
    sl.fill(0);
    let sent = scoped_send(&qa, &src, b"AFTERPANIC", Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(100));
    let b = volatile_bytes(sl.as_ptr(), 10);
    eprintln!("A6 send after panic: {sent:?}; victim {b:?}");
    assert_eq!(b, [0; 10]);
    // Reuse the QP: a new scope on it.
    let r = qb.scope(Duration::from_millis(300), |s| -> rdma_verbs::Result<_> {
        let d = [src.sge(..).unwrap()];
        s.post_recv(&mut [RecvRequest::new(3, &d)])?;
        Ok(())
    });
    eprintln!("A6 scope on the QP after the panic: {r:?}");
}

/// Two threads poll the CQ directly in a loop while scopes open and close on its QP.
#[test]
fn direct_pollers_race_scopes() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let q = rc_init(&pd, &cq, topo.port);
    let me = q.endpoint(topo.gid_index, 1).unwrap();
    let q = connect(q, 1, me, &topo);
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let stop = AtomicBool::new(false);
    let stolen = AtomicUsize::new(0);
    let (mut ok, mut busy, mut other) = (0, 0, Vec::new());
    std::thread::scope(|t| {
        for _ in 0..2 {
            let (cq, stop, stolen) = (&cq, &stop, &stolen);
            t.spawn(move || {
                let mut wcs: [WorkCompletion; 4] = Default::default();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(g) = cq.poll(&mut wcs) {
                        stolen.fetch_add(g.len(), Ordering::Relaxed);
                    }
                }
            });
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            let r = q.scope(Duration::from_millis(500), |s| -> rdma_verbs::Result<_> {
                let src = [mr.sge(0..8).unwrap()];
                s.post_send(&mut [SendRequest::write(1, &src, mr.remote().slice(64, 8).unwrap())])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                s.wait(1, &mut wcs, Duration::from_millis(500))?[0].ok()?;
                Ok(())
            });
            match r {
                Ok(()) => ok += 1,
                Err(Error::Busy { .. }) => busy += 1,
                Err(e) => other.push(e),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    eprintln!(
        "A10 scopes ok {ok}, busy {busy}, other {other:?}; completions taken by direct pollers {}",
        stolen.load(Ordering::Relaxed)
    );
    assert!(other.is_empty(), "{other:?}");
    assert!(ok > 0, "no scope ever got its CQs");
    assert_eq!(stolen.load(Ordering::Relaxed), 0, "a direct poll took a scope's completion");
}

/// An inner scope on the same QP never counts the outer scope's receive as its own: it would end
/// with its own receive still posted, and the peer's next send would land behind a live
/// `&mut [u8]`.
#[test]
fn a_nested_scope_on_the_same_qp_cannot_end_on_the_outer_scopes_completion() {
    with_patient_pair(|a, b| {
        let outer_buf = b.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mut inner_buf = b.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let mut changed_behind_slice = None;
        let outer = b.qp.scope(T, |outer| -> rdma_verbs::Result<_> {
            let ob = [outer_buf.sge(..).unwrap()];
            outer.post_recv(&mut [RecvRequest::new(1, &ob)]).unwrap();
            let inner = b.qp.scope(T, |inner| -> rdma_verbs::Result<_> {
                let ib = [inner_buf.sge(..).unwrap()];
                inner.post_recv(&mut [RecvRequest::new(2, &ib)]).unwrap();
                send_from(a, b"first"); // consumes the outer scope's receive
                let mut wcs: [WorkCompletion; 1] = Default::default();
                let _ = inner.wait(1, &mut wcs, Duration::from_millis(500));
                Ok(())
            });
            if let Err(e) = inner {
                assert!(matches!(e, Error::Busy { .. }), "{e:?}");
                send_from(a, b"first");
                return Ok(()); // refused: nothing of the inner scope's was posted
            }
            // The inner scope ended, so its region is free for a plain slice...
            let slice = inner_buf.as_mut_slice().unwrap();
            slice.fill(0);
            send_from(a, b"second"); // ...yet its receive is still posted.
            changed_behind_slice = Some(volatile_bytes(slice.as_ptr(), 6) != [0; 6]);
            Ok(())
        });
        outer.unwrap();
        assert_ne!(changed_behind_slice, Some(true), "the NIC wrote behind a live &mut [u8]");
    });
}

/// A second thread's scope on the same QP (QueuePair is Sync) must not run beside the first.
#[test]
fn a_second_threads_scope_on_the_same_qp_is_refused() {
    with_patient_pair(|a, b| {
        let buf = b.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let (opened, go) = (mpsc::channel(), mpsc::channel::<()>());
        // The region moves into the thread (a region is Send, not Sync); the QP is shared.
        let (go_rx, opened_tx, qp) = (go.1, opened.0, &b.qp);
        std::thread::scope(|t| {
            t.spawn(move || {
                qp.scope(T, |s| -> rdma_verbs::Result<_> {
                    let sge = [buf.sge(..).unwrap()];
                    s.post_recv(&mut [RecvRequest::new(1, &sge)]).unwrap();
                    opened_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                    let mut wcs: [WorkCompletion; 1] = Default::default();
                    s.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
                    Ok(())
                })
                .unwrap();
            });
            opened.1.recv().unwrap();
            let second = b.qp.scope(T, |_| Ok::<_, Error>(()));
            go.0.send(()).unwrap();
            send_from(a, b"x");
            assert!(matches!(second, Err(Error::Busy { .. })), "a second scope on the QP: {second:?}");
        });
    });
}

/// A receive of a shared receive queue consumed through the QP is not the scope's request.
#[test]
fn a_shared_receive_completed_through_the_qp_does_not_count_for_its_scope() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (ctx.create_cq(64, None).unwrap(), ctx.create_cq(64, None).unwrap());
    let srq = pd.create_srq(8, 1).unwrap();
    let init = InitAttr::new(topo.port).access(ALL);
    let qa = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a)).unwrap().init(init).unwrap();
    let qb = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b).srq(&srq)).unwrap().init(init).unwrap();
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let (qa, qb) = (connect(qa, 1, eb, &topo), connect(qb, 2, ea, &topo));
    let shared = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let sge = [shared.sge(..).unwrap()];
    // SAFETY: `shared` is never sliced; the receive completes below.
    unsafe { srq.post_recv(&mut [RecvRequest::new(5, &sge)]).unwrap() };
    let a_mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let b_mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    // a -> b: consumes the shared receive; its completion waits in b's CQ.
    qa.scope(T, |s| -> rdma_verbs::Result<_> {
        let src = [a_mr.sge(0..8).unwrap()];
        s.post_send(&mut [SendRequest::send(1, &src)]).unwrap();
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
        Ok(())
    })
    .unwrap();
    let mut outstanding_after_poll = usize::MAX;
    qb.scope(T, |s| -> rdma_verbs::Result<_> {
        // b -> a with no receive posted at a: RNR-retried, outstanding until a posts one.
        let src = [b_mr.sge(0..8).unwrap()];
        s.post_send(&mut [SendRequest::send(2, &src)]).unwrap();
        let deadline = Instant::now() + T;
        let mut wcs: [WorkCompletion; 4] = Default::default();
        let mut seen = Vec::new();
        while seen.is_empty() && Instant::now() < deadline {
            seen.extend(s.poll(&mut wcs).unwrap().iter().map(|wc| wc.wr_id()));
        }
        assert_eq!(seen, [5], "the shared receive's completion");
        outstanding_after_poll = s.outstanding();
        // Let the send complete.
        qa.scope(T, |sa| -> rdma_verbs::Result<_> {
            let dst = [a_mr.sge(8..16).unwrap()];
            sa.post_recv(&mut [RecvRequest::new(3, &dst)]).unwrap();
            let mut wcs: [WorkCompletion; 1] = Default::default();
            sa.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
            Ok(())
        })
        .unwrap();
        Ok(())
    })
    .unwrap();
    assert_eq!(outstanding_after_poll, 1, "the scope's own send was still outstanding");
}

/// Polling a scope's CQ directly is an error, not a stolen completion that makes the scope
/// abort the process.
#[test]
fn polling_a_scopes_cq_directly_is_an_error() {
    with_patient_pair(|a, b| {
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [a.mr.sge(0..8).unwrap()];
            s.post_send(&mut [SendRequest::write(1, &src, b.mr.remote().slice(0, 8).unwrap())]).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let mut wcs: [WorkCompletion; 4] = Default::default();
            Ok(a.qp.send_cq().poll(&mut wcs).map(|got| got.len()))
        });
        let polled = r.expect("the scope ends normally");
        assert!(polled.is_err(), "the direct poll took {polled:?} of the scope's completions");
    });
}

/// A scope refuses posts that would overrun a CQ smaller than what its QPs can have
/// outstanding, instead of overrunning it and aborting.
#[test]
fn a_scope_never_overruns_its_cq() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = self_connected(&pd, &cq, QpCaps { max_send_wr: 64, ..QpCaps::default() });
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let r = qp.scope(T, |s| -> rdma_verbs::Result<_> {
        let src = [mr.sge(0..8).unwrap()];
        let mut refused = None;
        for i in 0..32 {
            if let Err(e) = s.post_send(&mut [SendRequest::write(i, &src, mr.remote().slice(64, 8).unwrap())]) {
                refused = Some(e);
                break;
            }
        }
        Ok(refused)
    });
    let refused = r.expect("the scope drains");
    assert!(refused.is_some(), "32 requests posted against a CQ of {} entries", 4);
}

/// Receives posted to a QP already in the error state are not flushed on rxe (6.1): the scope
/// ends with an error instead of waiting for them, flushing again and aborting the process.
#[test]
fn receives_posted_to_a_qp_in_error_end_the_scope_with_an_error() {
    with_patient_pair(|a, _b| {
        a.qp.flush().unwrap();
        assert_eq!(a.qp.state().unwrap(), QpState::Error);
        // The measurement behind docs/rdma-cm.md: is a receive posted now flushed by itself, or
        // only when the QP is moved to the error state again?
        let (probe, mut wcs) = (a.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap(), [WorkCompletion::default()]);
        let sge = [probe.sge(..).unwrap()];
        // SAFETY: `probe` is never sliced and outlives the receive (flushed or reset below).
        unsafe { a.qp.post_recv(&mut [RecvRequest::new(9, &sge)]).unwrap() };
        let mut poll_for = |d: Duration| {
            let end = Instant::now() + d;
            while Instant::now() < end {
                if let Some(wc) = a.qp.recv_cq().poll(&mut wcs).unwrap().first() {
                    return Some(wc.status());
                }
            }
            None
        };
        let by_itself = poll_for(Duration::from_secs(1));
        a.qp.flush().unwrap();
        let after_reflush = if by_itself.is_none() { poll_for(Duration::from_secs(1)) } else { None };
        eprintln!("measured: receive posted in Error: within 1 s by itself {by_itself:?}; after a second flush {after_reflush:?}");
        let start = Instant::now();
        let r = a.qp.scope(Duration::from_millis(500), |s| -> rdma_verbs::Result<_> {
            let dst = [a.mr.sge(0..64).unwrap()];
            s.post_recv(&mut [RecvRequest::new(1, &dst)]).unwrap();
            Ok(())
        });
        eprintln!("scope over a QP in error: {r:?} after {:?}", start.elapsed());
        // Either the receive was flushed (an error completion) or the scope gave up on it; in both
        // cases the process goes on and the region is free again.
        assert!(r.is_err(), "a receive on a QP in error cannot succeed");
        let mut mr_free = a.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        mr_free.as_mut_slice().unwrap()[0] = 1;
    });
}

/// A drain that lost completions resets the QP, whose handle still says `ReadyToSend`. rxe's provider stores a request posted
/// to a QP in RESET in its ring before the doorbell is refused, so a later transition back
/// would run it after its borrows ended. Such a post is refused before the provider sees it,
/// until a transition brings the QP back.
///
/// Completions are lost the way a shared CQ loses them: another QP (through the `unsafe` raw
/// post, which no owner of the CQ counts) fills the CQ first, and the scope's own completion
/// finds it full.
#[test]
fn after_a_drain_resets_the_qp_posts_are_refused_until_a_transition() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    const CQE: u32 = 4;
    let (shared, other) = (ctx.create_cq(CQE, None).unwrap(), ctx.create_cq(64, None).unwrap());
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    let (qp, peer) = connect_pair(&topo, rc_init(&pd, &shared, topo.port), rc_init(&pd, &other, topo.port));
    let (filler, filler_peer) = connect_pair(&topo, rc_init(&pd, &shared, topo.port), rc_init(&pd, &other, topo.port));
    let src = [mr.sge(0..8).unwrap()];
    // The filler's 16 writes complete into the shared CQ of 4 until it is full, and beyond.
    let mut writes: Vec<SendRequest<'_, '_>> =
        (0..16).map(|i| SendRequest::write(100 + i, &src, mr.remote().slice(64, 8).unwrap())).collect();
    // SAFETY: `mr` outlives the writes, which complete (or are flushed with the QPs) before it
    // is dropped; no slice of it is made meanwhile.
    unsafe { filler.post_send(&mut writes) }.unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The scope's write completes into the full CQ: its completion is lost, the drain resets.
    let r = qp.scope(Duration::from_millis(200), |s| s.post_send(&mut [SendRequest::write(1, &src, mr.remote())]));
    // Linux 6.1's rxe drops a completion that finds its CQ full (`rxe_cq_post`: -EBUSY and a
    // CQ error event); 6.12's kept it here (seen 2026-11-29), so there is no lost completion
    // and no reset to test there.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if r.is_ok() && !release.starts_with("6.1.") {
        println!("Linux {}: rxe kept the completion a full CQ would lose; no drain reset to test", release.trim());
        return;
    }
    assert!(matches!(&r, Err(Error::Timeout { what, .. }) if what.contains("reset")), "{r:?}");
    assert_eq!(qp.state().unwrap(), QpState::Reset);
    // Typed ReadyToSend, in RESET: every post is refused before it reaches the provider.
    let refused = qp.scope(T, |s| s.post_send(&mut [SendRequest::write(2, &src, mr.remote())]));
    assert!(matches!(&refused, Err(Error::InvalidArgument { verb: "ibv_post_send", .. })), "{refused:?}");
    // SAFETY: as above.
    let raw = unsafe { qp.post_send(&mut [SendRequest::write(3, &src, mr.remote())]) };
    assert!(matches!(&raw, Err(Error::InvalidArgument { .. })), "{raw:?}");
    let recv = [mr.sge(128..256).unwrap()];
    let refused = qp.scope(T, |s| s.post_recv(&mut [RecvRequest::new(4, &recv)]));
    assert!(matches!(&refused, Err(Error::InvalidArgument { verb: "ibv_post_recv", .. })), "{refused:?}");
    drop((filler, filler_peer, peer));
}
