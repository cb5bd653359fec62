//! Device tests: the soundness holes and aborts a review found, each attacked with safe code
//! only (the SRQ test posts its shared receive with the documented `unsafe` contract kept).
//! Each test failed (or crashed the process) on the code before the fix.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Reads `len` bytes through a raw pointer, so the compiler cannot assume a `&mut` slice's
/// bytes kept the values it wrote.
fn volatile_bytes(p: *const u8, len: usize) -> Vec<u8> {
    // SAFETY: the caller passes a pointer into a live slice of at least `len` bytes.
    (0..len).map(|i| unsafe { std::ptr::read_volatile(p.add(i)) }).collect()
}

/// A loopback RC pair on the server's device with infinite RNR retries (RtsAttr's defaults): a
/// send to a side with no receive posted stays outstanding until one is.
fn with_patient_pair(f: impl FnOnce(&End<'_>, &End<'_>)) {
    let topo = testkit::require_topology!();
    let dev = topo.server.device.clone();
    let ctx = Context::open(&dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let (cq_a, cq_b) = (ctx.create_cq(256, None).unwrap(), ctx.create_cq(256, None).unwrap());
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };
    let init = InitAttr::new(topo.port).access(ALL);
    let qa = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a).caps(caps)).unwrap().init(init).unwrap();
    let qb = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b).caps(caps)).unwrap().init(init).unwrap();
    let (ea, eb) = (qa.endpoint(topo.gid_index, 1).unwrap(), qb.endpoint(topo.gid_index, 2).unwrap());
    let a = End { ctx: &ctx, pd: &pd, qp: connect(qa, 1, eb, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    let b = End { ctx: &ctx, pd: &pd, qp: connect(qb, 2, ea, &topo), mr: pd.alloc_mr(MR_LEN, ALL).unwrap() };
    f(&a, &b);
}

/// An RC QP on `cq` connected to itself (loopback), ready to send.
fn self_connected<'r>(
    pd: &'r ProtectionDomain<'r>,
    cq: &'r CompletionQueue<'r>,
    caps: QpCaps,
) -> QueuePair<'r, Rc, ReadyToSend> {
    let topo = testkit::configured();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(cq, cq).caps(caps)).unwrap();
    let qp = qp.init(InitAttr::new(topo.port).access(ALL)).unwrap();
    let me = qp.endpoint(topo.gid_index, 1).unwrap();
    connect(qp, 1, me, &topo)
}

/// Sends `msg` from `a` (its region's first bytes) and waits for the send's completion.
fn send_from(a: &End<'_>, msg: &[u8]) {
    a.mr.write_at(0, msg).unwrap();
    a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
        let src = [a.mr.sge(0..msg.len()).unwrap()];
        s.post_send(&mut [SendRequest::send(90, &src)]).unwrap();
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
        Ok(())
    })
    .unwrap();
}

// 1.1: an inner scope on the same QP counted the outer scope's receive as its own, ended with its
// own receive still posted, and the peer's next send landed behind a live `&mut [u8]`.
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

// 1.1: a second thread's scope on the same QP (QueuePair is Sync) must not run beside the first.
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

// 1.1: a receive of a shared receive queue consumed through the QP is not the scope's request.
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

/// The 16 bytes of a `struct ibv_sge` naming all of `mr`.
fn sge_bytes(mr: &MemoryRegion<'_>) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&mr.addr().to_ne_bytes());
    b[8..12].copy_from_slice(&(mr.len() as u32).to_ne_bytes());
    b[12..].copy_from_slice(&mr.lkey().to_ne_bytes());
    b
}

// 1.2: `.inline()` on a READ let the READ's local bytes act as its scatter entry, steering the
// response into any LOCAL_WRITE region of the PD, here one held as `&mut [u8]`.
#[test]
fn inline_is_refused_on_read_and_atomics() {
    with_patient_pair(|a, b| {
        b.mr.write_at(0, b"PWNED!!!").unwrap();
        let mut victim = a.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        a.mr.write_at(0, &sge_bytes(&victim)).unwrap();
        let held = victim.as_mut_slice().unwrap();
        held.fill(0);
        let remote = b.mr.remote().slice(0, 8).unwrap();
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [a.mr.sge(0..16).unwrap()];
            let r = s.post_send(&mut [SendRequest::read(1, &src, remote).inline()]);
            if r.is_ok() {
                let mut wcs: [WorkCompletion; 1] = Default::default();
                let _ = s.wait(1, &mut wcs, T);
            }
            Ok(r)
        });
        assert_eq!(volatile_bytes(held.as_ptr(), 8), [0; 8], "the READ response landed behind a live slice");
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "inline READ: {r:?}");
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let res = [a.mr.sge(16..24).unwrap()];
            Ok(s.post_send(&mut [SendRequest::fetch_add(2, &res, remote, 1).inline()]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "inline fetch-and-add: {r:?}");
    });
}

// 1.3: a UD send without an address handle crashed inside ibv_post_send.
#[test]
fn a_ud_send_without_an_address_handle_is_refused() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = ud_qp(&pd, &cq, topo.port);
    let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let r = qp.scope(T, |s| -> rdma_verbs::Result<_> {
        let src = [mr.sge(0..8).unwrap()];
        Ok(s.post_send(&mut [SendRequest::send(1, &src)]))
    });
    assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "{r:?}");
}

// 1.3: RDMA WRITE and READ on UD made the remote address be read as an address-handle pointer.
#[test]
fn rdma_and_atomics_on_ud_are_refused() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = ud_qp(&pd, &cq, topo.port);
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let gid = ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let ah = pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
    // A "remote address" a peer could have chosen: it would be taken as an AH pointer.
    let hostile = RemoteRegion { addr: 0x4141_4141_4141_4141, rkey: 0, len: 8 };
    for i in 0..4 {
        let r = qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [mr.sge(0..8).unwrap()];
            let wr = match i {
                0 => SendRequest::write(1, &src, hostile),
                1 => SendRequest::read(2, &src, hostile),
                2 => SendRequest::fetch_add(3, &src, hostile, 1),
                _ => SendRequest::write(4, &src, hostile).to(&ah, qp.qp_num(), 1),
            };
            Ok(s.post_send(&mut [wr]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "request {i}: {r:?}");
    }
}

// 1.3: `.to()` (a UD address) on a connected QP overwrote the RDMA address and rkey.
#[test]
fn an_address_handle_on_a_connected_qp_is_refused() {
    with_patient_pair(|a, b| {
        let topo = testkit::configured();
        let gid = a.ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
        let ah = a.pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [a.mr.sge(0..8).unwrap()];
            Ok(s.post_send(&mut [SendRequest::write(1, &src, b.mr.remote()).to(&ah, 1, 1)]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "{r:?}");
        // UC takes sends and writes only.
        let cq = a.ctx.create_cq(64, None).unwrap();
        let uc =
            a.pd.create_qp::<Uc>(QpCreateAttr::new(&cq, &cq))
                .unwrap()
                .init(InitAttr::new(topo.port).access(ALL))
                .unwrap();
        let me = uc.endpoint(topo.gid_index, 3).unwrap();
        let uc = connect(uc, 3, me, &topo);
        let r = uc.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [a.mr.sge(0..8).unwrap()];
            Ok(s.post_send(&mut [SendRequest::read(1, &src, b.mr.remote().slice(0, 8).unwrap())]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "READ on UC: {r:?}");
    });
}

// 1.4: a mask without IBV_QP_STATE changed nothing but the type.
#[test]
fn modify_with_needs_the_state_bit() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap().init(InitAttr::new(topo.port)).unwrap();
    // SAFETY: all-zero is a valid `ibv_qp_attr`.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
    // Without IBV_QP_STATE the device sees a valid Init -> Init change of the access flags.
    let r = qp.try_modify_with::<ReadyToSend>(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS);
    match r {
        Ok(lying) => panic!("typed ReadyToSend, device says {:?}", lying.state()),
        Err(e) => {
            assert!(matches!(e.error, Error::InvalidArgument { .. }), "{:?}", e.error);
            assert_eq!(e.qp.state().unwrap(), QpState::Init, "the QP is given back unchanged");
        }
    }
}

// 1.6: Debug printed the buffer through a slice, also while a peer may write it.
#[test]
fn debug_does_not_read_the_bytes() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.register(vec![0xabu8; 16], ALL).unwrap();
    let text = format!("{mr:?}");
    assert!(!text.contains("171"), "Debug printed the bytes: {text}");
    assert!(text.contains("rkey"), "{text}");
}

// 2: timeouts too large for an Instant panicked.
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

// 2: send_inline of more than 4 GiB truncated the length to 32 bits and posted 8 bytes.
#[test]
fn inline_data_over_4_gib_is_refused() {
    with_patient_pair(|a, b| {
        let len = (1usize << 32) + 8;
        // SAFETY: a private anonymous read-only mapping reserved without backing (MAP_NORESERVE):
        // it reads as zeroes and is unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: the mapping is valid for `len` bytes of reads while it lives.
        let data = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        let r = a.qp.scope(T, |s| s.post_send(&mut [SendRequest::send_inline(1, data)]));
        // SAFETY: mapped above; `data` is not used again.
        unsafe { libc::munmap(p, len) };
        let _ = b;
        assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
    });
}

// 2: a WRITE longer than its RemoteRegion was posted.
#[test]
fn rdma_longer_than_its_remote_region_is_refused() {
    with_patient_pair(|a, b| {
        let remote = b.mr.remote().slice(0, 64).unwrap();
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let src = [a.mr.sge(0..128).unwrap()];
            Ok(s.post_send(&mut [SendRequest::write(1, &src, remote)]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "WRITE: {r:?}");
        let r = a.qp.scope(T, |s| -> rdma_verbs::Result<_> {
            let dst = [a.mr.sge(0..128).unwrap()];
            Ok(s.post_send(&mut [SendRequest::read(2, &dst, remote)]))
        });
        assert!(matches!(r, Ok(Err(Error::InvalidArgument { .. }))), "READ: {r:?}");
        let r = RemoteRegion { addr: u64::MAX - 4, rkey: 1, len: 100 }.slice(10, 10);
        assert_eq!(r, None, "an address past u64::MAX");
    });
}

// 2: polling a scope's CQ directly stole its completion, and the scope aborted the process.
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

// 2: a CQ smaller than what its QPs can have outstanding overran, and the scope aborted.
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

// 2: threads waiting on one channel: one that lost the event to another blocked past its
// timeout (the fd was blocking, and `ibv_get_cq_event` was called after poll(2) said readable).
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

// 2: receives posted to a QP already in the error state are not flushed on rxe (6.1): the scope
// waited for them, flushed again, and aborted the process.
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
