//! Device tests: extended CQs (`ibv_create_cq_ex`) and their lazy polls on rxe: used by
//! posting scopes, send queues and receive rings with every wait, blocking and async, and read
//! field by field with `poll_each`.

mod common;

use common::*;
use rdma_verbs::*;

/// A loopback RC pair on the server's device whose QPs use extended CQs on one channel.
fn with_extended_pair(f: impl FnOnce(&End<'_>, &End<'_>, &CompletionQueue<'_>, &CompletionQueue<'_>)) {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    let cq_a = ctx.create_cq_ex(64, Some(&channel), WcFields::empty()).unwrap();
    let cq_b = ctx.create_cq_ex(64, Some(&channel), WcFields::empty()).unwrap();
    assert!(cq_a.is_extended());
    let init = InitAttr::new(topo.port).access(ALL);
    let qa = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a).caps(caps(16, 16))).unwrap().init(init).unwrap();
    let qb = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b).caps(caps(16, 16))).unwrap().init(init).unwrap();
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let a = End { ctx: &ctx, pd: &pd, qp: connect(qa, 1, eb, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    let b = End { ctx: &ctx, pd: &pd, qp: connect(qb, 2, ea, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    f(&a, &b, &cq_a, &cq_b);
}

#[test]
fn a_scope_on_extended_cqs_sends_receives_and_sleeps() {
    with_extended_pair(|a, b, _, _| {
        let msg = pattern(3000, 9);
        a.mr.write_at(0, &msg).unwrap();
        let got =
            b.qp.scope(T, |sb| {
                sb.set_wait_policy(WaitPolicy::sleep_at_once());
                let buf = [b.mr.sge(0..4096)?];
                sb.post_recv(&mut [RecvRequest::new(10, &buf)])?;
                a.qp.scope(T, |sa| {
                    let src = [a.mr.sge(0..3000)?];
                    sa.post_send(&mut [SendRequest::send(1, &src).with_imm(77)])?;
                    let sent = complete(sa, 1);
                    assert_eq!((sent[0].0, sent[0].1), (1, WcOpcode::Send));
                    Ok::<_, Error>(())
                })?;
                Ok::<_, Error>(complete(sb, 1))
            })
            .unwrap();
        assert_eq!(got[0], (10, WcOpcode::Recv, 3000, Some(77)));
        assert_eq!(read(&b.mr, 0, 3000), msg);
    });
}

#[test]
fn poll_each_reads_fields_lazily_and_refuses_to_nest() {
    with_extended_pair(|a, b, cq_a, cq_b| {
        let src = [a.mr.sge(0..64).unwrap()];
        let mut wrs: Vec<SendRequest<'_, '_>> =
            (0..4).map(|i| SendRequest::write(100 + i, &src, b.remote().slice(0, 64).unwrap())).collect();
        // SAFETY: `a.mr` and `b.mr` outlive the requests, which complete below before either
        // is touched again; no slice of them exists meanwhile.
        unsafe { a.qp.post_send(&mut wrs) }.unwrap();
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + T;
        while seen.len() < 4 && std::time::Instant::now() < deadline {
            cq_a.poll_each(2, |wc| {
                assert!(wc.is_success(), "{wc:?}");
                assert_eq!(wc.completion_timestamp(), None, "not asked for");
                // A poll nested in the closure is refused, not deadlocked.
                let mut out = [WorkCompletion::default()];
                assert!(matches!(cq_a.poll(&mut out), Err(Error::Busy { .. })));
                assert!(matches!(cq_a.poll_each(1, |_| ()), Err(Error::Busy { .. })));
                seen.push((wc.wr_id(), wc.opcode(), wc.qp_num()));
            })
            .unwrap();
        }
        let qpn = a.qp.qp_num();
        let expected: Vec<_> = (100..104).map(|i| (i, WcOpcode::RdmaWrite, qpn)).collect();
        assert_eq!(seen, expected);
        // A panic in the closure ends the poll: the CQ stays usable.
        // SAFETY: as above.
        unsafe { a.qp.post_send(&mut wrs[..1]) }.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cq_a.poll_each(1, |_| panic!("in a lazy poll")).unwrap();
        }));
        assert!(panicked.is_err());
        // The panic ended the direct poll too: an owner can take the CQ (no scope on it is
        // refused with Busy from then on).
        a.qp.scope(T, |_| Ok::<_, Error>(())).expect("a scope owns the CQ after a panic in poll_each");
        // SAFETY: as above.
        unsafe { a.qp.post_send(&mut wrs[..1]) }.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut out = [WorkCompletion::default(); 4];
        let got = cq_a.poll(&mut out).unwrap();
        assert!(!got.is_empty() && got.iter().all(|c| c.is_success() && c.wr_id() == 100), "{got:?}");
        // Another thread's poll, while this thread's poll_each holds the CQ, waits a little and
        // is then refused: it does not block for as long as the closure runs (spinning until the
        // closure returned, the closure's wait below would run out).
        // SAFETY: as above.
        unsafe { a.qp.post_send(&mut wrs[..1]) }.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (started, wait_started) = std::sync::mpsc::channel();
        let (answer, answered) = std::sync::mpsc::channel();
        std::thread::scope(|t| {
            t.spawn(move || {
                wait_started.recv_timeout(T).expect("the first poll started");
                let mut out = [WorkCompletion::default()];
                answer.send(cq_a.poll(&mut out).map(|got| got.len())).unwrap();
            });
            let n = cq_a
                .poll_each(1, |_| {
                    started.send(()).unwrap();
                    let other = answered.recv_timeout(T).expect("the other thread's poll returned meanwhile");
                    assert!(matches!(other, Err(Error::Busy { .. })), "{other:?}");
                })
                .unwrap();
            assert_eq!(n, 1);
        });
        // A classic CQ has no lazy poll.
        let classic = a.ctx.create_cq(4, None).unwrap();
        assert!(matches!(classic.poll_each(1, |_| ()), Err(Error::InvalidArgument { .. })));
        assert_eq!(cq_b.poll_each(0, |_| ()).unwrap(), 0);
    });
}

#[test]
fn timestamps_are_refused_where_the_device_keeps_none() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let ex = ctx.query_device_ex().unwrap();
    assert_eq!(ex.completion_timestamp_mask, 0, "rxe keeps no completion timestamps");
    for fields in [WcFields::COMPLETION_TIMESTAMP, WcFields::COMPLETION_TIMESTAMP_WALLCLOCK] {
        let e = ctx.create_cq_ex(16, None, fields).unwrap_err();
        assert!(matches!(e, Error::Unsupported { errno: None, .. }), "{fields:?}: {e}");
    }
}

#[test]
fn send_queues_and_receive_rings_run_on_extended_cqs() {
    let topo = testkit::require_topology!();
    for (mut c, mut s) in echo_links_with(&topo, 2, true, true) {
        for i in 0..100u32 {
            let mut slot = c.pool.try_take().or_else(|| {
                c.sq.wait(T, |done| done.ok().unwrap()).unwrap();
                c.pool.try_take()
            });
            let slot_ref = slot.as_mut().unwrap();
            slot_ref.write_at(0, &i.to_le_bytes()).unwrap();
            c.sq.post(SlotRequest::send(slot.unwrap(), 4)).map_err(Error::from).unwrap();
            let msg = s.ring.recv(T).unwrap();
            assert_eq!(msg.bytes(), i.to_le_bytes());
            s.ring.release(msg).unwrap();
        }
        c.sq.drain(T, |done| done.ok().unwrap()).unwrap();
    }
}

#[cfg(feature = "tokio")]
#[test]
fn async_waits_on_extended_cqs() {
    let topo = testkit::require_topology!();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut c, mut s) = echo_links_with(&topo, 1, true, true).pop().unwrap();
    rt.block_on(async {
        for i in 0..50u32 {
            while c.pool.available() == 0 {
                c.sq.wait_async(|done| done.ok().unwrap()).await.unwrap();
            }
            let mut slot = c.pool.try_take().unwrap();
            slot.write_at(0, &i.to_le_bytes()).unwrap();
            c.sq.post(SlotRequest::send(slot, 4)).map_err(Error::from).unwrap();
            let msg = s.ring.recv_async().await.unwrap();
            assert_eq!(msg.bytes(), i.to_le_bytes());
            s.ring.release(msg).unwrap();
        }
        c.sq.drain_async(|done| done.ok().unwrap()).await.unwrap();
    });
}
