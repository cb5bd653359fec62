//! Shared by the perftest-style examples: perftest's flags, the out-of-band exchange over TCP
//! (as perftest does), and bringing an RC queue pair up to ReadyToSend.
#![allow(dead_code)]

pub mod clock;
pub mod lat;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use rdma_verbs::*;

/// perftest's flags that matter here.
#[derive(Debug, Clone)]
pub struct Args {
    /// `-d`: the device (default: the first one).
    pub device: Option<String>,
    /// `-i`: the port (default 1).
    pub ib_port: u8,
    /// `-x`: the GID index (default 1, the RoCE v2 IPv4 GID on Soft-RoCE).
    pub gid_index: u8,
    /// `-s`: message size in bytes.
    pub size: usize,
    /// `-n`: iterations.
    pub iters: usize,
    /// `-p`: TCP port of the out-of-band exchange (default 18515, perftest's).
    pub tcp_port: u16,
    /// `-t`: send queue depth (default 128).
    pub tx_depth: usize,
    /// `-Q`: every how many requests one is signaled (perftest's default 100, at most `-t`),
    /// where the tool signals in batches.
    pub cq_mod: usize,
    /// Whether `-Q` was given (perftest signals every request above 8 KiB unless it was).
    pub cq_mod_given: bool,
    /// `-r`: receives kept posted, for the tools that receive (perftest's default 512, at most
    /// `-n`).
    pub rx_depth: usize,
    /// `-l`: requests per doorbell (perftest's `--post_list`, default 1), where the tool takes it.
    pub post_list: usize,
    /// `-o`: outstanding RDMA READs (0, the default: the device's `max_qp_rd_atom`, as
    /// perftest).
    pub out_reads: u32,
    /// `--api A[,B...]`: the posting paths to measure, among the names the tool accepts (the
    /// first by default; empty when the tool has only one path). Not perftest's.
    pub apis: Vec<&'static str>,
    /// `--repeat N`: measurements in this one run, cycling through `apis` (default 1; only
    /// with `--api`). Not perftest's.
    pub repeat: usize,
    /// The server's address: present on the client, absent on the server.
    pub server: Option<Ipv4Addr>,
}

/// Parses perftest's flags; `apis` lists the values `--api` takes (the first is the default),
/// empty for a tool without the flag.
pub fn parse_args(name: &str, default_size: usize, default_iters: usize, apis: &[&'static str]) -> Args {
    let mut a = Args {
        device: None,
        ib_port: 1,
        gid_index: 1,
        size: default_size,
        iters: default_iters,
        tcp_port: 18515,
        tx_depth: 128,
        cq_mod: 100,
        cq_mod_given: false,
        rx_depth: 512,
        out_reads: 0,
        post_list: 1,
        apis: apis.first().copied().into_iter().collect(),
        repeat: 1,
        server: None,
    };
    let mut it = std::env::args().skip(1);
    let usage = || -> ! {
        let api = match apis {
            [] => String::new(),
            _ => format!(" [--api {}[,...]] [--repeat N]", apis.join("|")),
        };
        eprintln!("usage: {name} [-d DEV] [-i PORT] [-x GID_INDEX] [-s SIZE] [-n ITERS] [-p TCP_PORT] [-t TX_DEPTH] [-Q CQ_MOD] [-r RX_DEPTH] [-o OUT_READS] [-l POST_LIST] [-F]{api} [SERVER_ADDR]");
        std::process::exit(2)
    };
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "-d" | "--ib-dev" => a.device = Some(val()),
            "-i" | "--ib-port" => a.ib_port = val().parse().unwrap_or_else(|_| usage()),
            "-x" | "--gid-index" => a.gid_index = val().parse().unwrap_or_else(|_| usage()),
            "-s" | "--size" => a.size = val().parse().unwrap_or_else(|_| usage()),
            "-n" | "--iters" => a.iters = val().parse().unwrap_or_else(|_| usage()),
            "-p" | "--port" => a.tcp_port = val().parse().unwrap_or_else(|_| usage()),
            "-t" | "--tx-depth" => a.tx_depth = val().parse().unwrap_or_else(|_| usage()),
            "-Q" | "--cq-mod" => {
                a.cq_mod = val().parse().unwrap_or_else(|_| usage());
                a.cq_mod_given = true;
            }
            "-r" | "--rx-depth" => a.rx_depth = val().parse().unwrap_or_else(|_| usage()),
            "-o" | "--outs" => a.out_reads = val().parse().unwrap_or_else(|_| usage()),
            "-l" | "--post_list" => a.post_list = val().parse().unwrap_or_else(|_| usage()),
            "--api" if !apis.is_empty() => {
                let v = val();
                let known = |x: &str| apis.iter().copied().find(|&k| k == x).unwrap_or_else(|| usage());
                a.apis = v.split(',').map(known).collect();
            }
            "--repeat" if !apis.is_empty() => a.repeat = val().parse().unwrap_or_else(|_| usage()),
            // `--ex`: the extended-QP path, where the tool has one (write_bw): `--api ex`.
            "--ex" if apis.contains(&"ex") => a.apis = vec!["ex"],
            "-F" | "--CPU-freq" => {} // perftest's frequency warning switch: nothing to silence here
            "-h" | "--help" => usage(),
            s if !s.starts_with('-') && a.server.is_none() => a.server = Some(s.parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    if a.size == 0
        || a.iters == 0
        || a.tx_depth == 0
        || a.cq_mod == 0
        || a.repeat == 0
        || a.rx_depth == 0
        || a.post_list == 0
    {
        usage();
    }
    // As perftest: no deeper than the run is long, no rarer signal than the queue is deep.
    a.tx_depth = a.tx_depth.min(a.iters);
    a.rx_depth = a.rx_depth.min(a.iters);
    a.post_list = a.post_list.min(a.tx_depth);
    a.cq_mod = a.cq_mod.min(a.tx_depth);
    a
}

/// What each side sends the other: its QP endpoint and the region the peer may write.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub endpoint: QpEndpoint,
    pub region: RemoteRegion,
}

impl Peer {
    const LEN: usize = 4 + 4 + 16 + 2 + 4 + 8 + 8;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.endpoint.qp_num.to_be_bytes());
        b[4..8].copy_from_slice(&self.endpoint.psn.to_be_bytes());
        b[8..24].copy_from_slice(&self.endpoint.gid.0);
        b[24..26].copy_from_slice(&self.endpoint.lid.to_be_bytes());
        b[26..30].copy_from_slice(&self.region.rkey.to_be_bytes());
        b[30..38].copy_from_slice(&self.region.addr.to_be_bytes());
        b[38..46].copy_from_slice(&self.region.len.to_be_bytes());
        b
    }

    fn decode(b: &[u8; Self::LEN]) -> Self {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        Peer {
            endpoint: QpEndpoint {
                qp_num: u32_at(0),
                psn: u32_at(4),
                gid: Gid(b[8..24].try_into().unwrap()),
                lid: u16::from_be_bytes([b[24], b[25]]),
            },
            region: RemoteRegion { rkey: u32_at(26), addr: u64_at(30), len: u64_at(38) },
        }
    }
}

/// The out-of-band channel: a TCP connection, server side listening, client side connecting.
pub struct Oob(TcpStream);

impl Oob {
    pub fn open(args: &Args) -> std::io::Result<Self> {
        let stream = match args.server {
            Some(addr) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                loop {
                    match TcpStream::connect((addr, args.tcp_port)) {
                        Ok(s) => break s,
                        Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            }
            None => TcpListener::bind((Ipv4Addr::UNSPECIFIED, args.tcp_port))?.accept()?.0,
        };
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Oob(stream))
    }

    /// Sends ours, receives theirs.
    pub fn exchange(&mut self, mine: &Peer) -> std::io::Result<Peer> {
        self.0.write_all(&mine.encode())?;
        let mut b = [0u8; Peer::LEN];
        self.0.read_exact(&mut b)?;
        Ok(Peer::decode(&b))
    }

    /// Sends our number, receives theirs.
    pub fn exchange_u64(&mut self, mine: u64) -> std::io::Result<u64> {
        self.0.write_all(&mine.to_be_bytes())?;
        let mut b = [0u8; 8];
        self.0.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    /// Checks that both sides run the same test: `plan` (say, the size, iterations and paths)
    /// must be the peer's too, else both fail with a message naming both.
    pub fn agree(&mut self, plan: &str) -> std::io::Result<()> {
        let len = self.exchange_u64(plan.len() as u64)?;
        self.0.write_all(plan.as_bytes())?;
        let mut theirs = vec![0u8; len.min(4096) as usize];
        self.0.read_exact(&mut theirs)?;
        if theirs != plan.as_bytes() {
            let msg = format!(
                "the peer runs \"{}\", this side \"{plan}\": give both sides the same flags",
                String::from_utf8_lossy(&theirs)
            );
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, msg));
        }
        Ok(())
    }

    /// A one-byte barrier: both sides wait for each other.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.0.write_all(&[1])?;
        let mut b = [0u8; 1];
        self.0.read_exact(&mut b)
    }
}

pub fn open_context(args: &Args) -> Result<Context> {
    match &args.device {
        Some(d) => Context::open(d),
        None => Context::open_first(),
    }
}

/// Moves `qp` to ReadyToSend towards `peer`, with the path MTU of the local port.
pub fn connect<'r>(
    qp: QueuePair<'r, Rc, Init>,
    args: &Args,
    my_psn: u32,
    peer: &Peer,
) -> Result<QueuePair<'r, Rc, ReadyToSend>> {
    qp.handshake(peer.endpoint, args.gid_index, my_psn)
}

/// As [`connect`], with RDMA READ limits as perftest sets them from `-o`: `max_dest_rd_atomic`
/// (READs this side serves at once) is ours, `max_rd_atomic` (READs it issues at once) the
/// peer's.
pub fn connect_reads<'r>(
    qp: QueuePair<'r, Rc, Init>,
    args: &Args,
    my_psn: u32,
    peer: &Peer,
    (mine, theirs): (u8, u8),
) -> Result<QueuePair<'r, Rc, ReadyToSend>> {
    let tune = |rtr: RtrAttr, rts: RtsAttr| (rtr.max_dest_rd_atomic(mine), rts.max_rd_atomic(theirs));
    qp.handshake_with(peer.endpoint, args.gid_index, my_psn, tune)
}

pub fn fail(name: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("{name}: {e}");
    std::process::exit(1)
}

/// Submits the requests pushed to `sq`, the last of them signaled, and spins until its
/// completion comes back (at most `wait`), putting the slot it carried back into `slot`.
///
/// One round of the latency tools' owned-buffer path: one slot goes out and comes back.
pub fn submit_and_wait_one<'r>(
    sq: &mut SendQueue<'r, Rc>,
    slot: &mut Option<Slot<'r>>,
    wait: Duration,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    sq.submit()?;
    let mut failed = None;
    let mut timeout = clock::SpinTimeout::new(wait);
    while sq.poll(|c| {
        if let Err(e) = c.ok() {
            failed = Some(e);
        }
        *slot = c.slot;
    })? == 0
    {
        if timeout.expired() {
            return Err(format!("no send completion within {wait:?}").into());
        }
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
