//! A UD echo server and its client: the server answers every datagram to its sender, addressed
//! from the datagram's own completion and GRH (`ibv_create_ah_from_wc`), with no connection and
//! no CM round trip per sender.
//!
//! ```text
//! cargo run --example ud_echo -- server DEVICE [COUNT]               # answers COUNT datagrams, or for ever
//! cargo run --example ud_echo -- client DEVICE SERVER_IP SERVER_QPN MESSAGE
//! ```
//!
//! The server prints `listening on IP qpn N` (stderr), then a line per answer. The client sends
//! MESSAGE from DEVICE's first IPv4 GID to the server's QP, waits for the reply and prints it
//! (stdout); it exits 1 unless the reply is `echo: MESSAGE`. Both use port 1 and the Q_Key
//! [`QKEY`].
//!
//! The server receives through a [`RecvRing`] (which owns the receive CQ) and answers through a
//! [`QueuePair::send_scope`] (which owns the send CQ alone) on the same QP: the two need the
//! QP's send and receive CQs to be different.

use std::net::Ipv4Addr;
use std::time::Duration;

use rdma_verbs::*;

/// The Q_Key both sides use: a UD QP takes only datagrams sent with its own.
const QKEY: u32 = 0x0ec4_0ec4;
/// The port of the device.
const PORT: u8 = 1;
/// The largest message, after the GRH that starts every UD receive.
const MAX_MESSAGE: usize = 1024;
/// What every wait of the example is bounded by.
const T: Duration = Duration::from_secs(5);
/// What the reply starts with.
const PREFIX: &[u8] = b"echo: ";

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = match args[..] {
        ["server", device] => server(device, None),
        ["server", device, count] => match count.parse() {
            Ok(count) => server(device, Some(count)),
            Err(_) => Err(format!("COUNT {count:?} is not a number").into()),
        },
        ["client", device, ip, qpn, message] => client(device, ip, qpn, message),
        _ => {
            eprintln!("usage: ud_echo server DEVICE [COUNT] | ud_echo client DEVICE SERVER_IP SERVER_QPN MESSAGE");
            std::process::exit(2);
        }
    };
    if let Err(e) = run {
        eprintln!("ud_echo: {e}");
        std::process::exit(1);
    }
}

/// The device's first RoCE v2 GID of an IPv4 address, on `PORT`: its index and address.
fn ipv4_gid(ctx: &Context) -> Res<(u8, Ipv4Addr)> {
    ctx.gid_table()?
        .iter()
        .filter(|g| g.port == PORT)
        .find_map(|g| g.gid.to_ipv4_mapped().map(|ip| (g.index, ip)))
        .ok_or_else(|| format!("{} has no IPv4 GID on port {PORT}", ctx.name()).into())
}

/// A UD QP on `pd`, ready to send, its send and receive queues on the CQs given.
fn ud_qp<'a>(
    pd: &'a ProtectionDomain<'a>,
    send_cq: &'a CompletionQueue<'a>,
    recv_cq: &'a CompletionQueue<'a>,
) -> Res<QueuePair<'a, Ud, ReadyToSend>> {
    let qp = pd.create_qp::<Ud>(QpCreateAttr::new(send_cq, recv_cq))?.init(InitAttr::new(PORT).qkey(QKEY))?;
    Ok(qp.ready_to_receive()?.ready_to_send(0)?)
}

fn server(device: &str, count: Option<u64>) -> Res<()> {
    let ctx = Context::open(device)?;
    let (_, ip) = ipv4_gid(&ctx)?;
    let pd = ctx.alloc_pd()?;
    let send_cq = ctx.create_cq_with_channel(16)?;
    let recv_cq = ctx.create_cq_with_channel(64)?;
    let qp = ud_qp(&pd, &send_cq, &recv_cq)?;
    let pool = SlotPool::new(&pd, GRH_LEN + MAX_MESSAGE, 32, AccessFlags::LOCAL_WRITE)?;
    let mut ring = RecvRing::new(&qp, pool, 32, T)?;
    let reply = pd.alloc_mr(PREFIX.len() + MAX_MESSAGE, AccessFlags::LOCAL_WRITE)?;
    reply.write_at(0, PREFIX)?;
    eprintln!("listening on {ip} qpn {}", qp.qp_num());
    let mut answered = 0u64;
    while count.map_or(true, |count| answered < count) {
        let msg = ring.recv(Duration::MAX)?;
        if let Err(e) = msg.ok() {
            eprintln!("a receive failed: {e}");
            ring.release(msg)?;
            continue;
        }
        // One datagram's failure (a GRH the address cannot be made from, a reply the port
        // refuses) is that sender's: it is said, and the server serves on.
        let answer = || -> Res<(usize, String, u32)> {
            // The sender's address, from the datagram itself: its completion, and the GRH that
            // starts the slot.
            let back = pd.create_ah_from_wc(PORT, msg.completion(), msg.bytes())?;
            let from = AddressVector::from_wc(&ctx, PORT, msg.completion(), msg.bytes())?;
            // At most what a client may send: a longer datagram's reply would pass the MTU.
            let message = msg.bytes().get(GRH_LEN..).unwrap_or_default();
            let message = &message[..message.len().min(MAX_MESSAGE - PREFIX.len())];
            reply.write_at(PREFIX.len(), message)?;
            let len = PREFIX.len() + message.len();
            let sender = msg.src_qp();
            // The ring's receives stay posted: the scope owns the send CQ alone.
            qp.send_scope(T, |s| -> Result<()> {
                let sge = [reply.sge(..len)?];
                s.post_send(&mut [SendRequest::send(answered, &sge).to(&back, sender, QKEY)])?;
                let mut wcs: [WorkCompletion; 1] = Default::default();
                s.wait(1, &mut wcs, T)?[0].ok()?;
                Ok(())
            })?;
            let to = from.dgid.to_ipv4_mapped().map_or(from.dgid.to_string(), |ip| ip.to_string());
            Ok((message.len(), to, sender))
        };
        match answer() {
            Ok((size, to, sender)) => {
                answered += 1;
                eprintln!("answered {size} bytes to {to} qpn {sender}");
            }
            Err(e) => eprintln!("a datagram from qpn {} got no answer: {e}", msg.src_qp()),
        }
        ring.release(msg)?;
    }
    Ok(())
}

fn client(device: &str, server_ip: &str, server_qpn: &str, message: &str) -> Res<()> {
    let server_ip: Ipv4Addr =
        server_ip.parse().map_err(|_| format!("SERVER_IP {server_ip:?} is not an IPv4 address"))?;
    let server_qpn: u32 = server_qpn.parse().map_err(|_| format!("SERVER_QPN {server_qpn:?} is not a number"))?;
    if message.len() > MAX_MESSAGE - PREFIX.len() {
        return Err(format!("MESSAGE has {} bytes; at most {}", message.len(), MAX_MESSAGE - PREFIX.len()).into());
    }
    let ctx = Context::open(device)?;
    let (gid_index, _) = ipv4_gid(&ctx)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq_with_channel(16)?;
    let qp = ud_qp(&pd, &cq, &cq)?;
    let to_server = pd.create_ah(&AddressVector::roce(PORT, server_ip.into(), gid_index))?;
    let mr = pd.alloc_mr(2 * (GRH_LEN + MAX_MESSAGE), AccessFlags::LOCAL_WRITE)?;
    let inbox = GRH_LEN + MAX_MESSAGE;
    mr.write_at(inbox, message.as_bytes())?;
    let got = qp.scope(T, |s| -> Result<u32> {
        let buf = [mr.sge(..inbox)?];
        s.post_recv(&mut [RecvRequest::new(1, &buf)])?;
        let out = [mr.sge(inbox..inbox + message.len())?];
        s.post_send(&mut [SendRequest::send(2, &out).to(&to_server, server_qpn, QKEY)])?;
        let mut wcs: [WorkCompletion; 2] = Default::default();
        let mut reply = None;
        for wc in s.wait(2, &mut wcs, T)?.iter() {
            wc.ok()?;
            if wc.wr_id() == 1 {
                reply = Some(wc.byte_len());
            }
        }
        Ok(reply.unwrap_or(0))
    })?;
    let mut reply = vec![0; (got as usize).saturating_sub(GRH_LEN)];
    mr.read_at(GRH_LEN, &mut reply)?;
    println!("{}", String::from_utf8_lossy(&reply));
    let want = [PREFIX, message.as_bytes()].concat();
    if reply != want {
        return Err(format!(
            "the reply {:?} is not {:?}",
            String::from_utf8_lossy(&reply),
            String::from_utf8_lossy(&want)
        )
        .into());
    }
    Ok(())
}
