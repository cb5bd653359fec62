//! Device tests of what is refused before it reaches the device: opcodes per transport, inline
//! data, lengths, address handles, QP transitions, requests a queue could not complete.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rdma_verbs::*;

/// `.inline()` on a READ or an atomic is refused: the READ's local bytes would act as its
/// scatter entry, steering the response into any LOCAL_WRITE region of the PD, here one held
/// as `&mut [u8]`.
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

/// A UD send without an address handle is refused (it would crash inside `ibv_post_send`).
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

/// RDMA WRITE and READ on UD are refused: the remote address would be read as an
/// address-handle pointer.
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

/// `.to()` (a UD address) on a connected QP is refused: it would overwrite the RDMA address and
/// rkey.
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

/// `modify_with` needs `IBV_QP_STATE` in its mask: without it the state would not change, only
/// the type.
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

/// `Debug` does not read the buffer's bytes through a slice, since a peer may be writing them.
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

/// Inline data of more than 4 GiB is refused, not truncated to 32 bits (8 bytes posted).
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

/// An RDMA WRITE or READ longer than its `RemoteRegion` is refused before it is posted.
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

/// A send with data on a QP that takes no SGE was accepted into a batch; the provider then
/// refused it mid-chain, leaving the request before it posted unsignaled: no completion ever came
/// for it, waits spun forever, and dropping the queue leaked the slot, the CQ and the parents.
///

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
