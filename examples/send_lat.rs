//! SEND latency, like perftest's `ib_send_lat`: same flags, same columns.
//!
//! ```text
//! send_lat -d rxe0 -x 1 -s 8 -n 1000                  # server
//! send_lat -d rxe1 -x 1 -s 8 -n 1000 10.77.0.1        # client: prints the result
//! ```
//! Ping-pong of SENDs, as perftest's `run_iter_lat_send`: the client sends `-s` bytes, waits
//! for the send's completion (every send is signaled, as perftest's with its send queue depth
//! of 1), then for the server's answer; the server waits for the client's message, re-posts
//! its receive, answers the same way. The client stamps each iteration once, just before its
//! send, with the CPU's counter (`common/clock.rs`); a period between stamps is a round trip,
//! latency half of it, reported as perftest does (`common/lat.rs`).
//!
//! Both sides use the library's safe owned-buffer path: receives stay posted in a
//! [`RecvRing`] (`-r` of them, perftest's default 512, at most `-n`, each its own slot of `-s`
//! bytes: at most 256 MiB in all), each [`Message`] released (posted again) as soon as it is
//! seen; sends are one [`Slot`] moving through a [`SendQueue`] as a [`Request::send`] and back
//! with its completion. Nothing is allocated per message, and the timed loop reads the system
//! clock only every few thousand spins of a wait (timeouts).

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::clock::{self, Calibration, SpinTimeout};
use common::*;
use rdma_verbs::*;

const NAME: &str = "send_lat";
/// How long one wait (a completion, the peer's message) may last.
const WAIT: Duration = Duration::from_secs(10);
/// The most memory the receive slots take: fewer receives are posted for larger messages.
const RECV_MEMORY: usize = 256 << 20;

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = parse_args(NAME, 2, 1000, &[]);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

fn run(args: &Args) -> BoxResult<()> {
    if args.iters < lat::MIN_ITERS {
        return Err(format!("-n {}: at least {} iterations", args.iters, lat::MIN_ITERS).into());
    }
    let rx_depth = args.rx_depth.min((RECV_MEMORY / args.size).max(1)) as u32;
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    // A send queue and a receive ring each own their CQ.
    let send_cq = ctx.create_cq(16, None)?;
    let recv_cq = ctx.create_cq(rx_depth, None)?;
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: rx_depth, ..QpCaps::default() };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&send_cq, &recv_cq).caps(caps))?;
    let qp = qp.init(InitAttr::new(args.ib_port).access(AccessFlags::LOCAL_WRITE))?;
    let send_pool = SlotPool::new(&pd, args.size, 1, AccessFlags::LOCAL_WRITE)?;
    let recv_pool = SlotPool::new(&pd, args.size, rx_depth as usize, AccessFlags::LOCAL_WRITE)?;
    // Posted before the peer can send: the receives stay posted through the transitions.
    let mut ring = RecvRing::new(&qp, recv_pool, rx_depth as usize, WAIT)?;
    let psn = std::process::id() & 0xff_ffff;
    let nothing = RemoteRegion { addr: 0, rkey: 0, len: 0 };
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region: nothing };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    oob.agree(&format!("-s {} -n {}", args.size, args.iters))?;
    let qp = connect(qp, args, psn, &peer)?;
    let mut sq = SendQueue::new(&qp, WAIT)?;
    let mut slot = Some(send_pool.try_take().ok_or("the slot pool is empty")?);
    oob.sync()?;

    let client = args.server.is_some();
    let mut stamps = clock::stamp_buffer(args.iters);
    let calibration = Calibration::start();
    for _ in 0..args.iters {
        if !client {
            receive(&mut ring, args.size)?;
        } else {
            stamps.push(clock::ticks());
        }
        // The last request of a doorbell is signaled: this one.
        let s = slot.take().ok_or("the slot did not come back")?;
        sq.push(SlotRequest::send(s, args.size)).map_err(Error::from)?;
        submit_and_wait_one(&mut sq, &mut slot, WAIT)?;
        if client {
            receive(&mut ring, args.size)?;
        }
    }
    let rate = calibration.finish()?;
    oob.sync()?;
    if !client {
        println!("{NAME}: server done ({} round trips)", args.iters);
        return Ok(());
    }
    let mut periods = Vec::with_capacity(args.iters);
    let l = lat::compute(&stamps, rate, 2.0, &mut periods)?;
    println!("{}", lat::HEADER);
    lat::print(args.size, args.iters, &l, "");
    Ok(())
}

/// Waits for the peer's next message, checks it, and posts its slot again.
fn receive(ring: &mut RecvRing<'_>, size: usize) -> BoxResult<()> {
    let mut timeout = SpinTimeout::new(WAIT);
    let msg = loop {
        if let Some(msg) = ring.try_recv()? {
            break msg;
        }
        if timeout.expired() {
            return Err(format!("the peer's message did not arrive within {WAIT:?}").into());
        }
    };
    msg.ok()?;
    if msg.bytes().len() != size {
        return Err(format!("a message of {} bytes, expected {size}", msg.bytes().len()).into());
    }
    ring.release(msg)?;
    Ok(())
}
