//! Device tests: unreliable datagrams set up only through the CM (`RDMA_PS_UDP`): a service ID
//! resolution from rxe1 (10.77.0.2) to a UD listener on rxe0 (10.77.0.1) gives the address
//! handle, QP number and Q_Key a datagram needs; its refusals are typed; and a multicast group
//! joined by both ports carries a datagram to its member until the member leaves.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use rdma_cm::*;
use rdma_cm::{Error, Result};
use rdma_verbs::*;

/// A UD receive starts with the 40-byte GRH on RoCE.
const GRH: usize = 40;
/// `RDMA_UDP_QKEY` (`rdma_cma.h`): the Q_Key of the UDP port space.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// The slack allowed past a timeout before an error counts as late.
const SLACK: Duration = Duration::from_millis(1500);
/// An administratively scoped IPv4 group, carried only by the VM's veth wire.
const GROUP: &str = "239.77.0.1:0";

/// Completions of a UD scope, each checked for success: `(wr_id, opcode, byte_len, src_qp)`.
fn complete_ud(s: &mut PostScope<'_, '_, Ud, ReadyToSend>, n: usize) -> Vec<(u64, WcOpcode, u32, u32)> {
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let got = s.wait(n, &mut wcs, T).unwrap();
    got.iter()
        .map(|wc| {
            wc.ok().unwrap_or_else(|e| panic!("{e}"));
            (wc.wr_id(), wc.opcode(), wc.byte_len(), wc.src_qp())
        })
        .collect()
}

/// Sends `msg` as one datagram through `ah` to `(qp_num, qkey)`, and waits for its completion.
fn send_datagram(
    qp: &QueuePair<'_, Ud, ReadyToSend>,
    pd: &ProtectionDomain<'_>,
    ah: &AddressHandle<'_>,
    (qp_num, qkey): (u32, u32),
    msg: &[u8],
) {
    let mr = pd.alloc_mr(msg.len(), AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_at(0, msg).unwrap();
    qp.scope(T, |s| -> Result<_> {
        let src = [mr.sge(..)?];
        s.post_send(&mut [SendRequest::send(1, &src).to(ah, qp_num, qkey)])?;
        assert_eq!(complete_ud(s, 1)[0].0, 1);
        Ok(())
    })
    .unwrap();
}

/// The bytes of a message: `len` of them, from `seed`.
fn message(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// A UD client: resolves `dst` from the client's address, readies a UD QP through the
/// identifier, and hands the route-resolved identifier, PD and QP to `f`.
fn ud_client<R>(
    topo: &testkit::Topology,
    dst: SocketAddr,
    f: impl FnOnce(UdId<RouteResolved>, &ProtectionDomain<'_>, &QueuePair<'_, Ud, ReadyToSend>) -> R,
) -> R {
    let id = UdId::new().unwrap().resolve(Some(client_src(topo)), dst).wait(T).unwrap();
    assert_eq!(id.device_name(), topo.client.device);
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
    f(id, &pd, &qp)
}

#[test]
fn a_datagram_set_up_only_through_the_cm_arrives_with_its_grh() {
    let topo = testkit::require_topology!();
    let listener = UdListener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    assert_eq!(listener.device_name(), Some(topo.server.device.as_str()));
    let msg = message(1000, 3);
    let (qpn_tx, qpn_rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(T).unwrap();
            assert_eq!(&req.private_data()[..6], b"hello?");
            assert_eq!(req.private_data().len(), MAX_SIDR_REQUEST_PRIVATE_DATA, "SIDR REQ data is zero-padded");
            assert_eq!(req.peer_addr().ip(), topo.client.addr);
            assert_eq!(req.local_addr(), dst);
            assert_eq!(req.device_name(), topo.server.device);
            let ctx = req.open_context().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(16, None).unwrap();
            let qp = req.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
            assert_eq!(qp.state().unwrap(), QpState::ReadyToSend);
            let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
            let (qpn, client_qpn) = qp
                .scope(T, |s| -> Result<_> {
                    let buf = [mr.sge(0..GRH + 2048)?];
                    s.post_recv(&mut [RecvRequest::new(9, &buf)])?;
                    // The receive is posted before the client learns the QP number.
                    let qpn = qp.qp_num();
                    req.accept(&qp, b"welcome")?;
                    let got = complete_ud(s, 1);
                    assert_eq!((got[0].0, got[0].2), (9, (GRH + 1000) as u32), "the GRH, then the payload");
                    assert_eq!(got[0].1, WcOpcode::Recv);
                    Ok((qpn, got[0].3))
                })
                .unwrap();
            qpn_tx.send((qpn, client_qpn)).unwrap();
            let mut got = vec![0u8; 1000];
            mr.read_at(GRH, &mut got).unwrap();
            assert!(got == msg, "the datagram's payload, after the GRH");
        });
        let sender_qpn = ud_client(&topo, dst, |id, pd, qp| {
            let peer = id.resolve_peer(b"hello?").wait(T).unwrap();
            assert_eq!(peer.qkey(), RDMA_UDP_QKEY, "the UDP port space's Q_Key");
            assert_eq!(&peer.private_data()[..7], b"welcome");
            assert_eq!(peer.private_data().len(), MAX_SIDR_REPLY_PRIVATE_DATA, "SIDR REP data is zero-padded");
            assert_eq!(peer.peer_addr(), dst);
            assert_eq!(peer.device_name(), topo.client.device);
            let av = peer.params().address;
            assert_eq!(av.port, topo.port);
            assert_eq!(av.dgid, Gid::from(topo.server.addr), "the route's destination GID");
            assert_eq!(av.sgid_index, topo.gid_index, "the RoCE v2 GID of the client's address");
            send_datagram(qp, pd, &peer.create_ah(pd).unwrap(), (peer.qp_num(), peer.qkey()), &msg);
            qp.qp_num()
        });
        let (qpn, client_qpn) = qpn_rx.recv_timeout(T).unwrap();
        assert_ne!(qpn, 0);
        assert_eq!(client_qpn, sender_qpn, "the receive names the sender's QP");
    });
}

#[test]
fn resolving_a_port_nobody_listens_on_is_no_listener_and_prompt() {
    let topo = testkit::require_topology!();
    // A port that had a listener a moment ago and has none now.
    let dst = UdListener::bind(server_any_port(&topo), 1).unwrap().local_addr();
    ud_client(&topo, dst, |id, _, _| {
        let start = Instant::now();
        match id.resolve_peer(b"anyone?").wait(T) {
            Err(Error::NoListener { addr, device }) => {
                assert_eq!(addr, dst);
                assert_eq!(device.as_deref(), Some(topo.client.device.as_str()));
            }
            other => panic!("expected NoListener, got {other:?}"),
        }
        assert!(start.elapsed() < T / 2, "the peer's CM answered at once: {:?}", start.elapsed());
    });
}

#[test]
fn a_rejection_carries_the_private_data_and_a_dropped_request_is_one() {
    let topo = testkit::require_topology!();
    let listener = UdListener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            listener.recv_request(T).unwrap().reject(b"not you").unwrap();
            drop(listener.recv_request(T).unwrap());
        });
        for expect in [&b"not you"[..], &[]] {
            ud_client(&topo, dst, |id, _, _| match id.resolve_peer(b"").wait(T) {
                Err(Error::Rejected { addr, reason: RejectReason::ConsumerDefined, private_data, .. }) => {
                    assert_eq!(addr, dst);
                    assert_eq!(&private_data[..expect.len()], expect);
                    assert!(private_data[expect.len()..].iter().all(|&b| b == 0), "{private_data:?}");
                }
                other => panic!("expected a rejection, got {other:?}"),
            });
        }
    });
}

#[test]
fn too_much_private_data_is_refused_before_anything_is_sent() {
    let topo = testkit::require_topology!();
    let listener = UdListener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(T).unwrap();
            assert_eq!(req.private_data(), &[5; MAX_SIDR_REQUEST_PRIVATE_DATA][..], "the most a request carries");
            let ctx = req.open_context().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4, None).unwrap();
            let qp = req.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
            let err = req.accept(&qp, &[0; MAX_SIDR_REPLY_PRIVATE_DATA + 1]).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { verb: "rdma_accept", .. }), "{err}");
        });
        ud_client(&topo, dst, |id, _, _| {
            let err = id.resolve_peer(&[5; MAX_SIDR_REQUEST_PRIVATE_DATA + 1]).wait(T).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { verb: "rdma_connect", .. }), "{err}");
        });
        // The refused answer rejected the request.
        ud_client(&topo, dst, |id, _, _| {
            let got = id.resolve_peer(&[5; MAX_SIDR_REQUEST_PRIVATE_DATA]).wait(T);
            assert!(matches!(got, Err(Error::Rejected { .. })), "{got:?}");
        });
    });
}

#[test]
fn an_unanswered_resolution_times_out_at_the_callers_bound() {
    let topo = testkit::require_topology!();
    let listener = UdListener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let listener = &listener;
    std::thread::scope(|s| {
        s.spawn(move || {
            // Holds the request unanswered until the client gave up.
            let req = listener.recv_request(T).unwrap();
            done_rx.recv_timeout(T * 2).unwrap();
            drop(req);
        });
        ud_client(&topo, dst, |id, _, _| {
            let bound = Duration::from_millis(800);
            let start = Instant::now();
            let err = id.resolve_peer(b"").wait(bound).unwrap_err();
            assert!(matches!(err, Error::Timeout { after, .. } if after == bound), "{err}");
            assert!(err.is_timeout());
            assert!(start.elapsed() >= bound && start.elapsed() < bound + SLACK, "{:?}", start.elapsed());
        });
        done_tx.send(()).unwrap();
    });
}

#[test]
fn a_qp_or_pd_on_another_device_is_refused() {
    let topo = testkit::require_topology!();
    let listener = UdListener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    let other = Context::open(&topo.server.device).unwrap();
    let other_pd = other.alloc_pd().unwrap();
    let other_cq = other.create_cq(4, None).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(T).unwrap();
            let ctx = Context::open(&topo.client.device).unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(4, None).unwrap();
            let wrong = pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap();
            let err = req.init_qp(wrong).unwrap_err();
            assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
            let right = req.open_context().unwrap();
            let rpd = right.alloc_pd().unwrap();
            let rcq = right.create_cq(4, None).unwrap();
            let qp = req.init_qp(rpd.create_qp::<Ud>(QpCreateAttr::new(&rcq, &rcq)).unwrap()).unwrap();
            req.accept(&qp, b"").unwrap();
        });
        ud_client(&topo, dst, |id, _, _| {
            let wrong = other_pd.create_qp::<Ud>(QpCreateAttr::new(&other_cq, &other_cq)).unwrap();
            let err = id.init_qp(wrong).unwrap_err();
            assert!(
                matches!(&err, Error::DeviceMismatch { cm_device, qp_device }
                    if *cm_device == topo.client.device && *qp_device == topo.server.device),
                "{err}"
            );
            let peer = id.resolve_peer(b"").wait(T).unwrap();
            let err = peer.create_ah(&other_pd).unwrap_err();
            assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
        });
    });
}

/// One member of `group`: an identifier resolved from `local` to the group, its UD QP, and what
/// `f` does with the membership.
fn member<R>(
    local: std::net::Ipv4Addr,
    group: SocketAddr,
    f: impl FnOnce(Membership<'_>, &ProtectionDomain<'_>, &QueuePair<'_, Ud, ReadyToSend>) -> R,
) -> R {
    let mut id = UdId::new().unwrap().resolve_addr(Some(SocketAddr::new(local.into(), 0)), group).wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
    let membership = id.join(group, &qp).wait(T).unwrap_or_else(|e| panic!("joining {group} from {local}: {e}"));
    f(membership, &pd, &qp)
}

/// Joins `group` from `local` with `qp` (readied through another identifier: every UD
/// identifier gives the same Q_Key) and hands the membership to `f`.
fn join_with<R>(
    local: std::net::Ipv4Addr,
    group: SocketAddr,
    qp: &QueuePair<'_, Ud, ReadyToSend>,
    f: impl FnOnce(&Membership<'_>) -> R,
) -> R {
    let mut id = UdId::new().unwrap().resolve_addr(Some(SocketAddr::new(local.into(), 0)), group).wait(T).unwrap();
    let membership = id.join(group, qp).wait(T).unwrap_or_else(|e| panic!("joining {group} from {local}: {e}"));
    f(&membership)
}

/// Sends `msg` to `group` from a member on `local`; returns the sending QP's number.
fn send_to_group(local: std::net::Ipv4Addr, group: SocketAddr, msg: &[u8]) -> u32 {
    member(local, group, |to_group, pd, qp| {
        send_datagram(qp, pd, &to_group.create_ah(pd).unwrap(), (to_group.qp_num(), to_group.qkey()), msg);
        qp.qp_num()
    })
}

#[test]
fn a_datagram_to_a_joined_group_arrives_at_the_member_until_it_leaves() {
    let topo = testkit::require_topology!();
    let group: SocketAddr = GROUP.parse().unwrap();
    let (first, second, third) = (message(512, 11), message(512, 12), message(512, 13));
    member(topo.server.addr, group, |membership, pd, qp| {
        assert_eq!(membership.group(), group);
        assert_eq!(membership.qp_num(), 0xFF_FFFF, "sends to a group go to QP 0xFFFFFF");
        assert_eq!(membership.qkey(), RDMA_UDP_QKEY);
        assert_eq!(membership.device_name(), topo.server.device);
        assert_eq!(
            membership.mgid().to_ipv4_mapped().map(std::net::IpAddr::from),
            Some(group.ip()),
            "the MGID maps the group"
        );
        println!(
            "joined {group} on {}: MGID {}, MLID {}",
            membership.device_name(),
            membership.mgid(),
            membership.mlid()
        );
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let payload = |at: usize| {
            let mut got = vec![0u8; 512];
            mr.read_at(at + GRH, &mut got).unwrap();
            got
        };
        qp.scope(T, |s| -> Result<_> {
            let buf = [mr.sge(0..GRH + 1024)?];
            s.post_recv(&mut [RecvRequest::new(3, &buf)])?;
            let sender_qpn = send_to_group(topo.client.addr, group, &first);
            let got = complete_ud(s, 1);
            assert_eq!((got[0].0, got[0].2), (3, (GRH + 512) as u32), "the GRH, then the payload");
            assert_eq!(got[0].3, sender_qpn, "from the sender's QP");
            Ok(())
        })
        .unwrap();
        assert!(payload(0) == first, "the group's datagram");
        // RoCE v2 over IPv4: the GRH's 40 bytes end with the packet's IPv4 header, whose
        // destination (its last 4 bytes) is the group.
        let mut dst = [0u8; 4];
        mr.read_at(GRH - 4, &mut dst).unwrap();
        assert_eq!(std::net::Ipv4Addr::from(dst), group.ip(), "the datagram was addressed to the group");

        // Left (the QP detached, the group left): a datagram to the group no longer arrives.
        // Joined again, through another identifier: the next one does, and it is not the one
        // sent meanwhile. (The receive is consumed in the end: rxe on Linux 6.1 never flushes a
        // UD receive left posted, so a scope could not drain it.)
        drop(membership);
        qp.scope(T, |s| -> Result<_> {
            let buf = [mr.sge(2048..2048 + GRH + 1024)?];
            s.post_recv(&mut [RecvRequest::new(4, &buf)])?;
            send_to_group(topo.client.addr, group, &second);
            let mut wcs: [WorkCompletion; 1] = Default::default();
            let waited = s.wait(1, &mut wcs, Duration::from_millis(500));
            assert!(matches!(waited, Err(rdma_verbs::Error::Timeout { .. })), "after leaving: {waited:?}");
            join_with(topo.server.addr, group, qp, |_| {
                send_to_group(topo.client.addr, group, &third);
                // Received while still a member.
                assert_eq!(complete_ud(s, 1)[0].0, 4);
            });
            Ok(())
        })
        .unwrap();
        assert!(payload(2048) == third, "joined again, the next datagram arrives, not the one sent meanwhile");
    });
}

/// A membership's hold of its group is its own: the QP's `detach_multicast`, which gives up
/// holds of `attach_multicast`, cannot take it, so the QP stays attached while the membership
/// lives, and the membership's drop is what detaches it.
#[test]
fn detach_multicast_cannot_take_the_hold_of_a_membership() {
    let topo = testkit::require_topology!();
    let group: SocketAddr = GROUP.parse().unwrap();
    member(topo.server.addr, group, |membership, pd, qp| {
        let (gid, lid) = (membership.mgid(), membership.mlid());
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        let still_a_member = |what: &str, seed: u8| {
            qp.scope(T, |s| -> Result<_> {
                let buf = [mr.sge(0..GRH + 1024)?];
                s.post_recv(&mut [RecvRequest::new(7, &buf)])?;
                send_to_group(topo.client.addr, group, &message(128, seed));
                assert_eq!(complete_ud(s, 1)[0].0, 7, "{what}: the group's datagram arrives");
                Ok(())
            })
            .unwrap();
        };
        let e = qp.detach_multicast(gid, lid).unwrap_err();
        assert!(matches!(e, rdma_verbs::Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("only through a MulticastAttachment"), "{e}");
        still_a_member("after a refused detach", 31);
        // The QP's own holds are counted apart: attached and detached again, the membership's
        // hold stays.
        qp.attach_multicast(gid, lid).unwrap();
        qp.detach_multicast(gid, lid).unwrap();
        assert!(qp.detach_multicast(gid, lid).is_err(), "one own hold, given up once");
        still_a_member("after the QP's own hold came and went", 32);
        drop(membership);
        let e = qp.detach_multicast(gid, lid).unwrap_err();
        assert!(e.to_string().contains("is not attached"), "the membership's drop detached: {e}");
    });
}

#[test]
fn an_ipv6_group_on_roce_v2_is_refused_as_unsupported_and_leaves_the_id_usable() {
    let topo = testkit::require_topology!();
    let v4: SocketAddr = "239.77.0.2:0".parse().unwrap();
    let v6: SocketAddr = "[ff0e::77]:0".parse().unwrap();
    let local = SocketAddr::new(topo.server.addr.into(), 0);
    let mut id = UdId::new().unwrap().resolve_addr(Some(local), v4).wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
    match id.join(v6, &qp).wait(T) {
        Err(Error::Unsupported { verb: "rdma_join_multicast", device, errno: Some(524), reason }) => {
            assert_eq!(device.as_deref(), Some(topo.server.device.as_str()));
            println!("refused: {reason}");
        }
        other => panic!("expected ENOTSUPP (524) from rdma_join_multicast, got {other:?}"),
    }
    // Nothing was left joined or half-done: the same identifier and QP join an IPv4 group.
    let membership = id.join(v4, &qp).wait(T).unwrap();
    assert_eq!(membership.group(), v4);
}

#[test]
fn a_qp_keeps_its_group_attachments_counted_and_detaches_before_it_is_destroyed() {
    let topo = testkit::require_topology!();
    let group: SocketAddr = GROUP.parse().unwrap();
    let qps = || testkit::resource_count(&topo.server.device, "qp");
    let before = qps();
    // Two identifiers join the group on one QP: the first to leave leaves the QP attached for
    // the other (the kernel keeps one attachment per QP and group).
    member(topo.server.addr, group, |first, pd, qp| {
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
        join_with(topo.server.addr, group, qp, |_second| {
            drop(first);
            qp.scope(T, |s| -> Result<_> {
                let buf = [mr.sge(0..GRH + 1024)?];
                s.post_recv(&mut [RecvRequest::new(5, &buf)])?;
                send_to_group(topo.client.addr, group, &message(256, 21));
                assert_eq!(complete_ud(s, 1)[0].0, 5, "still a member through the second identifier");
                Ok(())
            })
            .unwrap();
        });
    });
    // A membership forgotten: the QP detaches when it is dropped, so it is destroyed (the
    // kernel refuses to destroy an attached QP).
    {
        let local = SocketAddr::new(topo.server.addr.into(), 0);
        let mut id = UdId::new().unwrap().resolve_addr(Some(local), group).wait(T).unwrap();
        let ctx = id.open_context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
        std::mem::forget(id.join(group, &qp).wait(T).unwrap());
        assert_eq!(qps(), before + 1);
        drop(qp);
        assert_eq!(qps(), before, "the QP of a forgotten membership was destroyed");
    }
}
