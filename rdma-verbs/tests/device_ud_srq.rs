//! Device tests: UD send/recv through address handles, and a shared receive queue.

mod common;

use common::*;
use rdma_verbs::*;

/// A UD receive starts with the 40-byte GRH on RoCE.
const GRH: usize = 40;

#[test]
fn ud_send_and_receive_through_an_address_handle() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        let (ca, cb) = (Context::open(&da).unwrap(), Context::open(&db).unwrap());
        let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
        let (qa, qb) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
        let a = ud_qp(&pa, &qa, topo.port);
        let b = ud_qp(&pb, &qb, topo.port);
        let (ma, mb) = (
            pa.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap(),
            pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap(),
        );
        let b_gid = cb.query_gid(topo.port, topo.gid_index).unwrap().gid;
        let ah = pa.create_ah(&AddressVector::roce(topo.port, b_gid, topo.gid_index)).unwrap();
        let msg = pattern(512, 5);
        ma.write_at(0, &msg).unwrap();
        b.scope(T, |sb| -> rdma_verbs::Result<_> {
            let buf = [mb.sge(0..GRH + 1024).unwrap()];
            sb.post_recv(&mut [RecvRequest::new(7, &buf)]).unwrap();
            a.scope(T, |sa| -> rdma_verbs::Result<_> {
                let src = [ma.sge(0..512).unwrap()];
                sa.post_send(&mut [SendRequest::send(8, &src).to(&ah, b.qp_num(), QKEY)]).unwrap();
                let mut wcs: [WorkCompletion; 1] = Default::default();
                sa.wait(1, &mut wcs, T).unwrap()[0].ok().unwrap();
                Ok(())
            })
            .unwrap();
            let mut wcs: [WorkCompletion; 1] = Default::default();
            let wc = &sb.wait(1, &mut wcs, T).unwrap()[0];
            wc.ok().unwrap();
            assert_eq!((wc.wr_id(), wc.opcode(), wc.byte_len() as usize), (7, WcOpcode::Recv, GRH + 512), "{da}->{db}");
            assert_eq!(wc.src_qp(), a.qp_num(), "{da}->{db}: the sender's QP number");
            Ok(())
        })
        .unwrap();
        assert_eq!(read(&mb, GRH, 512), msg, "{da}->{db}");
    }
}

#[test]
fn two_qps_consume_receives_from_one_shared_receive_queue() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    // Receivers and senders get separate CQs: a sender's scope drains its own CQ at its end.
    let cq = ctx.create_cq(64, None).unwrap();
    let send_cq = ctx.create_cq(64, None).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    // Two receivers on the SRQ, each connected to its own sender, all on one device.
    let mk = |with_srq: bool| {
        let init = if with_srq { QpCreateAttr::new(&cq, &cq).srq(&srq) } else { QpCreateAttr::new(&send_cq, &send_cq) };
        pd.create_qp::<Rc>(init).unwrap().init(InitAttr::new(topo.port)).unwrap()
    };
    let (r1, r2, s1, s2) = (mk(true), mk(true), mk(false), mk(false));
    let ep = |qp: &QueuePair<'_, Rc, Init>| qp.endpoint(topo.gid_index, 0).unwrap();
    let (e_r1, e_r2, e_s1, e_s2) = (ep(&r1), ep(&r2), ep(&s1), ep(&s2));
    // Every endpoint above announced PSN 0.
    let up = |qp, peer| connect(qp, 0, peer, &topo);
    let (_r1, _r2, s1, s2) = (up(r1, e_s1), up(r2, e_s2), up(s1, e_r1), up(s2, e_r2));

    let bufs: Vec<[Sge<'_>; 1]> = (0..4).map(|i| [mr.sge(i * 1024..(i + 1) * 1024).unwrap()]).collect();
    let mut recvs: Vec<RecvRequest<'_, '_>> = (0..4).map(|i| RecvRequest::new(100 + i as u64, &bufs[i])).collect();
    // SAFETY: no slice of `mr` is taken before all four receives completed (checked below).
    unsafe { srq.post_recv(&mut recvs).unwrap() };
    mr.write_at(4096, b"from s1").unwrap();
    mr.write_at(5000, b"from s2").unwrap();
    s1.scope(T, |s| -> rdma_verbs::Result<_> {
        let m = [mr.sge(4096..4103).unwrap()];
        s.post_send(&mut [SendRequest::send(1, &m)]).unwrap();
        Ok(())
    })
    .unwrap();
    s2.scope(T, |s| -> rdma_verbs::Result<_> {
        let m = [mr.sge(5000..5007).unwrap()];
        s.post_send(&mut [SendRequest::send(2, &m)]).unwrap();
        Ok(())
    })
    .unwrap();
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let mut recv_ids = Vec::new();
    let deadline = std::time::Instant::now() + T;
    while recv_ids.len() < 2 && std::time::Instant::now() < deadline {
        for wc in cq.poll(&mut wcs).unwrap().iter().filter(|wc| wc.opcode() == WcOpcode::Recv) {
            wc.ok().unwrap();
            recv_ids.push(wc.wr_id());
        }
    }
    recv_ids.sort();
    assert_eq!(recv_ids, [100, 101], "the SRQ's receives are consumed in order, whichever QP gets the message");
    let got: Vec<Vec<u8>> = (0..2).map(|i| read(&mr, i * 1024, 7)).collect();
    assert!(got.contains(&b"from s1".to_vec()) && got.contains(&b"from s2".to_vec()), "{got:?}");
}

#[test]
fn uc_send_and_rdma_write() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        let (ca, cb) = (Context::open(&da).unwrap(), Context::open(&db).unwrap());
        let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
        let (qa, qb) = (ca.create_cq(16, None).unwrap(), cb.create_cq(16, None).unwrap());
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let a = pa
            .create_qp::<Uc>(QpCreateAttr::new(&qa, &qa))
            .unwrap()
            .init(InitAttr::new(topo.port).access(access))
            .unwrap();
        let b = pb
            .create_qp::<Uc>(QpCreateAttr::new(&qb, &qb))
            .unwrap()
            .init(InitAttr::new(topo.port).access(access))
            .unwrap();
        let (ea, eb) = (a.endpoint(topo.gid_index, 0).unwrap(), b.endpoint(topo.gid_index, 0).unwrap());
        let (a, b) = (connect(a, 0, eb, &topo), connect(b, 0, ea, &topo));
        let (ma, mb) = (pa.alloc_mr(8192, access).unwrap(), pb.alloc_mr(8192, access).unwrap());
        let msg = pattern(1000, 2);
        ma.write_at(0, &msg).unwrap();
        b.scope(T, |sb| -> rdma_verbs::Result<_> {
            let buf = [mb.sge(0..4096).unwrap()];
            sb.post_recv(&mut [RecvRequest::new(1, &buf)]).unwrap();
            a.scope(T, |sa| -> rdma_verbs::Result<_> {
                let src = [ma.sge(0..1000).unwrap()];
                // The WRITE first: UC acknowledges nothing, so a send completion says only that
                // the request left. The responder places a QP's requests in order, so once the
                // SEND behind it has arrived (the receive completed), the WRITE has landed. (Sent
                // after the SEND, the WRITE could still be on its way when the region is read:
                // seen once in CI, the region still zero.)
                sa.post_send(&mut [
                    SendRequest::write(3, &src, mb.remote().slice(5000, 1000).unwrap()),
                    SendRequest::send(2, &src),
                ])
                .unwrap();
                let mut wcs: [WorkCompletion; 2] = Default::default();
                for wc in sa.wait(2, &mut wcs, T).unwrap().iter() {
                    wc.ok().unwrap();
                }
                Ok(())
            })
            .unwrap();
            let mut wcs: [WorkCompletion; 1] = Default::default();
            assert_eq!(sb.wait(1, &mut wcs, T).unwrap()[0].byte_len(), 1000);
            Ok(())
        })
        .unwrap();
        assert_eq!(read(&mb, 0, 1000), msg, "{da}->{db}: UC send");
        assert_eq!(read(&mb, 5000, 1000), msg, "{da}->{db}: UC write");
    }
}
