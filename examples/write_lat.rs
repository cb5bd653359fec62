//! RDMA WRITE latency, like perftest's `ib_write_lat`: same flags, same columns.
//!
//! ```text
//! write_lat -d rxe0 -x 1 -s 8 -n 1000                 # server
//! write_lat -d rxe1 -x 1 -s 8 -n 1000 10.77.0.1       # client: prints the result
//! ```
//! Ping-pong, as perftest's `run_iter_lat_write`: each side RDMA-writes `-s` bytes into the
//! other's buffer, whose last byte carries the iteration number, waits for that write's
//! completion (every write is signaled, as perftest's with its send queue depth of 1), and
//! watches its own buffer (by copy, `read_at`) for the peer's write. The client stamps each
//! iteration once, just before its write, with the CPU's counter (`rdtsc`, see
//! `common/clock.rs`), calibrated against the system clock over the run; a period between
//! stamps is a round trip, latency half of it, reported as perftest does (`common/lat.rs`).
//! The timed loop reads the system clock only every few thousand spins of a wait (timeouts).
//!
//! The writes go through one of two paths (`--api`, not perftest's; both sides take the same):
//! - `pool` (default): the safe owned-buffer path, one [`Slot`] of a [`SlotPool`] moving
//!   through a [`SendQueue`] as a [`Request::write`] and back with its completion;
//! - `raw`: `unsafe` `ibv_post_send` of one request from a registered buffer, as perftest.
//!
//! `--api pool,raw --repeat N` measures N times in one connection, through the paths in turn
//! (A B B A A B ...), one result line each, tagged. The server must be given the same `-s -n
//! --api --repeat` (checked when connecting).

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use common::clock::{self, Calibration, SpinTimeout};
use common::*;
use rdma_verbs::*;

const NAME: &str = "write_lat";
const APIS: &[&str] = &["pool", "raw"];
/// How long one wait (a completion, the peer's write) may last.
const WAIT: Duration = Duration::from_secs(10);

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = parse_args(NAME, 2, 1000, APIS);
    if let Err(e) = run(&args) {
        fail(NAME, e);
    }
}

fn run(args: &Args) -> BoxResult<()> {
    if args.iters < lat::MIN_ITERS {
        return Err(format!("-n {}: at least {} iterations", args.iters, lat::MIN_ITERS).into());
    }
    let ctx = open_context(args)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 1, ..QpCaps::default() };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps))?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = qp.init(InitAttr::new(args.ib_port).access(access))?;
    // Two halves: [0, size) is what `raw` sends, [size, 2 size) is where the peer writes to us.
    let mr = pd.alloc_mr(2 * args.size, access)?;
    // What `pool` sends: one slot, registered before the test like the region.
    let pool = SlotPool::new(&pd, args.size, 1, AccessFlags::LOCAL_WRITE)?;
    let psn = std::process::id() & 0xff_ffff;
    let inbox = mr.remote().slice(args.size as u64, args.size as u64).ok_or("size")?;
    let me = Peer { endpoint: qp.endpoint(args.gid_index, psn)?, region: inbox };
    let mut oob = Oob::open(args)?;
    let peer = oob.exchange(&me)?;
    oob.agree(&format!("-s {} -n {} --api {} --repeat {}", args.size, args.iters, args.apis.join(","), args.repeat))?;
    let qp = connect(qp, args, psn, &peer)?;
    oob.sync()?;

    let client = args.server.is_some();
    let mut stamps = clock::stamp_buffer(args.iters);
    let mut periods: Vec<u64> = Vec::with_capacity(args.iters);
    if client {
        println!("{}", lat::HEADER);
    }
    let n = args.apis.len();
    for m in 0..args.repeat {
        // Through the paths forwards, then backwards (A B B A A B ...): drift favours none.
        let (cycle, k) = (m / n, m % n);
        let api = args.apis[if cycle % 2 == 0 { k } else { n - 1 - k }];
        stamps.clear();
        let ping = Ping { client, first: m * args.iters, iters: args.iters, mr: &mr, last: 2 * args.size - 1 };
        let calibration = Calibration::start();
        match api {
            "raw" => raw_loop(&ping, &qp, &cq, peer.region, &mut stamps)?,
            _ => pool_loop(&ping, &qp, &pool, peer.region, &mut stamps)?,
        }
        if client {
            let rate = calibration.finish()?;
            let l = lat::compute(&stamps, rate, 2.0, &mut periods)?;
            let tag = if n > 1 || args.repeat > 1 { api } else { "" };
            lat::print(args.size, args.iters, &l, tag);
        }
        oob.sync()?;
    }
    if !client {
        println!("{NAME}: server done ({} round trips)", args.iters * args.repeat);
    }
    Ok(())
}

/// One measurement's ping-pong: which side, which iterations, the buffer the peer writes.
struct Ping<'a, 'pd> {
    client: bool,
    /// The number of the first iteration (the markers go on across measurements).
    first: usize,
    iters: usize,
    mr: &'a MemoryRegion<'pd>,
    /// The byte of `mr` the peer's writes end on.
    last: usize,
}

impl Ping<'_, '_> {
    /// The byte iteration `i` carries: 1..=255, never the buffer's initial 0.
    fn marker(&self, i: usize) -> u8 {
        ((self.first + i) % 255) as u8 + 1
    }

    /// Waits for the peer's write of `marker`.
    fn wait_peer(&self, marker: u8) -> BoxResult<()> {
        let mut b = [0u8];
        let mut timeout = SpinTimeout::new(WAIT);
        loop {
            self.mr.read_at(self.last, &mut b)?;
            if b[0] == marker {
                return Ok(());
            }
            if timeout.expired() {
                return Err(format!("the peer's write did not arrive within {:?}", timeout.limit()).into());
            }
        }
    }

    /// The loop both paths share: `write(marker)` posts one write and waits for its completion.
    fn run(&self, stamps: &mut Vec<u64>, mut write: impl FnMut(u8) -> BoxResult<()>) -> BoxResult<()> {
        for i in 0..self.iters {
            let marker = self.marker(i);
            if !self.client {
                self.wait_peer(marker)?;
            } else {
                stamps.push(clock::ticks());
            }
            write(marker)?;
            if self.client {
                self.wait_peer(marker)?;
            }
        }
        Ok(())
    }
}

/// `unsafe` posting of one signaled write from the first half of the region, polled for.
fn raw_loop(
    ping: &Ping<'_, '_>,
    qp: &QueuePair<'_, Rc, ReadyToSend>,
    cq: &CompletionQueue<'_>,
    remote: RemoteRegion,
    stamps: &mut Vec<u64>,
) -> BoxResult<()> {
    let size = ping.last / 2 + 1;
    let src = [ping.mr.sge(0..size)?];
    let mut wcs: [WorkCompletion; 1] = Default::default();
    ping.run(stamps, |marker| {
        ping.mr.write_at(size - 1, &[marker])?;
        let mut wr = [SendRequest::write(u64::from(marker), &src, remote)];
        // SAFETY: the write only reads `mr`, of which this program never takes a slice (only
        // `read_at`/`write_at` copies); each write completes (it is signaled and awaited below)
        // before the next iteration changes the byte; if this returns early on an error, the
        // QP is destroyed before `mr` is deregistered (it was made later), which ends the
        // device's use of it.
        unsafe { qp.post_send(&mut wr)? };
        let mut timeout = SpinTimeout::new(WAIT);
        loop {
            if let Some(wc) = cq.poll(&mut wcs)?.first() {
                wc.ok()?;
                return Ok(());
            }
            if timeout.expired() {
                return Err(format!("no completion within {:?}", timeout.limit()).into());
            }
        }
    })
}

/// The owned-buffer path: the pool's one slot moves into a write and back with its completion.
fn pool_loop<'r>(
    ping: &Ping<'_, '_>,
    qp: &QueuePair<'r, Rc, ReadyToSend>,
    pool: &SlotPool<'r>,
    remote: RemoteRegion,
    stamps: &mut Vec<u64>,
) -> BoxResult<()> {
    let size = pool.slot_size();
    let mut sq = SendQueue::new(qp, WAIT)?;
    let mut slot = Some(pool.try_take().ok_or("the slot pool is empty")?);
    ping.run(stamps, |marker| {
        let mut s = slot.take().ok_or("the slot did not come back")?;
        s.write_at(size - 1, &[marker])?;
        // The last request of a doorbell is signaled: this one.
        sq.push(SlotRequest::write(s, size, remote)).map_err(Error::from)?;
        submit_and_wait_one(&mut sq, &mut slot, WAIT)
    })
}
