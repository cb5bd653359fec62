//! rping's protocol, as rdma-core's `librdmacm/examples/rping.c` speaks it.
//!
//! Each ping: the client SENDs a 16-byte `struct rping_rdma_info { __be64 buf; __be32 rkey;
//! __be32 size; }` naming its source buffer; the server RDMA READs it and SENDs a 16-byte "go
//! ahead"; the client SENDs the info of its sink buffer; the server RDMA WRITEs the data back
//! (up to and including its first NUL) and SENDs "go ahead" again. The data is the text
//! `"rdma-ping-%d: "` followed by letters `A..z` starting one further each ping, NUL-terminated
//! at the buffer's end. The client disconnects after its last ping.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_cm::{CmId, ConnParams, Listener};
use rdma_verbs::{AccessFlags, QpCaps, QpCreateAttr, Rc, RecvRequest, RemoteRegion, SendRequest};

use crate::cm::{await_ids, drain, BoxError};

/// rping's default port.
pub const DEFAULT_PORT: u16 = 7174;
/// rping's default buffer size (`-S`).
pub const DEFAULT_SIZE: usize = 64;
/// rping's smallest buffer: room for `"rdma-ping-2147483647: "` and a NUL.
pub const MIN_SIZE: usize = 26;
/// rping's largest buffer.
pub const MAX_SIZE: usize = 64 * 1024 - 1;
/// The size of `struct rping_rdma_info`.
pub const INFO_LEN: usize = 16;

const RECV: u64 = 1;
const SEND: u64 = 2;
const RDMA: u64 = 3;

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Bytes per ping (`-S`), [`MIN_SIZE`]..=[`MAX_SIZE`].
    pub size: usize,
    /// Pings (`-C`); 0 = until the peer leaves (server) or forever (client).
    pub count: u32,
    /// Check that each ping came back unchanged (`-V`, client side).
    pub validate: bool,
    /// The bound on every wait.
    pub timeout: Duration,
}

/// `struct rping_rdma_info` on the wire (big-endian).
pub fn encode_info(addr: u64, rkey: u32, size: u32) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&addr.to_be_bytes());
    b[8..12].copy_from_slice(&rkey.to_be_bytes());
    b[12..].copy_from_slice(&size.to_be_bytes());
    b
}

/// Reads a `struct rping_rdma_info`: `(buf, rkey, size)`.
pub fn decode_info(b: &[u8; INFO_LEN]) -> (u64, u32, u32) {
    let addr = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
    let rkey = u32::from_be_bytes(b[8..12].try_into().unwrap_or_default());
    let size = u32::from_be_bytes(b[12..].try_into().unwrap_or_default());
    (addr, rkey, size)
}

/// The data rping's client sends in ping number `ping` with buffers of `size` bytes.
pub fn ping_data(ping: u32, size: usize) -> Vec<u8> {
    let mut buf = format!("rdma-ping-{ping}: ").into_bytes();
    buf.truncate(size.saturating_sub(1));
    let mut c = 65 + (ping % 58) as u8;
    while buf.len() < size {
        buf.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
    buf
}

/// The text of a ping buffer, up to its first NUL.
pub fn text(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn check_size(size: usize) -> Result<(), BoxError> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        return Err(format!("invalid size {size} (valid range is {MIN_SIZE} to {MAX_SIZE})").into());
    }
    Ok(())
}

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 16, max_recv_wr: 2, ..QpCaps::default() }
}

/// The client: connects to `dst` (from `src` if given) and pings; `on_ping(n, data)` sees each
/// echo. Returns the number of pings done.
///
/// # Errors
/// Connection errors, failed completions, timeouts, and with `validate` a ping that came back
/// changed.
pub fn client(
    dst: SocketAddr,
    src: Option<SocketAddr>,
    o: &Options,
    mut on_ping: impl FnMut(u32, &[u8]),
) -> Result<u32, BoxError> {
    check_size(o.size)?;
    let id = CmId::new()?.resolve(src, dst).wait(o.timeout)?;
    let ctx = id.open_context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32, None)?;
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps()))?;
    // The server READs the source buffer and WRITEs the sink.
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let qp = id.init_qp(qp, remote)?;
    let recv = pd.alloc_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
    let send = pd.alloc_mr(INFO_LEN, AccessFlags::empty())?;
    let source = pd.alloc_mr(o.size, AccessFlags::LOCAL_WRITE | remote)?;
    let sink = pd.alloc_mr(o.size, AccessFlags::LOCAL_WRITE | remote)?;
    let params = ConnParams::new().responder_resources(1).initiator_depth(1);
    let conn = id.connect(qp, &params).wait(o.timeout)?;
    let size = o.size as u32;
    let done = conn.qp().scope(o.timeout, |s| -> Result<u32, BoxError> {
        let (rsge, ssge) = ([recv.sge(..)?], [send.sge(..)?]);
        let mut ping = 0;
        while o.count == 0 || ping < o.count {
            let data = ping_data(ping, o.size);
            source.write_at(0, &data)?;
            for (step, region) in [&source, &sink].into_iter().enumerate() {
                send.write_at(0, &encode_info(region.addr(), region.rkey(), size))?;
                s.post_recv(&mut [RecvRequest::new(RECV, &rsge)])?;
                s.post_send(&mut [SendRequest::send(SEND, &ssge)])?;
                let Some(got) = await_ids(s, &conn, &[RECV, SEND], o.timeout)? else {
                    return Err(format!("the server left during ping {ping}, step {step}").into());
                };
                if let Some((_, len)) = got.iter().find(|(id, _)| *id == RECV).filter(|(_, len)| *len != 16) {
                    return Err(format!("received bogus data, size {len}").into());
                }
            }
            let mut back = vec![0u8; o.size];
            sink.read_at(0, &mut back)?;
            if o.validate && back != data {
                return Err(format!("data mismatch in ping {ping}").into());
            }
            on_ping(ping, &back);
            ping += 1;
        }
        Ok(ping)
    })?;
    conn.disconnect().wait(o.timeout)?;
    Ok(done)
}

/// The server: accepts one connection on `listener` and answers its pings until the client
/// leaves; `on_ping(n, data)` sees the data READ from the client each time. Returns the number
/// of pings answered.
///
/// # Errors
/// Connection errors, failed completions, timeouts, and a client buffer larger than `o.size`.
pub fn serve(listener: &Listener, o: &Options, mut on_ping: impl FnMut(u32, &[u8])) -> Result<u32, BoxError> {
    check_size(o.size)?;
    let req = listener.recv_request(o.timeout)?;
    let ctx = req.open_context()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(32, None)?;
    let qp = req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps()))?, AccessFlags::empty())?;
    let recv = pd.alloc_mr(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
    let send = pd.alloc_mr(INFO_LEN, AccessFlags::empty())?;
    let buf = pd.alloc_mr(o.size, AccessFlags::LOCAL_WRITE)?;
    let params = ConnParams::new().responder_resources(1).initiator_depth(1);
    let conn = req.accept(qp, &params).wait(o.timeout)?;
    let peer_info = || -> Result<RemoteRegion, BoxError> {
        let mut info = [0u8; INFO_LEN];
        recv.read_at(0, &mut info)?;
        let (addr, rkey, len) = decode_info(&info);
        if len as usize > o.size {
            return Err(format!("the client's buffer ({len} bytes) is larger than ours ({})", o.size).into());
        }
        Ok(RemoteRegion { addr, rkey, len: len.into() })
    };
    let answered = conn.qp().scope(o.timeout, |s| -> Result<u32, BoxError> {
        let (rsge, ssge) = ([recv.sge(..)?], [send.sge(..)?]);
        s.post_recv(&mut [RecvRequest::new(RECV, &rsge)])?;
        let mut ping = 0;
        while o.count == 0 || ping < o.count {
            // The client's source buffer, or its disconnect; and after the first ping the last
            // "go ahead", whose completion may come before or after the client's answer to it.
            let ids: &[u64] = if ping == 0 { &[RECV] } else { &[RECV, SEND] };
            let Some(_) = await_ids(s, &conn, ids, o.timeout)? else { break };
            let source = peer_info()?;
            let len = source.len as usize;
            let dst = [buf.sge(..len)?];
            s.post_send(&mut [SendRequest::read(RDMA, &dst, source)])?;
            let Some(_) = await_ids(s, &conn, &[RDMA], o.timeout)? else { break };
            let mut data = vec![0u8; len];
            buf.read_at(0, &mut data)?;
            on_ping(ping, &data);
            // "Go ahead", with a receive ready for the sink's info.
            s.post_recv(&mut [RecvRequest::new(RECV, &rsge)])?;
            s.post_send(&mut [SendRequest::send(SEND, &ssge)])?;
            let Some(_) = await_ids(s, &conn, &[RECV, SEND], o.timeout)? else { break };
            let sink = peer_info()?;
            let echo = (data.iter().position(|&b| b == 0).map_or(len, |n| n + 1)).min(sink.len as usize);
            let src = [buf.sge(..echo)?];
            s.post_send(&mut [SendRequest::write(RDMA, &src, sink)])?;
            let Some(_) = await_ids(s, &conn, &[RDMA], o.timeout)? else { break };
            // "Go ahead" again, with a receive ready for the next ping; both are awaited at the
            // top of the loop.
            s.post_recv(&mut [RecvRequest::new(RECV, &rsge)])?;
            s.post_send(&mut [SendRequest::send(SEND, &ssge)])?;
            ping += 1;
        }
        // Done by count: the receive posted for a next ping will not complete; flush it.
        if s.outstanding() > 0 {
            conn.qp().flush()?;
            drain(s, o.timeout);
        }
        Ok(ping)
    })?;
    // The client disconnects after its last ping has been answered (this side disconnecting
    // first would cut it off before it has taken that answer). A client that answered every
    // ping may still never be seen to leave: rdma-core's rping client sends its DREQ once and
    // exits, so a DREQ lost on the wire is not sent again. Once every ping was answered that
    // is no failure of the service (the identifier is destroyed either way).
    if conn.peer_disconnected() {
        return Ok(answered);
    }
    let left = match conn.peer_disconnect().wait(o.timeout) {
        Err(rdma_cm::Error::Timeout { .. }) if o.count > 0 && answered == o.count => Ok(answered),
        Err(e) => Err(e.into()),
        Ok(_closed) => Ok(answered),
    };
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_data_is_rpings() {
        // rping -S 30, ping 0: "rdma-ping-0: " then letters from 'A', NUL at the end.
        let p = ping_data(0, 30);
        assert_eq!(&p[..13], b"rdma-ping-0: ");
        assert_eq!(&p[13..29], b"ABCDEFGHIJKLMNOP");
        assert_eq!(p[29], 0);
        // Each ping starts one letter further; after 'z' comes 'A'.
        assert_eq!(ping_data(1, 30)[13], b'B');
        assert_eq!(&ping_data(57, 30)[..16], b"rdma-ping-57: zA");
        assert_eq!(&ping_data(58, 30)[..16], b"rdma-ping-58: AB");
    }

    #[test]
    fn info_is_big_endian() {
        let b = encode_info(0x0102_0304_0506_0708, 0x0a0b_0c0d, 64);
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 0, 0, 0, 64]);
        assert_eq!(decode_info(&b), (0x0102_0304_0506_0708, 0x0a0b_0c0d, 64));
    }
}
