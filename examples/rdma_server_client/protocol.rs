//! The protocol of rdma-core's `rdma_server` and `rdma_client` (`librdmacm/examples`): the
//! client connects (no private data) and SENDs 16 bytes; the server, having posted a receive
//! before accepting, answers with a SEND of 16 bytes; both disconnect. One message each way per
//! connection.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_cm::{CmId, ConnParams, Listener};
use rdma_verbs::{AccessFlags, QpCaps, QpCreateAttr, Rc, RecvRequest, SendRequest};

use crate::cm::{await_ids, BoxError};

/// The tools' default port.
pub const DEFAULT_PORT: u16 = 7471;
/// The size of each message.
pub const MSG_LEN: usize = 16;

const RECV: u64 = 1;
const SEND: u64 = 2;

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 1, max_recv_wr: 1, max_inline_data: MSG_LEN as u32, ..QpCaps::default() }
}

/// The client: connects to `dst` (from `src` if given), sends `msg`, and returns the server's
/// 16-byte answer.
///
/// # Errors
/// Connection errors, failed completions, a reply of the wrong size, timeouts.
pub fn client(
    dst: SocketAddr,
    src: Option<SocketAddr>,
    msg: &[u8; MSG_LEN],
    timeout: Duration,
) -> Result<[u8; MSG_LEN], BoxError> {
    let id = CmId::new()?.resolve(src, dst).wait(timeout)?;
    let ctx = id.open_context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4, None)?;
    let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps()))?, AccessFlags::empty())?;
    let mr = pd.alloc_mr(2 * MSG_LEN, AccessFlags::LOCAL_WRITE)?;
    mr.write_at(0, msg)?;
    let conn = id.connect(qp, &ConnParams::new()).wait(timeout)?;
    conn.qp().scope(timeout, |s| -> Result<(), BoxError> {
        let (out, back) = ([mr.sge(..MSG_LEN)?], [mr.sge(MSG_LEN..)?]);
        s.post_recv(&mut [RecvRequest::new(RECV, &back)])?;
        s.post_send(&mut [SendRequest::send(SEND, &out)])?;
        let got = await_ids(s, &conn, &[RECV, SEND], timeout)?.ok_or("the server left before answering")?;
        match got.iter().find(|(id, _)| *id == RECV) {
            Some((_, len)) if *len as usize == MSG_LEN => Ok(()),
            other => Err(format!("the server's answer: {other:?}, not {MSG_LEN} bytes").into()),
        }
    })?;
    let mut reply = [0u8; MSG_LEN];
    mr.read_at(MSG_LEN, &mut reply)?;
    conn.disconnect().wait(timeout)?;
    Ok(reply)
}

/// The server: accepts one connection on `listener`, receives the client's 16 bytes, answers
/// with `reply`, and disconnects. Returns what the client sent.
///
/// # Errors
/// Connection errors, failed completions, a message of the wrong size, timeouts.
pub fn serve(listener: &Listener, reply: &[u8; MSG_LEN], timeout: Duration) -> Result<[u8; MSG_LEN], BoxError> {
    let req = listener.recv_request(timeout)?;
    let ctx = req.open_context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4, None)?;
    let qp = req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps()))?, AccessFlags::empty())?;
    let mr = pd.alloc_mr(2 * MSG_LEN, AccessFlags::LOCAL_WRITE)?;
    mr.write_at(MSG_LEN, reply)?;
    let conn = req.accept(qp, &ConnParams::new()).wait(timeout)?;
    conn.qp().scope(timeout, |s| -> Result<(), BoxError> {
        let (inbox, out) = ([mr.sge(..MSG_LEN)?], [mr.sge(MSG_LEN..)?]);
        s.post_recv(&mut [RecvRequest::new(RECV, &inbox)])?;
        let got = await_ids(s, &conn, &[RECV], timeout)?.ok_or("the client left before sending")?;
        if got[0].1 as usize != MSG_LEN {
            return Err(format!("the client sent {} bytes, not {MSG_LEN}", got[0].1).into());
        }
        s.post_send(&mut [SendRequest::send(SEND, &out)])?;
        await_ids(s, &conn, &[SEND], timeout)?.ok_or("the client left before the answer")?;
        Ok(())
    })?;
    let mut msg = [0u8; MSG_LEN];
    mr.read_at(0, &mut msg)?;
    conn.disconnect().wait(timeout)?;
    Ok(msg)
}
