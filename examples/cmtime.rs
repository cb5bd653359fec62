//! `cmtime`, in Rust: times each step of connection setup and teardown through rdma-cm, like
//! rdma-core's `cmtime`.
//!
//! ```text
//! cmtime [-s server_addr] [-b bind_addr] [-c connections] [-t secs]
//! ```
//! One process runs both sides: a listener on `-s` (default 10.77.0.1) served by a thread, and
//! `-c` connections (default 100), one after another, from `-b` (default 10.77.0.2). Each
//! client step is timed, as is the server's accept, and reported as total, average, min and max.
//! The verbs context, PD and CQ of each side are opened once; every connection gets its own
//! identifier and QP.
//!
//! In the Soft-RoCE VM: `scripts/softroce run -- target/release/examples/cmtime -c 200`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rdma_cm::{CmId, ConnParams, Listener};
use rdma_verbs::{AccessFlags, Context, QpCreateAttr, Rc};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const STEPS: [&str; 7] =
    ["create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"];

/// Durations of one step over all connections.
#[derive(Default, Clone)]
struct Stat(Vec<Duration>);

impl Stat {
    fn line(&self, name: &str) -> String {
        let total: Duration = self.0.iter().sum();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (min, max) =
            (self.0.iter().min().copied().unwrap_or_default(), self.0.iter().max().copied().unwrap_or_default());
        let avg = total / self.0.len().max(1) as u32;
        format!("{name:<14} {:>12.0} {:>10.1} {:>10.1} {:>10.1}", us(total), us(avg), us(min), us(max))
    }
}

fn usage() -> ! {
    eprintln!("usage: cmtime [-s server_addr] [-b bind_addr] [-c connections] [-t secs]");
    std::process::exit(2)
}

fn server(listener: &Listener, n: u32, timeout: Duration) -> Result<Stat, BoxError> {
    let mut accept = Stat::default();
    let mut ctx: Option<Context> = None;
    for _ in 0..n {
        let req = listener.recv_request(timeout)?;
        if ctx.is_none() {
            ctx = Some(req.open_context()?);
        }
        let ctx = ctx.as_ref().ok_or("no context")?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4, None)?;
        let start = Instant::now();
        let qp = req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?, AccessFlags::empty())?;
        let conn = req.accept(qp, &ConnParams::new()).wait(timeout)?;
        accept.0.push(start.elapsed());
        conn.peer_disconnect().wait(timeout)?;
    }
    Ok(accept)
}

fn client(dst: SocketAddr, src: SocketAddr, n: u32, timeout: Duration) -> Result<Vec<Stat>, BoxError> {
    let mut stats = vec![Stat::default(); STEPS.len()];
    let probe = CmId::new()?.resolve_addr(Some(src), dst).wait(timeout)?;
    let ctx = probe.open_context()?;
    drop(probe);
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4 * n.max(1), None)?;
    for _ in 0..n {
        let mut t = Instant::now();
        let mut lap = |stats: &mut Vec<Stat>, step: usize| {
            stats[step].0.push(t.elapsed());
            t = Instant::now();
        };
        let id = CmId::new()?;
        lap(&mut stats, 0);
        let id = id.resolve_addr(Some(src), dst).wait(timeout)?;
        lap(&mut stats, 1);
        let id = id.resolve_route().wait(timeout)?;
        lap(&mut stats, 2);
        let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?, AccessFlags::empty())?;
        lap(&mut stats, 3);
        let conn = id.connect(qp, &ConnParams::new()).wait(timeout)?;
        lap(&mut stats, 4);
        let gone = conn.disconnect().wait(timeout)?;
        lap(&mut stats, 5);
        drop(gone);
        lap(&mut stats, 6);
    }
    Ok(stats)
}

fn main() {
    let (mut server_ip, mut bind_ip): (IpAddr, IpAddr) = ([10, 77, 0, 1].into(), [10, 77, 0, 2].into());
    let (mut n, mut timeout) = (100u32, Duration::from_secs(10));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "-s" => server_ip = val().parse().unwrap_or_else(|_| usage()),
            "-b" => bind_ip = val().parse().unwrap_or_else(|_| usage()),
            "-c" => n = val().parse().unwrap_or_else(|_| usage()),
            "-t" => timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    let run = || -> Result<(Vec<Stat>, Stat, Duration), BoxError> {
        let listener = Listener::bind(SocketAddr::new(server_ip, 0), 64)?;
        let dst = listener.local_addr();
        let start = Instant::now();
        std::thread::scope(|s| {
            let srv = s.spawn(|| server(&listener, n, timeout));
            let cli = client(dst, SocketAddr::new(bind_ip, 0), n, timeout);
            let srv = srv.join().map_err(|_| "the server thread panicked")?;
            Ok((cli?, srv?, start.elapsed()))
        })
    };
    match run() {
        Ok((steps, accept, total)) => {
            println!("cmtime: {n} connections {bind_ip} -> {server_ip}, one at a time, in {total:.2?}");
            println!("{:<14} {:>12} {:>10} {:>10} {:>10}", "step", "total us", "avg us", "min us", "max us");
            for (name, stat) in STEPS.iter().zip(&steps) {
                println!("{}", stat.line(name));
            }
            println!("{}", accept.line("accept (srv)"));
        }
        Err(e) => {
            eprintln!("cmtime: {e}");
            std::process::exit(1);
        }
    }
}
