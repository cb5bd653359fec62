//! Device tests: a connection set up by the CM, rxe1 (10.77.0.2) -> rxe0 (10.77.0.1), used for
//! a send/recv and an RDMA WRITE, ended by either side.

mod common;

use std::net::SocketAddr;

use common::*;
use rdma_cm::*;
use rdma_verbs::*;

const HELLO: &[u8] = b"hello from the client";
const WELCOME: &[u8] = b"welcome; write here:";
const LEN: usize = 8192;

/// What the client WRITEs: a pattern per round, ending in the "done!" it also SENDs.
fn payload(round: u8) -> Vec<u8> {
    let mut p: Vec<u8> = (0..LEN).map(|i| (i as u8).wrapping_mul(31).wrapping_add(round)).collect();
    p[LEN - 5..].copy_from_slice(b"done!");
    p
}

/// The server: checks the request, accepts with its region's address and key as private data,
/// waits for the client's WRITE then SEND, checks both, and ends the connection.
fn server(listener: &Listener, topo: &testkit::Topology, round: u8, client_leaves: bool) {
    let req = listener.recv_request(T).unwrap();
    assert_eq!(&req.private_data()[..HELLO.len()], HELLO, "the client's private data");
    assert_eq!(req.private_data().len(), MAX_CONNECT_PRIVATE_DATA, "REQ private data is zero-padded");
    assert!(req.private_data()[HELLO.len()..].iter().all(|&b| b == 0));
    assert_eq!(req.peer_addr().ip(), topo.client.addr);
    assert_eq!(req.local_addr(), listener.local_addr());
    assert_eq!(req.device_name(), topo.server.device);
    let ctx = req.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let data = pd.alloc_mr(LEN, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap();
    let msg = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let qp = req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::REMOTE_WRITE).unwrap();
    let mut reply = WELCOME.to_vec();
    reply.extend(data.addr().to_le_bytes());
    reply.extend(data.rkey().to_le_bytes());
    let conn = req.accept(qp, &ConnParams::new().private_data(&reply)).wait(T).unwrap();
    assert_eq!(conn.peer_addr().ip(), topo.client.addr);
    assert_eq!(conn.local_addr(), listener.local_addr());
    assert_eq!(conn.device_name(), topo.server.device);
    conn.qp()
        .scope(T, |s| -> rdma_verbs::Result<_> {
            let buf = [msg.sge(..).unwrap()];
            s.post_recv(&mut [RecvRequest::new(7, &buf)]).unwrap();
            assert_eq!(complete(s, 1), [(7, WcOpcode::Recv, 5)]);
            Ok(())
        })
        .unwrap();
    let mut text = [0u8; 5];
    msg.read_at(0, &mut text).unwrap();
    assert_eq!(&text, b"done!");
    // RC ordering: the WRITE landed before the SEND that followed it.
    let mut got = vec![0u8; LEN];
    data.read_at(0, &mut got).unwrap();
    assert!(got == payload(round), "round {round}: the RDMA WRITE's data");
    let gone = if client_leaves { conn.peer_disconnect().wait(T) } else { conn.disconnect().wait(T) };
    let gone = gone.unwrap_or_else(|e| panic!("round {round}, server: {e}"));
    assert_eq!(gone.qp().state().unwrap(), QpState::Error, "the QP is flushed");
}

/// The client: connects, reads the server's region from its private data, WRITEs a pattern
/// there, SENDs "done!", and ends the connection.
fn client_side(topo: &testkit::Topology, dst: SocketAddr, round: u8, client_leaves: bool) {
    let id = CmId::new().unwrap().resolve_addr(Some(client_src(topo)), dst).wait(T).unwrap();
    assert_eq!(id.device_name(), topo.client.device, "10.77.0.2 resolves to the client port");
    assert_eq!(id.port(), topo.port);
    assert_eq!(id.peer_addr(), dst);
    assert_eq!(id.local_addr().ip(), topo.client.addr);
    assert_ne!(id.local_addr().port(), 0, "the CM picked a source port");
    let local = id.local_addr();
    let id = id.resolve_route().wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let src = pd.alloc_mr(LEN, AccessFlags::LOCAL_WRITE).unwrap();
    src.write_at(0, &payload(round)).unwrap();
    let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap();
    let conn = id.connect(qp, &ConnParams::new().private_data(HELLO)).wait(T).unwrap();
    let pdata = conn.private_data();
    assert_eq!(pdata.len(), MAX_ACCEPT_PRIVATE_DATA, "REP private data is zero-padded");
    assert_eq!(&pdata[..WELCOME.len()], WELCOME, "the server's private data");
    let at = WELCOME.len();
    let addr = u64::from_le_bytes(pdata[at..at + 8].try_into().unwrap());
    let rkey = u32::from_le_bytes(pdata[at + 8..at + 12].try_into().unwrap());
    let remote = RemoteRegion { addr, rkey, len: LEN as u64 };
    assert_eq!(conn.peer_addr(), dst);
    assert_eq!(conn.local_addr(), local);
    assert_eq!(conn.local_addr().ip(), topo.client.addr);
    assert_eq!(conn.device_name(), topo.client.device);
    conn.qp()
        .scope(T, |s| -> rdma_verbs::Result<_> {
            let whole = [src.sge(0..LEN).unwrap()];
            // The payload's last 5 bytes, "done!", go out again as a message.
            let tail = [src.sge(LEN - 5..LEN).unwrap()];
            s.post_send(&mut [SendRequest::write(1, &whole, remote), SendRequest::send(2, &tail)]).unwrap();
            // The server disconnects once "done!" arrived: our completions may be flushes then.
            let got = complete_unless_peer_left(s, &conn, 2);
            const WRITTEN: u32 = LEN as u32;
            assert!(matches!(got[0], (1, Some((WcOpcode::RdmaWrite, WRITTEN)) | None)), "{got:?}");
            assert!(matches!(got[1], (2, Some((WcOpcode::Send, 5)) | None)), "{got:?}");
            Ok(())
        })
        .unwrap();
    let gone = if client_leaves { conn.disconnect().wait(T) } else { conn.peer_disconnect().wait(T) };
    let gone = gone.unwrap_or_else(|e| panic!("round {round}, client: {e}"));
    assert_eq!(gone.peer_addr(), dst);
    assert_eq!(gone.qp().state().unwrap(), QpState::Error, "the QP is flushed");
}

#[test]
fn connect_with_private_data_send_write_and_disconnect_from_either_side() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    assert_eq!(dst.ip(), topo.server.addr);
    assert_ne!(dst.port(), 0, "the CM picked a port");
    assert_eq!(listener.device_name(), Some(topo.server.device.as_str()), "a specific address binds its device");
    for (round, client_leaves) in [(1, true), (2, false)] {
        std::thread::scope(|s| {
            let srv = s.spawn(|| server(&listener, &topo, round, client_leaves));
            client_side(&topo, dst, round, client_leaves);
            srv.join().unwrap();
        });
    }
}

#[test]
fn a_ping_over_a_connection_made_by_the_helpers() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(T).unwrap();
            accept(req, b"", |conn, pd| {
                assert_eq!(ping_server(&conn, pd), 41);
                conn.peer_disconnect().wait(T).unwrap();
            })
        });
        client(&topo, dst, b"", |conn, pd| {
            let conn = conn.unwrap();
            ping_client(&conn, pd, 41);
            conn.disconnect().wait(T).unwrap();
        });
    });
}
