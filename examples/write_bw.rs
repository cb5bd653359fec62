//! RDMA WRITE bandwidth, like perftest's `ib_write_bw`: same flags, same columns.
//!
//! ```text
//! write_bw -d rxe0 -x 1 -s 65536 -n 1000                # server
//! write_bw -d rxe1 -x 1 -s 65536 -n 1000 10.77.0.1      # client: prints the result
//! ```
//! The client keeps `-t` writes in flight, posting each refill with one doorbell, through one
//! of four paths (`--api`, the client's choice; the server is the same for all):
//! - `scope` (default): the safe posting scope, every write signaled, all from one buffer;
//! - `ex` (also `--ex`): the same scope on an extended QP (`ibv_create_qp_ex`), each refill one
//!   batch of `ibv_wr_rdma_write` builders and one `ibv_wr_complete` instead of `ibv_post_send`;
//! - `raw`: `unsafe` `ibv_post_send` of chains from one buffer, as perftest posts: every `-Q`th
//!   write signaled (perftest's default 100, at most `-t`), and the last of each chain;
//! - `pool`: the safe owned-buffer path, a [`SlotPool`] of `-t` slots and a [`SendQueue`], with
//!   the same chains and signals as `raw`; each completion gives its slots back for the refill.
//!
//! None allocates per request. `--api raw,pool --repeat N` (not perftest's) measures N times in
//! one connection, through the paths in turn (A B B A A B ...), one result line each, tagged.

#[path = "common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

const NAME: &str = "write_bw";
const APIS: &[&str] = &["scope", "ex", "raw", "pool"];
/// How long dropping a queue with writes in flight waits for them (only after an error).
const DRAIN: Duration = Duration::from_secs(10);

fn main() {
    let args = parse_args(NAME, 65536, 1000, APIS);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn run(args: &Args) -> BoxResult<()> {
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(args.tx_depth as u32 * 2, None)?;
    let caps = QpCaps { max_send_wr: args.tx_depth as u32, max_recv_wr: 1, ..QpCaps::default() };
    let mut attr = QpCreateAttr::new(&cq, &cq).caps(caps);
    if args.apis.contains(&"ex") {
        attr = attr.send_ops(SendOps::RDMA_WRITE);
    }
    let qp = pd.create_qp::<Rc>(attr)?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = qp.init(InitAttr::new(args.ib_port).access(access))?;
    let mr = pd.alloc_mr(args.size, access)?;
    // The pool path writes from its own slots, registered before the test like the region.
    let pool = match args.server {
        Some(_) if args.apis.contains(&"pool") => {
            Some(SlotPool::new(&pd, args.size, (args.tx_depth as u32) as usize, AccessFlags::LOCAL_WRITE)?)
        }
        _ => None,
    };
    let psn = std::process::id() & 0xff_ffff;
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region: mr.remote() };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    let qp = connect(qp, args, psn, &peer)?;
    oob.sync()?;
    if args.server.is_none() {
        // The server's memory is written by the client; it waits for the end of the test.
        oob.sync()?;
        println!("{NAME}: server done ({} writes of {} bytes received)", args.iters, args.size);
        return Ok(());
    }

    // One timestamp per write, taken when its completion is seen.
    let mut stamps: Vec<Instant> = Vec::with_capacity(args.iters);
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    let n = args.apis.len();
    for m in 0..args.repeat {
        // Through the paths forwards, then backwards (A B B A A B ...): drift favours none.
        let (cycle, k) = (m / n, m % n);
        let api = args.apis[if cycle % 2 == 0 { k } else { n - 1 - k }];
        stamps.clear();
        let (start, total) = match (api, &pool) {
            ("raw", _) => raw_loop(args, &qp, &cq, &mr, peer.region, &mut stamps)?,
            ("pool", Some(pool)) => pool_loop(args, &qp, pool, peer.region, &mut stamps)?,
            (api, _) => scope_loop(args, &qp, &mr, peer.region, &mut stamps, api == "ex")?,
        };
        let tag = if n > 1 || args.repeat > 1 { api } else { "" };
        report(args, start, total, &stamps, tag);
    }
    oob.sync()?;
    Ok(())
}

/// When a measured loop started, and how long it took until the last completion.
type Timed = BoxResult<(Instant, Duration)>;

/// The posting scope: every write signaled, each refill one doorbell: `ibv_post_send`, or with
/// `batched` one batch of `ibv_wr_rdma_write` builders and `ibv_wr_complete` (extended QP).
fn scope_loop(
    args: &Args,
    qp: &QueuePair<'_, Rc, ReadyToSend>,
    mr: &MemoryRegion<'_>,
    remote: RemoteRegion,
    stamps: &mut Vec<Instant>,
    batched: bool,
) -> Timed {
    let src = [mr.sge(..)?];
    let mut wcs: [WorkCompletion; 32] = Default::default();
    let start = Instant::now();
    qp.scope(DRAIN, |s| -> Result<()> {
        let mut batch: Vec<SendRequest<'_, '_>> = Vec::with_capacity(args.tx_depth);
        let (mut posted, mut done) = (0usize, 0usize);
        while done < args.iters {
            let room = (args.tx_depth - s.outstanding()).min(args.iters - posted);
            if room > 0 {
                batch.clear();
                batch.extend((0..room).map(|i| SendRequest::write((posted + i) as u64, &src, remote)));
                if batched {
                    let mut wrs = s.batch()?;
                    for wr in &batch {
                        wrs.push(wr)?;
                    }
                    wrs.complete()?;
                } else {
                    s.post_send(&mut batch)?;
                }
                posted += room;
            }
            let n = s.poll(&mut wcs)?.len();
            if n > 0 {
                let now = Instant::now();
                for wc in &wcs[..n] {
                    wc.ok()?;
                    stamps.push(now);
                }
            }
            done += n;
        }
        Ok(())
    })?;
    Ok((start, start.elapsed()))
}

/// Whether the write numbered `i` (from 0) is signaled: every `cq_mod`th, as perftest does.
/// The last of each doorbell is signaled too (both other paths do it: a `SendQueue` always does).
fn every_cq_mod(args: &Args, i: usize) -> bool {
    (i + 1) % args.cq_mod == 0
}

/// `unsafe` posting: chains from one buffer, signaled every `-Q`th and at the end of each chain.
/// A completion's `wr_id` is the write's number: it completes every write up to it.
fn raw_loop(
    args: &Args,
    qp: &QueuePair<'_, Rc, ReadyToSend>,
    cq: &CompletionQueue<'_>,
    mr: &MemoryRegion<'_>,
    remote: RemoteRegion,
    stamps: &mut Vec<Instant>,
) -> Timed {
    let src = [mr.sge(..)?];
    let mut wcs: [WorkCompletion; 32] = Default::default();
    let mut chain: Vec<SendRequest<'_, '_>> = Vec::with_capacity(args.tx_depth);
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < args.iters {
        let room = (args.tx_depth - (posted - done)).min(args.iters - posted);
        if room > 0 {
            let end = posted + room;
            chain.clear();
            chain.extend((posted..end).map(|i| {
                let wr = SendRequest::write(i as u64, &src, remote);
                if every_cq_mod(args, i) || i + 1 == end {
                    wr
                } else {
                    wr.unsignaled()
                }
            }));
            // SAFETY: the writes only read `mr`, of which this program never takes a slice
            // (`as_mut_slice`), before or after; `mr` outlives the QP's use of it or, if this
            // returns early on an error, is deregistered first, which revokes the device's access.
            unsafe { qp.post_send(&mut chain)? };
            posted = end;
        }
        let n = cq.poll(&mut wcs)?.len();
        if n > 0 {
            let now = Instant::now();
            for wc in &wcs[..n] {
                wc.ok()?;
                let upto = wc.wr_id() as usize + 1;
                stamps.extend(std::iter::repeat(now).take(upto - done));
                done = upto;
            }
        }
    }
    Ok((start, start.elapsed()))
}

/// The owned-buffer path: `-t` slots, each write owning one until its completion gives it back;
/// the same chains and signals as `raw_loop`.
fn pool_loop<'r>(
    args: &Args,
    qp: &QueuePair<'r, Rc, ReadyToSend>,
    pool: &SlotPool<'r>,
    remote: RemoteRegion,
    stamps: &mut Vec<Instant>,
) -> Timed {
    let mut sq = SendQueue::new(qp, DRAIN)?;
    if sq.capacity() < args.tx_depth {
        return Err(format!("the send queue takes {} requests, -t is {}", sq.capacity(), args.tx_depth).into());
    }
    // Free slots, taken from the pool once: a completion puts its slot back here.
    let mut free: Vec<Slot<'r>> = Vec::with_capacity(args.tx_depth);
    free.extend(std::iter::from_fn(|| pool.try_take()));
    let mut failed: Option<Error> = None;
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < args.iters {
        while posted < args.iters {
            let Some(slot) = free.pop() else { break };
            let wr = SlotRequest::write(slot, args.size, remote);
            sq.push(if every_cq_mod(args, posted) { wr.signaled() } else { wr }).map_err(Error::from)?;
            posted += 1;
        }
        sq.submit()?;
        let mut now = None;
        done += sq.poll(|c| {
            if let Err(e) = c.ok() {
                failed.get_or_insert(e);
            }
            free.extend(c.slot);
            stamps.push(*now.get_or_insert_with(Instant::now));
        })?;
        if let Some(e) = failed.take() {
            return Err(e.into());
        }
    }
    Ok((start, start.elapsed()))
}

/// perftest's "MB": 2^20 bytes (its help says "MiB=2^20 byte"; `format_factor` 0x100000).
const MB: f64 = (1 << 20) as f64;

/// Prints perftest's result line, then `tag` (the path, when several were measured).
fn report(args: &Args, start: Instant, total: Duration, stamps: &[Instant], tag: &str) {
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
    let rate = avg * MB / bytes / 1e6;
    let tag = if tag.is_empty() { String::new() } else { format!("   {tag}") };
    println!(" {:<10} {:<14} {:<18.2} {:<20.2} {:.6}{tag}", args.size, args.iters, peak, avg, rate);
}
