//! Device tests of answering UD datagrams, rxe1 -> rxe0: the address of a reply from the
//! datagram's completion and GRH (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`), a send scope
//! beside a receive ring on the same QP, and a posting scope that ends with receives still
//! posted on a UD QP.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// A UD QP ready to send, its send and receive queues on the CQs given.
fn ud_qp_on<'r>(
    pd: &'r ProtectionDomain<'r>,
    send_cq: &'r CompletionQueue<'r>,
    recv_cq: &'r CompletionQueue<'r>,
    port: u8,
) -> QueuePair<'r, Ud, ReadyToSend> {
    let qp =
        pd.create_qp::<Ud>(QpCreateAttr::new(send_cq, recv_cq)).unwrap().init(InitAttr::new(port).qkey(QKEY)).unwrap();
    qp.ready_to_receive().unwrap().ready_to_send(0).unwrap()
}

/// Two clients on rxe1 send to a server QP on rxe0 that receives through a `RecvRing`; the
/// server answers each from the datagram alone (its completion and GRH) through a send scope
/// on the same QP, beside the ring, and each client gets its own answer.
#[test]
fn a_server_answers_each_sender_from_its_datagram_beside_its_ring() {
    let topo = testkit::require_topology!();
    let (sctx, cctx) = (Context::open(&topo.server.device).unwrap(), Context::open(&topo.client.device).unwrap());
    let (spd, cpd) = (sctx.alloc_pd().unwrap(), cctx.alloc_pd().unwrap());
    let (s_send, s_recv) = (sctx.create_cq(16, None).unwrap(), sctx.create_cq(16, None).unwrap());
    let server = ud_qp_on(&spd, &s_send, &s_recv, topo.port);
    let pool = SlotPool::new(&spd, GRH_LEN + 256, 8, AccessFlags::LOCAL_WRITE).unwrap();
    let mut ring = RecvRing::new(&server, pool, 8, T).unwrap();
    // A full scope claims both CQs, the ring's included: refused, as before.
    let full = server.scope(T, |_| -> Result<()> { Ok(()) });
    assert!(matches!(full, Err(Error::Busy { .. })), "a scope beside the ring: {full:?}");

    let ccq = cctx.create_cq(16, None).unwrap();
    let clients = [ud_qp(&cpd, &ccq, topo.port), ud_qp(&cpd, &ccq, topo.port)];
    let cmr = cpd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let server_gid = sctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let client_gid = cctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let to_server = cpd.create_ah(&AddressVector::roce(topo.port, server_gid, topo.gid_index)).unwrap();
    let smr = spd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();

    for (i, client) in clients.iter().enumerate() {
        let base = i * 1024;
        cmr.write_at(base + 512, format!("ping {i}").as_bytes()).unwrap();
        client
            .scope(T, |c| -> Result<()> {
                let inbox = [cmr.sge(base..base + 512)?];
                c.post_recv(&mut [RecvRequest::new(1, &inbox)])?;
                let out = [cmr.sge(base + 512..base + 518)?];
                c.post_send(&mut [SendRequest::send(2, &out).to(&to_server, server.qp_num(), QKEY)])?;

                // The server: the datagram, and the address back from it alone.
                let msg = ring.recv(T)?;
                msg.ok()?;
                assert_eq!(msg.src_qp(), client.qp_num());
                assert!(msg.completion().has_grh(), "a RoCE datagram carries a GRH");
                let back = AddressVector::from_wc(&sctx, topo.port, msg.completion(), msg.bytes())?;
                assert_eq!(back.dgid, client_gid, "the reply goes to the sender's GID");
                assert_eq!(back.port, topo.port);
                let ah = spd.create_ah_from_wc(topo.port, msg.completion(), msg.bytes())?;
                let payload = msg.bytes()[GRH_LEN..].to_vec();
                smr.write_at(0, &[b"echo ".as_slice(), &payload].concat())?;
                let n = server.send_scope(T, |s| -> Result<usize> {
                    let reply = [smr.sge(..5 + payload.len())?];
                    s.post_send(&mut [SendRequest::send(9, &reply).to(&ah, msg.src_qp(), QKEY)])?;
                    let mut wcs: [WorkCompletion; 1] = Default::default();
                    s.wait(1, &mut wcs, T)?[0].ok()?;
                    // Receives are the ring's.
                    let buf = [smr.sge(1024..2048)?];
                    let refused = s.post_recv(&mut [RecvRequest::new(3, &buf)]);
                    assert!(matches!(refused, Err(Error::InvalidArgument { .. })), "{refused:?}");
                    Ok(5 + payload.len())
                })?;
                ring.release(msg)?;

                // The client: its own answer.
                let mut wcs: [WorkCompletion; 2] = Default::default();
                let mut got = None;
                for wc in c.wait(2, &mut wcs, T)?.iter() {
                    wc.ok()?;
                    if wc.wr_id() == 1 {
                        assert_eq!(wc.src_qp(), server.qp_num(), "the answer comes from the server's QP");
                        got = Some(wc.byte_len() as usize);
                    }
                }
                assert_eq!(got, Some(GRH_LEN + n), "client {i}: the answer's length");
                Ok(())
            })
            .unwrap();
        assert_eq!(read(&cmr, base + GRH_LEN, 11), format!("echo ping {i}").as_bytes(), "client {i}'s own answer");
    }
    assert_eq!(ring.posted(), 8, "the ring's receives stayed posted throughout");
}

/// The address of a reply is refused, typed, for a completion that is not a successful receive
/// or a GRH shorter than 40 bytes.
#[test]
fn an_address_from_a_completion_refuses_what_is_not_a_received_datagram() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = ud_qp(&pd, &cq, topo.port);
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let gid = ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let to_self = pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
    // A datagram to itself: a send completion and a receive completion.
    let (send_wc, recv_wc) = qp
        .scope(T, |s| -> Result<_> {
            let inbox = [mr.sge(..1024)?];
            s.post_recv(&mut [RecvRequest::new(1, &inbox)])?;
            let out = [mr.sge(2048..2052)?];
            s.post_send(&mut [SendRequest::send(2, &out).to(&to_self, qp.qp_num(), QKEY)])?;
            let mut wcs: [WorkCompletion; 2] = Default::default();
            let got = s.wait(2, &mut wcs, T)?;
            let (send, recv) = if got[0].wr_id() == 2 { (got[0], got[1]) } else { (got[1], got[0]) };
            Ok((send, recv))
        })
        .unwrap();
    let mut grh = [0u8; GRH_LEN];
    mr.read_at(0, &mut grh).unwrap();
    let back = AddressVector::from_wc(&ctx, topo.port, &recv_wc, &grh).unwrap();
    assert_eq!(back.dgid, gid, "to itself");
    let short = AddressHandle::from_wc(&pd, topo.port, &recv_wc, &grh[..39]);
    assert!(matches!(&short, Err(Error::InvalidArgument { reason, .. }) if reason.contains("39 given")), "{short:?}");
    let not_recv = pd.create_ah_from_wc(topo.port, &send_wc, &grh);
    assert!(
        matches!(&not_recv, Err(Error::InvalidArgument { reason, .. }) if reason.contains("not a successful receive"))
    );
    let bad_port = AddressVector::from_wc(&ctx, 9, &recv_wc, &grh);
    assert!(matches!(bad_port, Err(Error::InvalidArgument { .. })), "{bad_port:?}");
    // The handle made from the receive answers: a second datagram to itself through it.
    let ah = pd.create_ah_from_wc(topo.port, &recv_wc, &grh).unwrap();
    qp.scope(T, |s| -> Result<()> {
        let inbox = [mr.sge(..1024)?];
        s.post_recv(&mut [RecvRequest::new(1, &inbox)])?;
        let out = [mr.sge(2048..2052)?];
        s.post_send(&mut [SendRequest::send(2, &out).to(&ah, recv_wc.src_qp(), QKEY)])?;
        let mut wcs: [WorkCompletion; 2] = Default::default();
        for wc in s.wait(2, &mut wcs, T)?.iter() {
            wc.ok()?;
        }
        Ok(())
    })
    .unwrap();
}

/// A posting scope on a UD QP that ends with receives still posted (datagrams that did not
/// come) returns the closure's result at once, its QP ready again: the receives are flushed
/// without waiting out the drain timeout, and the result is kept.
#[test]
fn a_ud_scope_that_ends_with_receives_posted_returns_its_result() {
    /// Far below the drain timeout, which only the sends may take.
    const BOUND: Duration = Duration::from_millis(1500);
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = ud_qp(&pd, &cq, topo.port);
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let gid = ctx.query_gid(topo.port, topo.gid_index).unwrap().gid;
    let to_self = pd.create_ah(&AddressVector::roce(topo.port, gid, topo.gid_index)).unwrap();
    for sends in [false, true] {
        let start = Instant::now();
        let got = qp.scope(T, |s| -> Result<u32> {
            let bufs: Vec<[Sge<'_>; 1]> = (0..4).map(|i| [mr.sge(i * 1024..(i + 1) * 1024).unwrap()]).collect();
            let mut wrs: Vec<RecvRequest<'_, '_>> =
                bufs.iter().enumerate().map(|(i, b)| RecvRequest::new(i as u64, b)).collect();
            s.post_recv(&mut wrs)?;
            if sends {
                // A send the scope still has to wait for; its datagram takes one receive.
                let out = [mr.sge(4096..4100)?];
                s.post_send(&mut [SendRequest::send(9, &out).to(&to_self, qp.qp_num(), QKEY)])?;
            }
            Ok(42)
        });
        let took = start.elapsed();
        eprintln!("a UD scope with sends {sends} ended with receives posted: {got:?} in {took:?}");
        assert_eq!(got.unwrap(), 42, "the closure's result");
        assert!(took < BOUND, "the scope took {took:?}");
        assert_eq!(qp.state().unwrap(), QpState::ReadyToSend, "the QP is ready again");
        // And takes requests: a datagram to itself.
        qp.scope(T, |s| -> Result<()> {
            let inbox = [mr.sge(..1024)?];
            s.post_recv(&mut [RecvRequest::new(1, &inbox)])?;
            let out = [mr.sge(4096..4100)?];
            s.post_send(&mut [SendRequest::send(2, &out).to(&to_self, qp.qp_num(), QKEY)])?;
            let mut wcs: [WorkCompletion; 2] = Default::default();
            for wc in s.wait(2, &mut wcs, T)?.iter() {
                wc.ok()?;
            }
            Ok(())
        })
        .unwrap();
    }
}
