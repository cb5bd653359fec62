//! Device tests: revoking a type 2 memory window never makes rxe invalidate a window that is not
//! bound. rxe's invalidation of such a window (never bound, or already invalidated), by a local
//! invalidate or by a peer's send with invalidate, dereferences a null pointer in the kernel
//! (Linux 6.1 and 6.12: an oops in `__rxe_put` from `rxe_invalidate_mw`), which kills the machine: these
//! tests fail by the VM dying, or by the kernel log. And a QP destroyed first deallocates only
//! the windows bound to it now.

mod common;

use common::*;
use rdma_verbs::*;

const GRANT: AccessFlags = AccessFlags::REMOTE_READ.union(AccessFlags::REMOTE_WRITE);
const BINDABLE: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::MW_BIND);

/// The kernel's log, as `dmesg` prints it (the tests run as root in the VM).
fn kernel_log() -> Vec<String> {
    let out = std::process::Command::new("dmesg").output().expect("dmesg runs");
    assert!(out.status.success(), "dmesg: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Asserts the kernel logged no oops, bug or warning since `before` lines.
fn assert_kernel_clean(before: usize) {
    let bad = ["BUG:", "Oops", "WARNING:", "refcount_t", "use-after-free", "cleanup failed", "general protection"];
    let new: Vec<String> =
        kernel_log().into_iter().skip(before).filter(|l| bad.iter().any(|b| l.contains(b))).collect();
    assert!(new.is_empty(), "the kernel logged:\n{}", new.join("\n"));
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

/// `a` sends 64 bytes with invalidate of `rkey` to `b`, which has a receive posted: the
/// statuses of `a`'s send and of `b`'s receive.
fn send_with_invalidate(a: &End<'_>, b: &End<'_>, rkey: u32) -> (WcStatus, WorkCompletion) {
    b.qp.scope(T, |sb| {
        let buf = [b.mr.sge(0..64).unwrap()];
        sb.post_recv(&mut [RecvRequest::new(30, &buf)])?;
        let sent = a.qp.scope(T, |sa| {
            let msg = [a.mr.sge(0..64).unwrap()];
            sa.post_send(&mut [SendRequest::send_with_invalidate(31, &msg, rkey)])?;
            let mut wcs: [WorkCompletion; 1] = Default::default();
            Ok::<_, Error>(sa.wait(1, &mut wcs, T)?[0].status())
        })?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        Ok::<_, Error>((sent, sb.wait(1, &mut wcs, T)?[0]))
    })
    .unwrap()
}

/// The owner revokes a window its peer already invalidated (it has not looked at the receive's
/// flags): the window is deallocated and replaced, not invalidated a second time, and binds
/// again.
#[test]
fn revoking_a_window_the_peer_invalidated_is_harmless() {
    let topo = testkit::require_topology!();
    let before = kernel_log().len();
    let (da, db) = (topo.client.device.clone(), topo.server.device.clone());
    with_rc_pair(&topo, &da, &db, ALL, |a, b| {
        let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let bound = bind_type_2(&b.qp, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region);
        let key = bound.rkey();
        let (sent, recv) = send_with_invalidate(a, b, key);
        assert_eq!((sent, recv.status()), (WcStatus::Success, WcStatus::Success), "the peer's invalidation");
        let window = b.qp.scope(T, |s| s.invalidate_window(4, bound)).unwrap();
        assert_ne!(window.rkey() >> 8, key >> 8, "a new verbs window");
        let again = bind_type_2(&b.qp, window, &region);
        drop(again);
    });
    assert_kernel_clean(before);
}

/// A peer that kept a key sends with invalidate of it after the owner revoked the window, by
/// either way: the key names a deallocated window, which the device refuses (the receive
/// completes in error), and the kernel stays whole.
#[test]
fn a_stale_send_with_invalidate_after_revocation_is_refused() {
    let topo = testkit::require_topology!();
    let before = kernel_log().len();
    let (da, db) = (topo.client.device.clone(), topo.server.device.clone());
    // Revoked by the owner.
    with_rc_pair(&topo, &da, &db, ALL, |a, b| {
        let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let bound = bind_type_2(&b.qp, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region);
        let key = bound.rkey();
        let _window = b.qp.scope(T, |s| s.invalidate_window(4, bound)).unwrap();
        // The send is acknowledged before the responder invalidates: the refusal is the
        // receive's.
        let (sent, recv) = send_with_invalidate(a, b, key);
        assert_ne!(recv.status(), WcStatus::Success, "a send with invalidate of a revoked key (send: {sent:?})");
    });
    // Invalidated by the peer once, seen by the owner, then a second time.
    with_rc_pair(&topo, &da, &db, ALL, |a, b| {
        let region = b.pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let bound = bind_type_2(&b.qp, b.pd.alloc_mw(WindowType::Type2).unwrap(), &region);
        let key = bound.rkey();
        let (sent, recv) = send_with_invalidate(a, b, key);
        assert_eq!((sent, recv.status()), (WcStatus::Success, WcStatus::Success), "the first invalidation");
        let window = bound.invalidated_by(&recv).expect("the receive names the window's key");
        assert_ne!(window.rkey() >> 8, key >> 8, "a new verbs window");
        let (sent, recv) = send_with_invalidate(a, b, key);
        assert_ne!(recv.status(), WcStatus::Success, "a second send with invalidate of the key (send: {sent:?})");
    });
    assert_kernel_clean(before);
}

/// A window bound through QP A, revoked, then bound through QP B: destroying A leaves B's grant
/// alone, and B revokes it as usual.
#[test]
fn a_qp_destroyed_leaves_a_window_bound_to_another_qp() {
    let topo = testkit::require_topology!();
    let before = kernel_log().len();
    {
        let ctx = Context::open(&topo.server.device).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let region = pd.alloc_mr(MR_LEN, BINDABLE).unwrap();
        let src = pd.alloc_mr(4096, ALL).unwrap();
        let qa = self_connected(&pd, &cq, caps(16, 16));
        let qb = self_connected(&pd, &cq, caps(16, 16));
        let on_a = bind_type_2(&qa, pd.alloc_mw(WindowType::Type2).unwrap(), &region);
        let window = qa.scope(T, |s| s.invalidate_window(2, on_a)).unwrap();
        let on_b = bind_type_2(&qb, window, &region);
        drop(qa);
        src.write_at(0, &[0x6b; 64]).unwrap();
        let st = qb
            .scope(T, |s| {
                let sge = [src.sge(..64)?];
                s.post_send(&mut [SendRequest::write(1, &sge, on_b.remote())])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                Ok::<_, Error>(s.wait(1, &mut wcs, T)?[0].status())
            })
            .unwrap();
        assert_eq!(st, WcStatus::Success, "a WRITE through B's grant after A was destroyed");
        assert_eq!(read(&region, 0, 64), vec![0x6b; 64]);
        let window = qb.scope(T, |s| s.invalidate_window(3, on_b)).unwrap();
        drop(qb);
        drop(window);
        region.into_inner().expect("nothing is bound to the region any more");
    }
    assert_kernel_clean(before);
}
