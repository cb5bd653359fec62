//! Device tests: memory windows, type 1 and type 2, on rxe. A window grants a peer its range
//! and nothing else, and invalidating or dropping it takes the grant back.

mod common;

use common::*;
use rdma_verbs::*;

const GRANT: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);
/// A region windows bind to: the peer has no access to it but through a window.
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);
const KINDS: [WindowType; 2] = [WindowType::Type1, WindowType::Type2];

/// Binds `window` to `region[range]` with `access` on `end`'s QP and waits for the bind.
fn bind<'pd: 'mr, 'mr>(
    end: &'mr End<'pd>,
    window: MemoryWindow<'pd>,
    region: &'mr MemoryRegion<'_>,
    range: std::ops::Range<usize>,
    access: AccessFlags,
) -> BoundWindow<'pd, 'mr> {
    end.qp
        .scope(T, |s| {
            let kind = window.kind();
            let bound = s.bind_window(9, window, region, range.clone(), access)?;
            let mut wcs: [WorkCompletion; 1] = Default::default();
            let wc = s.wait(1, &mut wcs, T)?[0];
            assert_eq!((wc.wr_id(), wc.status()), (9, WcStatus::Success), "{kind:?}: bind of {range:?}");
            assert_eq!(wc.opcode(), WcOpcode::BindMw);
            Ok::<_, Error>(bound)
        })
        .unwrap()
}

/// Posts `wr` from `a` and returns its completion status.
fn status_of(a: &End<'_>, wr: SendRequest<'_, '_>) -> WcStatus {
    a.qp.scope(T, |s| {
        s.post_send(&mut [wr])?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        Ok::<_, Error>(s.wait(1, &mut wcs, T)?[0].status())
    })
    .unwrap()
}

fn write_status(a: &End<'_>, len: usize, to: RemoteRegion) -> WcStatus {
    let src = [a.mr.sge(..len).unwrap()];
    status_of(a, SendRequest::write(1, &src, to))
}

fn read_status(a: &End<'_>, at: usize, len: usize, from: RemoteRegion) -> WcStatus {
    let dst = [a.mr.sge(at..at + len).unwrap()];
    status_of(a, SendRequest::read(2, &dst, from))
}

#[test]
fn the_device_advertises_memory_windows() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let ex = ctx.query_device_ex().unwrap();
    assert_eq!(ex.attr, ctx.query_device().unwrap(), "the extended query's classic part");
    assert_eq!(ex.capabilities, ctx.capabilities());
    assert!(ex.capabilities.contains(DeviceCapabilities::MEM_WINDOW), "{:?}", ex.capabilities);
    assert!(ex.capabilities.contains(DeviceCapabilities::MEM_WINDOW_TYPE_2B), "{:?}", ex.capabilities);
    assert!(ex.max_mw > 0);
}

/// Whether `device` is Soft-RoCE, whose window checks this file documents.
fn is_rxe(device: &str) -> bool {
    device.starts_with("rxe")
}

#[test]
fn a_bound_window_grants_its_range() {
    let topo = testkit::require_topology!();
    for kind in KINDS {
        for (da, db) in device_pairs(&topo) {
            with_rc_pair(&topo, &da, &db, ALL, |a, b| {
                let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
                let window = b.pd.alloc_mw(kind).unwrap();
                let old_key = window.rkey();
                let bound = bind(b, window, &region, 4096..8192, GRANT);
                let grant = bound.remote();
                assert_eq!((grant.addr, grant.len), (region.addr() + 4096, 4096), "{kind:?}");
                assert_ne!(grant.rkey, old_key, "{kind:?}: a bind gives a new key");
                assert_eq!(bound.window().rkey(), grant.rkey, "{kind:?}");
                assert_ne!(grant.rkey, region.rkey(), "{kind:?}");

                let data = pattern(4096, 3);
                a.mr.write_at(0, &data).unwrap();
                assert_eq!(write_status(a, 4096, grant), WcStatus::Success, "{kind:?} {da}->{db}: WRITE inside");
                assert_eq!(read(&region, 4096, 4096), data, "{kind:?} {da}->{db}: the WRITE landed in the range");
                assert_eq!(read_status(a, 8192, 4096, grant), WcStatus::Success, "{kind:?}: READ inside");
                assert_eq!(read(&a.mr, 8192, 4096), data, "{kind:?}: the READ brought the range back");

                // Past the region, with the window's key: refused, on every device.
                let past_region = RemoteRegion { addr: region.addr() + MR_LEN as u64, rkey: grant.rkey, len: 1 };
                let st = write_status(a, 1, past_region);
                assert_eq!(st, WcStatus::RemoteAccessError, "{kind:?} {da}->{db}: WRITE past the region");
            });
        }
    }
}

/// The verbs say a window grants its range alone. rxe checks the region's range instead (Linux
/// 6.1 and 6.12: `check_rkey()` in `rxe_resp.c` takes the window's region and checks the
/// access against it): a peer with the window's key reaches the whole region. This test
/// states what the device does, so that it fails, and the docs get updated, when that changes.
#[test]
fn outside_its_range_a_window_is_refused_except_on_rxe() {
    let topo = testkit::require_topology!();
    for kind in KINDS {
        let (da, db) = (topo.client.device.clone(), topo.server.device.clone());
        for (what, offset) in [("one byte past the window", 8192u64), ("one byte before it", 4095)] {
            with_rc_pair(&topo, &da, &db, ALL, |a, b| {
                let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
                let bound = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 4096..8192, GRANT);
                let outside = RemoteRegion { addr: region.addr() + offset, rkey: bound.rkey(), len: 1 };
                a.mr.write_at(0, &[0xab]).unwrap();
                let st = write_status(a, 1, outside);
                let landed = read(&region, offset as usize, 1) == [0xab];
                if is_rxe(&db) {
                    assert_eq!((st, landed), (WcStatus::Success, true), "{kind:?} on {db}: WRITE {what}");
                } else {
                    assert_eq!((st, landed), (WcStatus::RemoteAccessError, false), "{kind:?} on {db}: WRITE {what}");
                }
            });
        }
    }
}

#[test]
fn a_read_only_grant_refuses_writes() {
    let topo = testkit::require_topology!();
    for kind in KINDS {
        let d = topo.server.device.clone();
        with_rc_pair(&topo, &d, &d, ALL, |a, b| {
            let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
            let bound = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 0..4096, AccessFlags::REMOTE_READ);
            assert_eq!(read_status(a, 0, 64, bound.remote()), WcStatus::Success, "{kind:?}");
            assert_eq!(write_status(a, 64, bound.remote()), WcStatus::RemoteAccessError, "{kind:?}");
        });
    }
}

#[test]
fn an_invalidated_window_is_refused_and_can_be_bound_again() {
    let topo = testkit::require_topology!();
    for kind in KINDS {
        for (da, db) in device_pairs(&topo) {
            with_rc_pair(&topo, &da, &db, ALL, |a, b| {
                let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
                let bound = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 0..4096, GRANT);
                let grant = bound.remote();
                assert_eq!(write_status(a, 64, grant), WcStatus::Success, "{kind:?}: before");
                let _unbound =
                    b.qp.scope(T, |s| {
                        let window = s.invalidate_window(5, bound)?;
                        if kind == WindowType::Type1 {
                            let done = complete(s, 1);
                            assert_eq!((done[0].0, done[0].1), (5, WcOpcode::BindMw), "{kind:?}");
                        } else {
                            // Deallocated and replaced at once: nothing posted.
                            assert_ne!(window.rkey() >> 8, grant.rkey >> 8, "a new verbs window");
                        }
                        Ok::<_, Error>(window)
                    })
                    .unwrap();
                a.mr.write_at(0, &[0xee; 64]).unwrap();
                assert_eq!(write_status(a, 64, grant), WcStatus::RemoteAccessError, "{kind:?} {da}->{db}: after");
                assert_ne!(read(&region, 0, 64), vec![0xee; 64], "{kind:?}: the refused WRITE wrote nothing");
            });
            // The peer's QP is in the error state after a refusal: a second pair binds again.
            with_rc_pair(&topo, &da, &db, ALL, |a, b| {
                let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
                let first = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 0..4096, GRANT);
                let old = first.remote();
                let window =
                    b.qp.scope(T, |s| {
                        let w = s.invalidate_window(5, first)?;
                        if kind == WindowType::Type1 {
                            complete(s, 1);
                        }
                        Ok::<_, Error>(w)
                    })
                    .unwrap();
                let again = bind(b, window, &region, 4096..8192, GRANT);
                assert_ne!(again.rkey(), old.rkey, "{kind:?}: a new bind, a new key");
                assert_eq!(write_status(a, 64, again.remote()), WcStatus::Success, "{kind:?}: the new grant");
            });
        }
    }
}

#[test]
fn a_dropped_bound_window_is_refused() {
    let topo = testkit::require_topology!();
    for kind in KINDS {
        let (da, db) = (topo.client.device.clone(), topo.server.device.clone());
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
            let bound = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 0..4096, GRANT);
            let grant = bound.remote();
            drop(bound);
            assert_eq!(write_status(a, 64, grant), WcStatus::RemoteAccessError, "{kind:?}");
        });
    }
}

#[test]
fn send_with_invalidate_revokes_a_type_2_window() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
            let bound = bind(b, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region, 0..4096, GRANT);
            let grant = bound.remote();
            let wc =
                b.qp.scope(T, |sb| {
                    let buf = [b.mr.sge(0..64).unwrap()];
                    sb.post_recv(&mut [RecvRequest::new(30, &buf)])?;
                    a.qp.scope(T, |sa| {
                        let msg = [a.mr.sge(0..64).unwrap()];
                        sa.post_send(&mut [SendRequest::send_with_invalidate(31, &msg, grant.rkey)])?;
                        complete(sa, 1);
                        Ok::<_, Error>(())
                    })?;
                    let mut wcs: [WorkCompletion; 1] = Default::default();
                    Ok::<_, Error>(sb.wait(1, &mut wcs, T)?[0])
                })
                .unwrap();
            wc.ok().unwrap();
            if is_rxe(&db) {
                // rxe reports the invalidation with the kernel's flag (`IB_WC_WITH_INVALIDATE`,
                // bit 2), not libibverbs' `IBV_WC_WITH_INV` (bit 3).
                assert_eq!(wc.invalidated_rkey(), None, "{da}->{db}");
                assert_ne!(wc.as_raw().wc_flags & 4, 0, "{da}->{db}");
            } else {
                assert_eq!(wc.invalidated_rkey(), Some(grant.rkey), "{da}->{db}");
            }
            // An unrelated receive does not give the window back.
            let bound = bound.invalidated_by(&WorkCompletion::default()).unwrap_err();
            let window = bound.invalidated_by(&wc).expect("the receive names the window's key");
            assert_eq!(write_status(a, 64, grant), WcStatus::RemoteAccessError, "{da}->{db}: after");
            drop(window);
        });
    }
}

#[test]
fn binds_that_break_the_rules_are_refused_before_posting() {
    let topo = testkit::require_topology!();
    let d = topo.server.device.clone();
    with_rc_pair(&topo, &d, &d, ALL, |_a, b| {
        let bindable = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let plain = b.pd.alloc_mr(MR_LEN, AccessFlags::LOCAL_WRITE).unwrap();
        let no_local_write = b.pd.alloc_mr(MR_LEN, AccessFlags::MW_BIND).unwrap();
        let other_pd = b.ctx.alloc_pd().unwrap();
        let foreign = other_pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        for kind in KINDS {
            let refused = |region: &MemoryRegion<'_>, range: std::ops::Range<usize>, access: AccessFlags| {
                b.qp.scope(T, |s| {
                    let e = s.bind_window(1, b.pd.alloc_mw(kind)?, region, range.clone(), access).unwrap_err();
                    assert_eq!(s.outstanding(), 0, "{kind:?}: nothing posted");
                    Ok::<_, Error>(e)
                })
                .unwrap()
            };
            let invalid = |e: Error| assert!(matches!(e, Error::InvalidArgument { .. }), "{kind:?}: {e}");
            invalid(refused(&plain, 0..4096, GRANT));
            invalid(refused(&no_local_write, 0..4096, AccessFlags::REMOTE_WRITE));
            invalid(refused(&foreign, 0..4096, GRANT));
            invalid(refused(&bindable, 0..0, GRANT));
            invalid(refused(&bindable, MR_LEN - 1..MR_LEN + 1, GRANT));
            invalid(refused(&bindable, 0..4096, AccessFlags::LOCAL_WRITE));
            invalid(refused(&bindable, 0..4096, AccessFlags::empty()));
            // A window of another protection domain.
            let e =
                b.qp.scope(T, |s| {
                    Ok::<_, Error>(s.bind_window(1, other_pd.alloc_mw(kind)?, &bindable, 0..64, GRANT).unwrap_err())
                })
                .unwrap();
            invalid(e);
            // A region that windows may bind to never hands out a plain slice.
            let mut region = b.pd.alloc_mr(4096, BINDABLE).unwrap();
            assert!(matches!(region.as_mut_slice(), Err(Error::RemotelyWritable { .. })));
        }
    });
}

#[test]
fn a_forgotten_bound_window_keeps_its_region_registered() {
    let topo = testkit::require_topology!();
    // Type 1: a forgotten type 2 window is deallocated with its QP, at the end of this closure
    // (`a_qp_deallocates_a_forgotten_type_2_window_before_it_is_destroyed`).
    let kind = WindowType::Type1;
    let d = topo.server.device.clone();
    with_rc_pair(&topo, &d, &d, ALL, |_a, b| {
        let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let bound = bind(b, b.pd.alloc_mw(kind).unwrap(), &region, 0..4096, GRANT);
        // Forgetting the bound window ends its borrow of the region, but not the bind: the
        // device must refuse to deregister a region a window is bound to, so that the
        // buffer is never freed while a peer can still reach it.
        std::mem::forget(bound);
        let e = region.into_inner().unwrap_err();
        assert_eq!(e.verb(), Some("ibv_dereg_mr"), "{kind:?}: {e}");
    });
}

#[test]
fn a_batch_invalidates_windows_locally_and_at_the_peer() {
    // The builders `ibv_wr_local_inv` and `ibv_wr_send_inv`, through a batch of an extended QP.
    const OPS: SendOps = SendOps::SEND
        .union(SendOps::SEND_WITH_INV)
        .union(SendOps::LOCAL_INV)
        .union(SendOps::BIND_MW)
        .union(SendOps::RDMA_WRITE);
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
            let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
            let local = bind(b, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region, 0..4096, GRANT);
            let remote = bind(b, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region, 4096..8192, GRANT);
            let (g1, g2) = (local.remote(), remote.remote());
            assert_eq!(write_status(a, 64, g1), WcStatus::Success, "{da}->{db}: before");
            assert_eq!(write_status(a, 64, g2), WcStatus::Success, "{da}->{db}: before");
            // The owner takes one grant back itself.
            b.qp.scope(T, |s| {
                let mut batch = s.batch()?;
                // SAFETY: `g1` names a type 2 window bound (the bind completed) and not
                // invalidated since.
                batch.push(&unsafe { SendRequest::local_invalidate(5, g1.rkey) })?;
                batch.complete()?;
                let done = complete(s, 1);
                assert_eq!((done[0].0, done[0].1), (5, WcOpcode::LocalInvalidate), "{da}->{db}");
                Ok::<_, Error>(())
            })
            .unwrap();
            // The peer gives the other back with its last message.
            let wc =
                b.qp.scope(T, |sb| {
                    let buf = [b.mr.sge(0..64).unwrap()];
                    sb.post_recv(&mut [RecvRequest::new(30, &buf)])?;
                    a.qp.scope(T, |sa| {
                        let msg = [a.mr.sge(0..64).unwrap()];
                        let mut batch = sa.batch()?;
                        batch.push(&SendRequest::send_with_invalidate(31, &msg, g2.rkey))?;
                        batch.complete()?;
                        complete(sa, 1);
                        Ok::<_, Error>(())
                    })?;
                    let mut wcs: [WorkCompletion; 1] = Default::default();
                    Ok::<_, Error>(sb.wait(1, &mut wcs, T)?[0])
                })
                .unwrap();
            wc.ok().unwrap();
            let window = remote.invalidated_by(&wc).expect("the receive names the window's key");
            assert_eq!(write_status(a, 64, g1), WcStatus::RemoteAccessError, "{da}->{db}: after the local one");
            drop((window, local));
        });
    }
}

/// The kernel's log, as `dmesg` prints it (the tests run as root in the VM).
fn kernel_log() -> Vec<String> {
    let out = std::process::Command::new("dmesg").output().expect("dmesg runs");
    assert!(out.status.success(), "dmesg: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// The lines the kernel logged since `before` that tell of rxe's broken QP reference.
fn new_qp_reference_defects(before: usize) -> Vec<String> {
    let defect = ["refcount_t", "cleanup failed", "WARNING:", "use-after-free", "rxe_mw_cleanup"];
    kernel_log().into_iter().skip(before).filter(|l| defect.iter().any(|d| l.contains(d))).collect()
}

/// Binds a type 2 window of `pd` to `region[..4096]` through `qp` and waits for the bind.
fn bind_type_2<'pd: 'mr, 'mr>(
    qp: &'mr QueuePair<'pd, Rc, ReadyToSend>,
    window: MemoryWindow<'pd>,
    region: &'mr MemoryRegion<'_>,
) -> BoundWindow<'pd, 'mr> {
    qp.scope(T, |s| {
        let bound = s.bind_window(9, window, region, 0..4096, GRANT)?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        assert_eq!(s.wait(1, &mut wcs, T)?[0].status(), WcStatus::Success, "the bind");
        Ok::<_, Error>(bound)
    })
    .unwrap()
}

/// rxe holds the QP a type 2 window is bound to until the window goes, and a QP destroyed
/// before that waits about 51 s, then is freed anyway: the window's deallocation later writes
/// to the freed QP (Linux 6.1 warns in `rxe_mw_cleanup`, 6.12 logs `cleanup failed` and a
/// refcount underflow). Forgetting a bound window is safe code, so the QP deallocates the
/// windows that may still be bound to it before it is destroyed.
#[test]
fn a_qp_deallocates_a_forgotten_type_2_window_before_it_is_destroyed() {
    let topo = testkit::require_topology!();
    let before = kernel_log().len();
    {
        let ctx = Context::open(&topo.server.device).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let region = pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let qp = self_connected(&pd, &cq, caps(16, 16));
        std::mem::forget(bind_type_2(&qp, pd.alloc_mw(WindowType::Type2).unwrap(), &region));
        let start = std::time::Instant::now();
        drop(qp);
        let took = start.elapsed();
        assert!(took < std::time::Duration::from_secs(5), "destroying the QP took {took:?}");
        // The window went with the QP: nothing is bound to the region any more.
        region.into_inner().expect("the region deregisters once the QP deallocated the window");
    }
    let defects = new_qp_reference_defects(before);
    assert!(defects.is_empty(), "the kernel logged:\n{}", defects.join("\n"));
}

/// A type 2 window revoked on a QP in the error state, where no request runs, is revoked all
/// the same: its verbs window is deallocated at once and replaced, so destroying the QP does
/// not wait for it, and the window binds elsewhere and drops like any other.
#[test]
fn a_window_revoked_on_a_flushed_qp_is_revoked_at_once() {
    let topo = testkit::require_topology!();
    let before = kernel_log().len();
    {
        let ctx = Context::open(&topo.server.device).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let region = pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let qp = self_connected(&pd, &cq, caps(16, 16));
        let bound = bind_type_2(&qp, pd.alloc_mw(WindowType::Type2).unwrap(), &region);
        qp.flush().unwrap();
        let window = qp
            .scope(T, |s| {
                let old_key = bound.rkey();
                let window = s.invalidate_window(5, bound)?;
                assert_eq!(s.outstanding(), 0, "nothing posted");
                assert_ne!(window.rkey() >> 8, old_key >> 8, "a new verbs window in its place");
                Ok::<_, Error>(window)
            })
            .unwrap();
        let new = window.as_raw();
        let start = std::time::Instant::now();
        drop(qp);
        let took = start.elapsed();
        assert!(took < std::time::Duration::from_secs(5), "destroying the QP took {took:?}");
        assert!(!new.is_null() && window.as_raw() == new, "the QP left the window it no longer holds");
        // The new window binds through another QP (connected to itself), and its grant works.
        let other = self_connected(&pd, &cq, caps(16, 16));
        let again = bind_type_2(&other, window, &region);
        let src = pd.alloc_mr(4096, ALL).unwrap();
        src.write_at(0, &[0x5a; 64]).unwrap();
        let st = other
            .scope(T, |s| {
                let sge = [src.sge(..64)?];
                s.post_send(&mut [SendRequest::write(1, &sge, again.remote())])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                Ok::<_, Error>(s.wait(1, &mut wcs, T)?[0].status())
            })
            .unwrap();
        assert_eq!(st, WcStatus::Success, "a WRITE through the new window");
        drop(again);
        assert_eq!(read(&region, 0, 64), vec![0x5a; 64]);
    }
    let defects = new_qp_reference_defects(before);
    assert!(defects.is_empty(), "the kernel logged:\n{}", defects.join("\n"));
}

/// A type 1 window's key changes at every bind and unbind in its low 8 bits only, so it would
/// come back at its 129th bind. A peer that kept the first key would then reach what the
/// window grants now. The bind that would give a key a second time is refused, with nothing
/// posted. (A type 2 window gets a new verbs window at each revocation: see
/// `device_window_invalidation.rs`.)
#[test]
fn a_bind_that_would_repeat_a_key_is_refused() {
    let topo = testkit::require_topology!();
    let (kind, grants) = (WindowType::Type1, 128);
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let region = pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
    let qp = self_connected(&pd, &cq, caps(16, 16));
    let mut keys = std::collections::HashSet::new();
    let mut window = pd.alloc_mw(kind).unwrap();
    let refused = qp
        .scope(T, |s| {
            let mut wcs: [WorkCompletion; 1] = Default::default();
            for n in 0..=grants {
                let bound = match s.bind_window(1, window, &region, 0..4096, GRANT) {
                    Ok(bound) => bound,
                    Err(e) => {
                        assert_eq!(s.outstanding(), 0, "{kind:?}: nothing posted");
                        return Ok::<_, Error>(Some((n, e)));
                    }
                };
                assert_eq!(s.wait(1, &mut wcs, T)?[0].status(), WcStatus::Success, "{kind:?}: bind {n}");
                assert!(keys.insert(bound.rkey()), "{kind:?}: bind {n} gave key {:#x} again", bound.rkey());
                window = s.invalidate_window(2, bound)?;
                assert_eq!(s.wait(1, &mut wcs, T)?[0].status(), WcStatus::Success, "{kind:?}: unbind {n}");
            }
            Ok(None)
        })
        .unwrap();
    let (n, e) = refused.unwrap_or_else(|| panic!("{kind:?}: {} binds, none refused", grants + 1));
    assert_eq!(n, grants, "{kind:?}: the bind refused");
    assert!(matches!(e, Error::InvalidArgument { .. }), "{kind:?}: {e}");
    assert!(e.to_string().contains("allocate a new window"), "{kind:?}: {e}");
    assert_eq!(keys.len(), grants, "{kind:?}");
}
