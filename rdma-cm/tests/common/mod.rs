//! Fixtures shared by rdma-cm's device tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use rdma_cm::*;
use rdma_verbs::*;

/// The bound every wait in these tests gets.
pub const T: Duration = Duration::from_secs(5);

/// Where servers listen: the server port's address, a port the CM picks.
pub fn server_any_port(topo: &testkit::Topology) -> SocketAddr {
    SocketAddr::new(topo.server.addr.into(), 0)
}

/// Where clients leave from: the client port's address (so traffic crosses the veth wire).
pub fn client_src(topo: &testkit::Topology) -> SocketAddr {
    SocketAddr::new(topo.client.addr.into(), 0)
}

/// Completions of a scope, each checked for success: `(wr_id, opcode, byte_len)`.
pub fn complete<S: TypeState>(s: &mut PostScope<'_, '_, Rc, S>, n: usize) -> Vec<(u64, WcOpcode, u32)> {
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let got = s.wait(n, &mut wcs, T).unwrap();
    got.iter()
        .map(|wc| {
            wc.ok().unwrap_or_else(|e| panic!("{e}"));
            (wc.wr_id(), wc.opcode(), wc.byte_len())
        })
        .collect()
}

/// A connection on fresh verbs resources, handed to `f`. The client side: resolve from the
/// client address, connect with `data` as private data.
pub fn client<R>(
    topo: &testkit::Topology,
    dst: SocketAddr,
    data: &[u8],
    f: impl FnOnce(rdma_cm::Result<Connection<'_>>, &ProtectionDomain<'_>) -> R,
) -> R {
    let id = CmId::new().unwrap().resolve(Some(client_src(topo)), dst).wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    let qp = id.init_qp(qp, AccessFlags::REMOTE_WRITE).unwrap();
    let conn = id.connect(qp, &ConnParams::new().private_data(data)).wait(T);
    f(conn, &pd)
}

/// Accepts `req` on fresh verbs resources with `data` as private data, and hands the connection
/// to `f`.
pub fn accept<R>(req: ConnectRequest, data: &[u8], f: impl FnOnce(Connection<'_>, &ProtectionDomain<'_>) -> R) -> R {
    let ctx = req.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(32, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    let qp = req.init_qp(qp, AccessFlags::REMOTE_WRITE).unwrap();
    let conn = req.accept(qp, &ConnParams::new().private_data(data)).wait(T).unwrap();
    f(conn, &pd)
}

/// Completions of a scope, `(wr_id, Some((opcode, byte_len)))` each; `None` for a send that
/// was flushed because the peer disconnected first.
///
/// For sends whose message the peer has received or is known to receive: an ACK can be lost
/// (seen on rxe: the peer had the message, our send never completed), and the retransmission
/// that would recover it needs the peer's QP, which its disconnect takes away. So while waiting,
/// a disconnect from the peer flushes this QP, and a flushed send is accepted; any other error,
/// a flushed receive, or no completion within [`T`] fails the test.
pub fn complete_unless_peer_left<S: TypeState>(
    s: &mut PostScope<'_, '_, Rc, S>,
    conn: &Connection<'_>,
    n: usize,
) -> Vec<(u64, Option<(WcOpcode, u32)>)> {
    let start = std::time::Instant::now();
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let mut got = Vec::new();
    while got.len() < n {
        let room = (n - got.len()).min(wcs.len());
        for wc in s.poll(&mut wcs[..room]).unwrap().iter() {
            match wc.ok() {
                Ok(_) => got.push((wc.wr_id(), Some((wc.opcode(), wc.byte_len())))),
                Err(_) if conn.peer_disconnected() && wc.status() == WcStatus::WrFlushError => {
                    got.push((wc.wr_id(), None))
                }
                Err(e) => panic!("request {}: {e}", wc.wr_id()),
            }
        }
        if !conn.peer_disconnected() {
            if let Some(ev) = conn.try_recv_event().unwrap() {
                assert_eq!(ev, Event::Disconnected, "the only event a connection expects");
                conn.qp().flush().unwrap();
            }
        }
        assert!(start.elapsed() < T, "{} of {n} completions within {T:?}", got.len());
        std::thread::yield_now();
    }
    got.sort_by_key(|c| c.0);
    got
}

/// One ping: the client sends `n`, the server answers `n + 1`, the client confirms with
/// `n + 2`; both check. The client disconnects afterwards.
///
/// The client sends last and waits for that send's completion (the server's QP lives until
/// the client leaves, so a lost ACK is retransmitted). The server's answer is confirmed by
/// that last message, so its completion may be a flush if the client is gone by then (see
/// [`complete_unless_peer_left`]).
pub fn ping_client(conn: &Connection<'_>, pd: &ProtectionDomain<'_>, n: u64) {
    let mr = pd.alloc_mr(24, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write_at(0, &n.to_le_bytes()).unwrap();
    mr.write_at(16, &(n + 2).to_le_bytes()).unwrap();
    conn.qp()
        .scope(T, |s| -> rdma_verbs::Result<_> {
            let (out, back, bye) = ([mr.sge(0..8)?], [mr.sge(8..16)?], [mr.sge(16..24)?]);
            s.post_recv(&mut [RecvRequest::new(2, &back)])?;
            s.post_send(&mut [SendRequest::send(1, &out)])?;
            let mut got = complete(s, 2);
            got.sort_by_key(|c| c.0);
            assert_eq!(got, [(1, WcOpcode::Send, 8), (2, WcOpcode::Recv, 8)]);
            let mut back = [0u8; 8];
            mr.read_at(8, &mut back)?;
            assert_eq!(u64::from_le_bytes(back), n + 1, "the server's answer");
            s.post_send(&mut [SendRequest::send(3, &bye)])?;
            assert_eq!(complete(s, 1), [(3, WcOpcode::Send, 8)]);
            Ok(())
        })
        .unwrap();
}

/// The server's half of [`ping_client`]: returns the client's `n`.
pub fn ping_server(conn: &Connection<'_>, pd: &ProtectionDomain<'_>) -> u64 {
    let mr = pd.alloc_mr(24, AccessFlags::LOCAL_WRITE).unwrap();
    conn.qp()
        .scope(T, |s| -> rdma_verbs::Result<_> {
            let (ping, answer, bye) = ([mr.sge(0..8)?], [mr.sge(8..16)?], [mr.sge(16..24)?]);
            // Both receives up front: the confirmation follows the answer at once.
            s.post_recv(&mut [RecvRequest::new(1, &ping), RecvRequest::new(3, &bye)])?;
            assert_eq!(complete(s, 1), [(1, WcOpcode::Recv, 8)]);
            let mut n = [0u8; 8];
            mr.read_at(0, &mut n)?;
            let n = u64::from_le_bytes(n);
            mr.write_at(8, &(n + 1).to_le_bytes())?;
            s.post_send(&mut [SendRequest::send(2, &answer)])?;
            let got = complete_unless_peer_left(s, conn, 2);
            assert!(matches!(got[0], (2, Some((WcOpcode::Send, 8)) | None)), "the answer: {:?}", got[0]);
            assert_eq!(got[1], (3, Some((WcOpcode::Recv, 8))), "the confirmation");
            let mut bye = [0u8; 8];
            mr.read_at(16, &mut bye)?;
            assert_eq!(u64::from_le_bytes(bye), n + 2, "the client's confirmation");
            Ok(n)
        })
        .unwrap()
}
