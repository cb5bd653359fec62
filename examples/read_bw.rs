//! RDMA READ bandwidth, like perftest's `ib_read_bw`: same flags, same columns.
//!
//! ```text
//! read_bw -d rxe0 -x 1 -s 65536 -n 1000                 # server: its memory is read
//! read_bw -d rxe1 -x 1 -s 65536 -n 1000 10.77.0.1       # client: reads, prints the result
//! ```
//! The client keeps `-t` READs of `-s` bytes in flight (perftest's default 128, at most `-n`),
//! each into its own buffer, refilled as completions come, `-l` READs per doorbell (perftest's
//! `--post_list`, default 1: one `ibv_post_send` per READ, as perftest). Two paths (`--api`,
//! not perftest's; the client's choice, the server is the same for both):
//! - `pool` (default): the safe owned-buffer path, a [`SlotPool`] of `-t` slots and a
//!   [`SendQueue`] of [`Request::read`]s, each completion giving its slots back (reused in
//!   order, oldest first). A `SendQueue` signals the last READ of each doorbell, so with `-l 1`
//!   every READ is signaled, whatever `-Q`;
//! - `raw`: `unsafe` `ibv_post_send` into a ring of `-t` buffers of one registered region, as
//!   perftest posts: signaled every `-Q`th READ, the last of the run, and the last of each
//!   chain when `-l` is over 1.
//!
//! Nothing is allocated per request. `--api raw,pool --repeat N` measures N times in one
//! connection, through the paths in turn (A B B A A B ...), one result line each, tagged.
//!
//! perftest's defaults, which the client prints before the result:
//! - outstanding READs (`-o`): the device's `max_qp_rd_atom` unless given (capped at it); as
//!   perftest, each side serves its own value (`max_dest_rd_atomic`) and issues the peer's
//!   (`max_rd_atomic`), exchanged when connecting;
//! - CQ moderation (`-Q`): every 100th READ signaled (at most `-t`), every one above 8 KiB
//!   unless `-Q` is given.
//!
//! Time is the CPU's counter (`common/clock.rs`), read at each post and once per poll that
//! returned completions, calibrated against the system clock over the run. As perftest: BW
//! average is the bytes over the time from the first post to the last completion, in MB of
//! 2^20 bytes; BW peak is the size over the shortest time per READ between any post and a
//! later signaled completion (`print_report_bw`).

#[path = "common/mod.rs"]
mod common;

use std::collections::VecDeque;
use std::time::Duration;

use common::clock::{self, Calibration, SpinTimeout, TickRate};
use common::*;
use rdma_verbs::*;

const NAME: &str = "read_bw";
const APIS: &[&str] = &["pool", "raw"];
/// How long the client waits without any completion, and dropping a queue with READs in
/// flight waits for them (only after an error).
const WAIT: Duration = Duration::from_secs(10);
/// perftest signals every request of messages larger than this unless `-Q` is given.
const CQ_MOD_LIMIT: usize = 8192;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = parse_args(NAME, 65536, 1000, APIS);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

fn run(args: &Args) -> BoxResult<()> {
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(args.tx_depth as u32 * 2, None)?;
    let caps = QpCaps { max_send_wr: args.tx_depth as u32, max_recv_wr: 1, ..QpCaps::default() };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let qp = qp.init(InitAttr::new(args.ib_port).access(access))?;
    let client = args.server.is_some();
    // The server's region is what the client reads. The client reads into the pool's slots or
    // (raw) into a ring of buffers in one region, both registered before the test.
    let mr = match client {
        false => Some(pd.alloc_mr(args.size, access)?),
        true if args.apis.contains(&"raw") => Some(pd.alloc_mr(args.size * args.tx_depth, AccessFlags::LOCAL_WRITE)?),
        true => None,
    };
    let pool = match client && args.apis.contains(&"pool") {
        true => Some(SlotPool::new(&pd, args.size, args.tx_depth, AccessFlags::LOCAL_WRITE)?),
        false => None,
    };
    let max_reads = ctx.attr().max_qp_rd_atom.clamp(1, u32::from(u8::MAX));
    let out_reads = match args.out_reads {
        0 => max_reads,
        o if o > max_reads => {
            eprintln!("{NAME}: -o {o} is above the device's max_qp_rd_atom {max_reads}: using {max_reads}");
            max_reads
        }
        o => o,
    };
    let cq_mod = if args.size > CQ_MOD_LIMIT && !args.cq_mod_given { 1 } else { args.cq_mod };
    let psn = std::process::id() & 0xff_ffff;
    let region = match (&mr, client) {
        (Some(mr), false) => mr.remote(),
        _ => RemoteRegion { addr: 0, rkey: 0, len: 0 },
    };
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    oob.agree(&format!("-s {} -n {} --repeat {}", args.size, args.iters, args.repeat))?;
    let peer_reads = oob.exchange_u64(u64::from(out_reads))?.clamp(1, u64::from(max_reads)) as u8;
    let qp = connect_reads(qp, args, psn, &peer, (out_reads as u8, peer_reads))?;
    oob.sync()?;
    if !client {
        // The server's memory is read by the client; it waits for the end of the test.
        oob.sync()?;
        println!("{NAME}: server done ({} reads of {} bytes served)", args.iters * args.repeat, args.size);
        return Ok(());
    }

    println!(" Outstand reads  : {peer_reads} (the server's -o; this side's {out_reads}, device max {max_reads})");
    println!(" TX depth        : {}", args.tx_depth);
    println!(" Post list       : {}", args.post_list);
    println!(" CQ Moderation   : {cq_mod} (pool: the last READ of each doorbell too)");
    println!(" Clock           : {} (kernel clocksource {})", clock::SOURCE, clock::clocksource());
    println!(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]");
    let mut t = Times { posted: clock::stamp_buffer(args.iters), completed: clock::stamp_buffer(args.iters) };
    let n = args.apis.len();
    for m in 0..args.repeat {
        // Through the paths forwards, then backwards (A B B A A B ...): drift favours none.
        let (cycle, k) = (m / n, m % n);
        let api = args.apis[if cycle % 2 == 0 { k } else { n - 1 - k }];
        t.posted.clear();
        t.completed.clear();
        let calibration = Calibration::start();
        match (api, &pool, &mr) {
            ("pool", Some(pool), _) => pool_loop(args, cq_mod, &qp, pool, peer.region, &mut t)?,
            (_, _, Some(mr)) => raw_loop(args, cq_mod, &qp, &cq, mr, peer.region, &mut t)?,
            _ => return Err("no buffers for this path".into()),
        }
        let rate = calibration.finish()?;
        let tag = if n > 1 || args.repeat > 1 { api } else { "" };
        report(args, rate, cq_mod, &t, tag);
    }
    oob.sync()?;
    Ok(())
}

/// Counter values, one per READ: when it was posted, when its completion was seen.
struct Times {
    posted: Vec<u64>,
    completed: Vec<u64>,
}

/// The owned-buffer path: `-t` slots, each READ owning one until its completion gives it back.
fn pool_loop<'r>(
    args: &Args,
    cq_mod: usize,
    qp: &QueuePair<'r, Rc, ReadyToSend>,
    pool: &SlotPool<'r>,
    remote: RemoteRegion,
    t: &mut Times,
) -> BoxResult<()> {
    let mut sq = SendQueue::new(qp, WAIT)?;
    if sq.capacity() < args.tx_depth {
        return Err(format!("the send queue takes {} requests, -t is {}", sq.capacity(), args.tx_depth).into());
    }
    // Free slots, taken from the pool once: a completion puts its slot back at the end.
    let mut free: VecDeque<Slot<'r>> = VecDeque::with_capacity(args.tx_depth);
    free.extend(std::iter::from_fn(|| pool.try_take()));
    let mut failed: Option<Error> = None;
    let mut done = 0usize;
    let mut timeout = SpinTimeout::new(WAIT);
    while done < args.iters {
        while t.posted.len() < args.iters {
            let Some(slot) = free.pop_front() else { break };
            let rd = SlotRequest::read(slot, args.size, remote);
            let i = t.posted.len();
            t.posted.push(clock::ticks());
            sq.push(if (i + 1) % cq_mod == 0 { rd.signaled() } else { rd }).map_err(Error::from)?;
            if sq.staged() == args.post_list {
                sq.submit()?;
            }
        }
        sq.submit()?;
        let mut now = None;
        let n = sq.poll(|c| {
            if let Err(e) = c.ok() {
                failed.get_or_insert(e);
            }
            free.extend(c.slot);
            t.completed.push(*now.get_or_insert_with(clock::ticks));
        })?;
        if let Some(e) = failed.take() {
            return Err(e.into());
        }
        if n > 0 {
            done += n;
            timeout = SpinTimeout::new(WAIT);
        } else if timeout.expired() {
            return Err(format!("no READ completed within {WAIT:?} ({done} of {} done)", args.iters).into());
        }
    }
    Ok(())
}

/// `unsafe` posting, as perftest: chains of `-l` READs into a ring of `-t` buffers of `mr`,
/// signaled every `cq_mod`th, at the end of the run and of each chain of several. A completion's
/// `wr_id` is the READ's number: it completes every READ up to it.
fn raw_loop(
    args: &Args,
    cq_mod: usize,
    qp: &QueuePair<'_, Rc, ReadyToSend>,
    cq: &CompletionQueue<'_>,
    mr: &MemoryRegion<'_>,
    remote: RemoteRegion,
    t: &mut Times,
) -> BoxResult<()> {
    let sges = (0..args.tx_depth).map(|k| mr.sge(k * args.size..(k + 1) * args.size)).collect::<Result<Vec<_>>>()?;
    let mut chain: Vec<SendRequest<'_, '_>> = Vec::with_capacity(args.post_list);
    let mut wcs: [WorkCompletion; 16] = Default::default();
    let mut done = 0usize;
    let mut timeout = SpinTimeout::new(WAIT);
    while done < args.iters {
        while t.posted.len() < args.iters
            && t.posted.len() + args.post_list.min(args.iters - t.posted.len()) - done <= args.tx_depth
        {
            let from = t.posted.len();
            let end = (from + args.post_list).min(args.iters);
            chain.clear();
            for i in from..end {
                let rd = SendRequest::read(i as u64, std::slice::from_ref(&sges[i % args.tx_depth]), remote);
                // As perftest: a chain of several ends signaled, a single READ only every -Q'th.
                let signaled = (i + 1) % cq_mod == 0 || i + 1 == args.iters || (args.post_list > 1 && i + 1 == end);
                chain.push(if signaled { rd } else { rd.unsignaled() });
                t.posted.push(clock::ticks());
            }
            // SAFETY: the READs write only the ring's buffers of `mr`, of which this program
            // never takes a slice or reads, and at most `-t` are in flight, so a buffer is
            // reused only after the READ into it completed; if this returns early on an error,
            // the QP is destroyed before `mr` is deregistered (it was made later), which ends
            // the device's use of it.
            unsafe { qp.post_send(&mut chain)? };
        }
        let n = cq.poll(&mut wcs)?.len();
        if n > 0 {
            let now = clock::ticks();
            for wc in &wcs[..n] {
                wc.ok()?;
                let upto = wc.wr_id() as usize + 1;
                t.completed.extend(std::iter::repeat(now).take(upto - done));
                done = upto;
            }
            timeout = SpinTimeout::new(WAIT);
        } else if timeout.expired() {
            return Err(format!("no READ completed within {WAIT:?} ({done} of {} done)", args.iters).into());
        }
    }
    Ok(())
}

/// perftest's "MB": 2^20 bytes (its help says "MiB=2^20 byte"; `format_factor` 0x100000).
const MB: f64 = (1 << 20) as f64;

/// Prints perftest's result line, then `tag` (the path, when several were measured).
fn report(args: &Args, rate: TickRate, cq_mod: usize, t: &Times, tag: &str) {
    let n = t.completed.len().min(t.posted.len());
    let (Some(&first), Some(&last)) = (t.posted.first(), t.completed.get(n.wrapping_sub(1))) else { return };
    let bytes = args.size as f64;
    let total = last.wrapping_sub(first);
    let avg = bytes * n as f64 / rate.secs(total) / MB;
    // perftest's peak: the least time per READ from any post `i` to a later signaled
    // completion `j` (the READs numbered j + 1 = k * cq_mod, and the last), starting from the
    // whole run's time (not per READ, as perftest).
    let mut best = total as f64;
    let mut per = |i: usize, j: usize| {
        let dt = t.completed[j].wrapping_sub(t.posted[i]) as f64 / (j - i + 1) as f64;
        best = best.min(dt);
    };
    for i in (0..n).step_by(args.post_list) {
        let mut j = (i + 1).div_ceil(cq_mod) * cq_mod - 1;
        while j < n {
            per(i, j);
            j += cq_mod;
        }
        if n % cq_mod != 0 {
            per(i, n - 1);
        }
    }
    let peak = bytes / (best.max(1.0) / rate.mhz() / 1e6) / MB;
    let msg_rate = avg * MB / bytes / 1e6;
    let tag = if tag.is_empty() { String::new() } else { format!("   {tag}") };
    println!(" {:<10} {:<14} {:<18.2} {:<20.2} {:.6}{tag}", args.size, n, peak, avg, msg_rate);
}
