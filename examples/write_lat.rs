//! RDMA WRITE latency, like perftest's `ib_write_lat`: same flags, same columns.
//!
//! ```text
//! write_lat -d rxe0 -x 1 -s 8 -n 1000                 # server
//! write_lat -d rxe1 -x 1 -s 8 -n 1000 10.77.0.1       # client: prints the result
//! ```
//! Ping-pong: each side RDMA-writes `-s` bytes into the other's buffer, whose last byte carries
//! the iteration number, and watches its own buffer (by copy, `read_at`) for the peer's write.
//! Latency is half the round trip.

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

const NAME: &str = "write_lat";
/// Every how many writes one is signaled (the rest complete with it), as perftest does.
const SIGNAL_EVERY: usize = 32;

fn main() {
    let args = parse_args(NAME, 8, 1000, &[]);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None)?;
    let caps = QpCaps { max_send_wr: 2 * SIGNAL_EVERY as u32, max_recv_wr: 1, ..QpCaps::default() };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = qp.init(InitAttr::new(args.ib_port).access(access))?;
    // Two halves: [0, size) is what we send, [size, 2 size) is where the peer writes to us.
    let mr = pd.alloc_mr(2 * args.size, access)?;
    let psn = std::process::id() & 0xff_ffff;
    let inbox = mr.remote().slice(args.size as u64, args.size as u64).ok_or("size")?;
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region: inbox };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    let qp = connect(&ctx, qp, args, psn, &peer)?;
    oob.sync()?;

    let client = args.server.is_some();
    let src = [mr.sge(0..args.size)?];
    let mut wcs: [WorkCompletion; 8] = Default::default();
    let mut rtts = Vec::with_capacity(args.iters);
    let last = 2 * args.size - 1;
    let wait_for = |marker: u8| -> Result<(), Box<dyn std::error::Error>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut b = [0u8];
        // Reading the clock costs more than a poll (much more under emulation): look rarely.
        for spin in 0u64.. {
            mr.read_at(last, &mut b)?;
            if b[0] == marker {
                return Ok(());
            }
            if spin % 4096 == 4095 && Instant::now() > deadline {
                break;
            }
        }
        Err("the peer's write did not arrive within 10 s".into())
    };
    for i in 0..args.iters {
        let marker = (i % 255) as u8 + 1;
        let t0 = Instant::now();
        if !client {
            wait_for(marker)?;
        }
        mr.write_at(args.size - 1, &[marker])?;
        let signaled = i % SIGNAL_EVERY == SIGNAL_EVERY - 1 || i + 1 == args.iters;
        let wr = SendRequest::write(i as u64, &src, peer.region);
        let mut wr = [if signaled { wr } else { wr.unsignaled() }];
        // SAFETY: no slice of `mr` is ever taken (only read_at/write_at copies), and every
        // request completes before `mr` is dropped (the last one is signaled and awaited).
        unsafe { qp.post_send(&mut wr)? };
        if signaled {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Some(wc) = qp.send_cq().poll(&mut wcs)?.first() {
                    wc.ok()?;
                    break;
                }
                if Instant::now() > deadline {
                    return Err("no completion within 10 s".into());
                }
            }
        }
        if client {
            wait_for(marker)?;
            rtts.push(t0.elapsed());
        }
    }
    oob.sync()?;
    if !client {
        println!("{NAME}: server done ({} round trips)", args.iters);
        return Ok(());
    }
    let mut us: Vec<f64> = rtts.iter().map(|d| d.as_secs_f64() * 1e6 / 2.0).collect();
    us.sort_by(|a, b| a.total_cmp(b));
    let n = us.len() as f64;
    let avg = us.iter().sum::<f64>() / n;
    let stdev = (us.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / n).sqrt();
    let pct = |p: f64| us[((n * p).ceil() as usize).clamp(1, us.len()) - 1];
    println!(" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ");
    println!(
        " {:<6} {:<10}       {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}",
        args.size, args.iters, us[0], us[us.len() - 1], pct(0.5), avg, stdev, pct(0.99), pct(0.999)
    );
    Ok(())
}
