//! Device tests: failures surface as typed errors, on rxe, and nothing panics.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Polls `cq` until one completion arrives.
fn one_completion(cq: &CompletionQueue<'_>) -> WorkCompletion {
    let mut wcs: [WorkCompletion; 1] = Default::default();
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if cq.poll(&mut wcs).unwrap().len() == 1 {
            return wcs[0];
        }
    }
    panic!("no completion within {T:?}");
}

#[test]
fn write_with_a_wrong_rkey_is_a_remote_access_error_and_the_qp_goes_to_error() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let bad = RemoteRegion { rkey: b.remote().rkey ^ 0x5a5a, ..b.remote() };
            let r = a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                let src = [a.mr.sge(0..64).unwrap()];
                sa.post_send(&mut [SendRequest::write(1, &src, bad)]).unwrap();
                Ok(())
            });
            match r {
                Err(Error::WorkCompletion { wr_id: 1, status: WcStatus::RemoteAccessError, .. }) => {}
                other => panic!("{da}->{db}: expected a remote access error, got {other:?}"),
            }
            assert_eq!(a.qp.state().unwrap(), QpState::Error, "{da}->{db}: requester QP state");
        });
    }
}

#[test]
fn a_region_without_remote_write_rejects_a_peers_write() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        // The QPs allow remote writes; only the target region does not.
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let read_only = b.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).unwrap();
            read_only.write_at(0, &[0xab; 64]).unwrap();
            a.mr.write_at(0, &[0x11; 64]).unwrap();
            let src = [a.mr.sge(0..64).unwrap()];
            // SAFETY: no slice of a.mr exists; we wait for the completion below.
            unsafe {
                a.qp.post_send(&mut [SendRequest::write(2, &src, read_only.remote().slice(0, 64).unwrap())]).unwrap()
            };
            let wc = one_completion(a.qp.send_cq());
            assert_eq!((wc.wr_id(), wc.status()), (2, WcStatus::RemoteAccessError), "{da}->{db}");
            assert!(matches!(wc.ok(), Err(Error::WorkCompletion { status: WcStatus::RemoteAccessError, .. })));
            assert_eq!(read(&read_only, 0, 64), [0xab; 64], "{da}->{db}: the target must be untouched");
        });
    }
}

#[test]
fn bad_input_is_refused_before_any_verb() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let dev = ctx.attr().clone();

    let invalid = |r: Result<()>, verb: &str| match r {
        Err(Error::InvalidArgument { verb: v, .. }) if v == verb => {}
        other => panic!("expected InvalidArgument from {verb}, got {other:?}"),
    };
    invalid(pd.alloc_mr(0, AccessFlags::LOCAL_WRITE).map(drop), "ibv_reg_mr");
    invalid(pd.register(Vec::<u8>::new(), AccessFlags::LOCAL_WRITE).map(drop), "ibv_reg_mr");
    invalid(pd.alloc_mr(64, AccessFlags::REMOTE_WRITE).map(drop), "ibv_reg_mr");
    // Remote atomics need an 8-byte aligned buffer: one starting 1 byte into a Vec is refused.
    invalid(
        pd.register(OffByOne(vec![0u8; 65]), AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).map(drop),
        "ibv_reg_mr",
    );
    assert!(pd.register(OffByOne(vec![0u8; 65]), AccessFlags::LOCAL_WRITE).is_ok(), "fine without atomics");
    invalid(ctx.create_cq(0, None).map(drop), "ibv_create_cq");
    invalid(ctx.create_cq(dev.max_cqe + 1, None).map(drop), "ibv_create_cq");
    let cq = ctx.create_cq(16, None).unwrap();
    let too_deep = QpCaps { max_send_wr: dev.max_qp_wr + 1, ..QpCaps::default() };
    invalid(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(too_deep)).map(drop), "ibv_create_qp");
    let too_wide = QpCaps { max_send_sge: dev.max_sge + 1, ..QpCaps::default() };
    invalid(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(too_wide)).map(drop), "ibv_create_qp");
    invalid(ctx.query_port(0).map(drop), "ibv_query_port");

    // A wrong port in a transition gives the QP back, still in Reset.
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    let err = qp.try_init(InitAttr::new(9)).unwrap_err();
    assert!(matches!(err.error, Error::InvalidArgument { .. }), "{}", err.error);
    let qp = err.qp.init(InitAttr::new(topo.port)).unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Init);

    // Out-of-range region accesses.
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let e = mr.sge(4000..4097).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { what: "MemoryRegion::sge", offset: 4000, len: 97, .. }), "{e}");
    assert_eq!(e.verb(), None, "no verb was called");
    let e = mr.read_at(4090, &mut [0; 7]).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { offset: 4090, len: 7, region_len: 4096, .. }), "{e}");
    assert_eq!(e.to_string(), "MemoryRegion::read_at: 7 bytes at offset 4090 do not fit the 4096-byte region");
    assert!(matches!(mr.write_at(usize::MAX, &[1]), Err(Error::OutOfBounds { what: "MemoryRegion::write_at", .. })));
    let mut remote = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
    assert!(matches!(remote.as_mut_slice(), Err(Error::RemotelyWritable { .. })));
}

#[test]
fn posting_more_than_the_queue_holds_is_a_typed_error() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let caps = QpCaps { max_recv_wr: 4, ..QpCaps::default() };
    let qp =
        pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps)).unwrap().init(InitAttr::new(topo.port)).unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let room = qp.caps().max_recv_wr as usize;
    let sge = [mr.sge(0..64).unwrap()];
    let r = qp.scope(Duration::from_millis(200), |s| -> rdma_verbs::Result<_> {
        let mut wrs: Vec<RecvRequest<'_, '_>> = (0..room as u64).map(|i| RecvRequest::new(i, &sge)).collect();
        Ok(s.post_recv(&mut wrs))
    });
    // The receives never complete (nobody sends): the scope flushes them and says so.
    match r {
        Err(Error::Timeout { what: "draining a posting scope (flushed)", .. }) => {}
        Ok(Err(e)) => panic!("posting {room} receives into a queue of {room} failed: {e}"),
        other => panic!("expected the scope to flush, got {other:?}"),
    }
    assert_eq!(qp.state().unwrap(), QpState::Error, "flushing moved the QP to the error state");
    // A scope refuses, by name and before posting anything, more than the queue holds.
    let r = qp.scope(Duration::from_millis(200), |s| -> rdma_verbs::Result<_> {
        let mut wrs: Vec<RecvRequest<'_, '_>> = (0..=room as u64).map(|i| RecvRequest::new(i, &sge)).collect();
        let r = s.post_recv(&mut wrs);
        assert_eq!(s.outstanding(), 0, "nothing was posted");
        Ok(r)
    });
    match r {
        Ok(Err(e @ Error::QueueFull { queue: "receive queue", .. })) => {
            assert!(e.to_string().contains("receive queue is full"), "{e}")
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    // And the post itself, on a fresh QP:
    let qp2 =
        pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps)).unwrap().init(InitAttr::new(topo.port)).unwrap();
    // Providers may round the queue up (rxe does), so post far more than it was asked to hold.
    let mut wrs: Vec<RecvRequest<'_, '_>> = (0..room as u64 * 8 + 64).map(|i| RecvRequest::new(i, &sge)).collect();
    // SAFETY: no slice of `mr` exists while these receives are outstanding; qp2 is destroyed
    // (discarding them) before `mr` is dropped.
    match unsafe { qp2.post_recv(&mut wrs) } {
        Err(e @ Error::PostFailed { verb: "ibv_post_recv", posted, .. }) => {
            assert!(posted >= room && posted < wrs.len(), "{e}");
            assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
            let text = e.to_string();
            assert!(text.contains("the queue is full") && text.contains(&topo.server.device), "{text}");
        }
        other => panic!("expected PostFailed, got {other:?}"),
    }
}

/// A buffer whose bytes start one past its Vec's (8-aligned) start.
struct OffByOne(Vec<u8>);

// SAFETY: the Vec's heap buffer never moves or resizes while registered; the pointer is inside it.
unsafe impl RegisteredBuffer for OffByOne {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: the Vec has at least one byte.
        unsafe { self.0.as_mut_ptr().add(1) }
    }
    fn len(&self) -> usize {
        self.0.len() - 1
    }
}
