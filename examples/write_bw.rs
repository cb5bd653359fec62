//! RDMA WRITE bandwidth, like perftest's `ib_write_bw`: same flags, same columns.
//!
//! ```text
//! write_bw -d rxe0 -x 1 -s 65536 -n 1000                # server
//! write_bw -d rxe1 -x 1 -s 65536 -n 1000 10.77.0.1      # client: prints the result
//! ```
//! The client keeps `-t` writes in flight through the safe posting scope (every write signaled),
//! posting each batch with one doorbell.

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

const NAME: &str = "write_bw";
/// perftest's "MB": 2^20 bytes (its help says "MiB=2^20 byte"; `format_factor` 0x100000).
const MB: f64 = (1 << 20) as f64;

fn main() {
    let args = parse_args(NAME, 65536, 1000);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(args.tx_depth as u32 * 2, None)?;
    let caps = QpCaps { max_send_wr: args.tx_depth as u32, max_recv_wr: 1, ..QpCaps::default() };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = qp.init(InitAttr::new(args.ib_port).access(access))?;
    let mr = pd.alloc_mr(args.size, access)?;
    let psn = std::process::id() & 0xff_ffff;
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region: mr.remote() };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    let qp = connect(&ctx, qp, args, psn, &peer)?;
    oob.sync()?;
    if args.server.is_none() {
        // The server's memory is written by the client; it waits for the end of the test.
        oob.sync()?;
        println!("{NAME}: server done ({} writes of {} bytes received)", args.iters, args.size);
        return Ok(());
    }

    let src = [mr.sge(..)?];
    let mut wcs: [WorkCompletion; 32] = Default::default();
    let mut stamps: Vec<Instant> = Vec::with_capacity(args.iters);
    let start = Instant::now();
    qp.scope(Duration::from_secs(10), |s| -> Result<()> {
        let mut batch: Vec<SendRequest<'_, '_>> = Vec::with_capacity(args.tx_depth);
        let (mut posted, mut done) = (0usize, 0usize);
        while done < args.iters {
            let room = (args.tx_depth - s.outstanding()).min(args.iters - posted);
            if room > 0 {
                batch.clear();
                batch.extend((0..room).map(|i| SendRequest::write((posted + i) as u64, &src, peer.region)));
                s.post_send(&mut batch)?;
                posted += room;
            }
            let n = s.poll(&mut wcs)?.len();
            for wc in &wcs[..n] {
                wc.ok()?;
                stamps.push(Instant::now());
            }
            done += n;
        }
        Ok(())
    })?;
    let total = start.elapsed();
    oob.sync()?;
    let bytes = args.size as f64;
    let avg = bytes * args.iters as f64 / total.as_secs_f64() / MB;
    // Peak: the best of ten consecutive segments of the run. rxe completes writes in bursts, so
    // shorter or sliding windows would report bursts, not bandwidth.
    let seg = (args.iters / 10).max(1);
    let mut peak: f64 = 0.0;
    let mut from = start;
    for chunk in stamps.chunks(seg) {
        let to = *chunk.last().unwrap_or(&from);
        let dt = (to - from).as_secs_f64();
        if chunk.len() == seg && dt > 0.0 {
            peak = peak.max(bytes * seg as f64 / dt / MB);
        }
        from = to;
    }
    let peak = peak.max(avg);
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    println!(" {:<10} {:<14} {:<18.2} {:<20.2} {:.6}", args.size, args.iters, peak, avg, avg * MB / bytes / 1e6);
    Ok(())
}
