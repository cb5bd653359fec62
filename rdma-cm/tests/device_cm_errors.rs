//! Device tests: every way a connection attempt fails is a distinct, typed error, and comes
//! within the timeout.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rdma_cm::*;
use rdma_cm::{Error, Result};
use rdma_verbs::*;

/// The slack allowed past a timeout before an error counts as late.
const SLACK: Duration = Duration::from_millis(1500);

#[test]
fn a_rejection_carries_the_reason_and_the_private_data() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(T).unwrap();
            assert_eq!(&req.private_data()[..7], b"knock?!");
            req.reject(b"go away: server full").unwrap();
        });
        client(&topo, dst, b"knock?!", |conn, _| match conn {
            Err(Error::Rejected { addr, device, reason: RejectReason::ConsumerDefined, private_data }) => {
                assert_eq!(addr, dst);
                assert_eq!(device.as_deref(), Some(topo.client.device.as_str()), "the error names the device");
                assert_eq!(&private_data[..20], b"go away: server full");
                assert_eq!(private_data.len(), MAX_REJECT_PRIVATE_DATA, "REJ private data is zero-padded");
            }
            other => panic!("expected a consumer-defined rejection, got {:?}", other.map(|_| ())),
        });
    });
}

#[test]
fn a_request_dropped_unanswered_is_rejected() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| drop(listener.recv_request(T).unwrap()));
        client(&topo, dst, b"", |conn, _| {
            assert!(
                matches!(conn, Err(Error::Rejected { reason: RejectReason::ConsumerDefined, .. })),
                "{:?}",
                conn.map(|_| ())
            );
        });
    });
}

#[test]
fn no_listener_on_the_port_is_its_own_error_and_prompt() {
    let topo = testkit::require_topology!();
    // A port that had a listener a moment ago and has none now.
    let dst = Listener::bind(server_any_port(&topo), 1).unwrap().local_addr();
    let start = Instant::now();
    client(&topo, dst, b"", |conn, _| match conn {
        Err(Error::NoListener { addr, device }) => {
            assert_eq!(addr, dst);
            assert_eq!(device.as_deref(), Some(topo.client.device.as_str()));
        }
        other => panic!("expected NoListener, got {:?}", other.map(|_| ())),
    });
    assert!(start.elapsed() < T, "took {:?}", start.elapsed());
}

/// Resolving `dst` (from `src`) must fail promptly with `AddressResolution(ENODEV)`.
fn expect_no_device(src: Option<SocketAddr>, dst: SocketAddr) {
    let start = Instant::now();
    match CmId::new().unwrap().resolve_addr(src, dst).wait(T) {
        Err(Error::AddressResolution { addr, errno }) => {
            assert_eq!(addr, dst);
            assert_eq!(errno, libc::ENODEV, "{}", std::io::Error::from_raw_os_error(errno));
        }
        other => panic!("expected AddressResolution(ENODEV), got {other:?}"),
    }
    assert!(start.elapsed() < T);
}

#[test]
fn a_source_address_without_an_rdma_device_is_a_typed_error() {
    let topo = testkit::require_topology!();
    let src = SocketAddr::new(topo.plain_addr.into(), 0);
    expect_no_device(Some(src), SocketAddr::new(topo.server.addr.into(), 7471));
}

#[test]
fn a_destination_reached_without_an_rdma_device_is_a_typed_error() {
    let topo = testkit::require_topology!();
    expect_no_device(None, SocketAddr::new(topo.plain_peer.into(), 7471));
}

#[test]
fn a_neighbour_that_never_answers_arp_times_out_on_time() {
    let topo = testkit::require_topology!();
    // On the server port's subnet, but nobody has it: ARP goes unanswered.
    let octets = topo.server.addr.octets();
    let dst = SocketAddr::from(([octets[0], octets[1], octets[2], 99], 7471));
    let timeout = Duration::from_secs(2);
    let start = Instant::now();
    let err = CmId::new().unwrap().resolve_addr(Some(client_src(&topo)), dst).wait(timeout).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::Timeout { what: "rdma_resolve_addr", device: None, .. }), "{err:?}");
    assert!(err.is_timeout());
    assert!(took >= timeout && took < timeout + SLACK, "took {took:?}");
}

#[test]
fn a_peer_that_never_answers_the_request_times_out_on_time() {
    let topo = testkit::require_topology!();
    // A listener whose requests nobody reads: the peer's CM never accepts or rejects.
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    let id = CmId::new().unwrap().resolve(Some(client_src(&topo)), dst).wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap();
    let timeout = Duration::from_secs(2);
    let start = Instant::now();
    let err = id.connect(qp, &ConnParams::new()).wait(timeout).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::Timeout { what: "rdma_connect", .. }), "{err:?}");
    assert!(err.to_string().starts_with(&format!("rdma_connect on {}: ", topo.client.device)), "{err}");
    assert!(took >= timeout && took < timeout + SLACK, "took {took:?}");
    // The request did reach the listener; answering it now finds the client gone: the CM has
    // already dropped the request's state, so the QP cannot even be initialised.
    let req = listener.recv_request(T).unwrap();
    let ctx = req.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let late: Result<Connection<'_>> = req
        .init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty())
        .and_then(|qp| req.accept(qp, &ConnParams::new()).wait(Duration::from_secs(2)));
    assert!(late.is_err(), "accepting a request whose sender gave up must fail");
}

#[test]
fn bad_arguments_fail_before_anything_is_sent() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    let too_much = [1u8; MAX_CONNECT_PRIVATE_DATA + 1];
    client(&topo, dst, &too_much, |conn, _| {
        assert!(matches!(conn, Err(Error::InvalidArgument { verb: "rdma_connect", .. })), "{:?}", conn.map(|_| ()));
    });
    assert!(matches!(listener.try_recv_request(), Ok(None)), "an invalid connect must not reach the listener");
    // A QP on the server's device cannot be connected through the client's.
    let id = CmId::new().unwrap().resolve(Some(client_src(&topo)), dst).wait(T).unwrap();
    let other = Context::open(&topo.server.device).unwrap();
    let pd = other.alloc_pd().unwrap();
    let cq = other.create_cq(8, None).unwrap();
    let err = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap_err();
    match err {
        Error::DeviceMismatch { cm_device, qp_device } => {
            assert_eq!((cm_device, qp_device), (topo.client.device.clone(), topo.server.device.clone()));
        }
        other => panic!("expected DeviceMismatch, got {other:?}"),
    }
    // A wait already over asks nothing and times out (it was `InvalidArgument`, "at least
    // 1 ms", before the transitions became pending values).
    assert!(matches!(
        CmId::new().unwrap().resolve_addr(None, dst).wait(Duration::ZERO),
        Err(Error::Timeout { what: "rdma_resolve_addr", .. })
    ));
}
