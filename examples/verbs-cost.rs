//! What the data path's calls cost, counted in instructions: the classic calls (`ibv_post_send`,
//! `ibv_poll_cq`) against the extended ones (a batch of `ibv_wr_*` builders ended by
//! `ibv_wr_complete`; a lazy poll of an extended CQ), through the safe posting scope.
//!
//! ```text
//! verbs-cost                              # rxe1 writes to rxe0, 64 rounds of 64 writes per path
//! valgrind --tool=callgrind --callgrind-out-file=cg.out verbs-cost
//! callgrind_annotate --inclusive=yes cg.out | grep verbs_cost::
//! ```
//! Run it under `valgrind --tool=callgrind`: the instructions of each measured function
//! (`post_classic`, `post_batch`, `poll_classic`, `poll_lazy`, never inlined), divided by the
//! requests or completions it handled, which the program prints, are the cost of one request
//! or one completion, the provider's user-space part included (rxe's kernel work is not
//! counted). `scripts/compare` (part `ex`) does that in the VM. Timing cannot tell these costs
//! apart under TCG (±20% between runs); the counts repeat exactly.
//!
//! Each path gets its own pair of RC queue pairs (sender on `--from`, target on `--to`):
//! - `classic`: a QP and a CQ as `ibv_create_qp` and `ibv_create_cq` make them; each round posts
//!   `--depth` 8-byte WRITEs, signaled, in one `ibv_post_send` chain;
//! - `extended`: `ibv_create_qp_ex` (`SendOps::RDMA_WRITE`) and `ibv_create_cq_ex`; each round
//!   one batch of the same writes.
//!
//! After posting, a round sleeps until every write has completed, then polls them: the polling
//! function sees (almost) no empty polls, which would otherwise make its count depend on timing.
//! The empty polls it did see are printed, so that a run where they are not small is noticed.

use std::hint::black_box;
use std::time::Duration;

use rdma_verbs::*;

/// How long a round sleeps between posting and polling: rxe completes 64 small writes in far less.
const SETTLE: Duration = Duration::from_millis(5);
/// The longest a round waits for a completion that is late.
const WAIT: Duration = Duration::from_secs(10);
/// The scope's drain at the end (nothing is outstanding then).
const DRAIN: Duration = Duration::from_secs(10);

struct Options {
    from: String,
    to: String,
    gid_index: u8,
    rounds: usize,
    depth: usize,
}

fn main() {
    let o = parse();
    let ctx_from = Context::open(&o.from).unwrap_or_else(|e| fail(e));
    let ctx_to = Context::open(&o.to).unwrap_or_else(|e| fail(e));
    let ctxs = (&ctx_from, &ctx_to);
    println!("{:<14} {:>9} {:>12} {:>12}", "path", "requests", "completions", "empty polls");
    let paths: [(&str, &dyn Fn() -> Result<Counts>); 4] = [
        ("scope-classic", &|| scope_path(&o, ctxs, false)),
        ("scope-ex", &|| scope_path(&o, ctxs, true)),
        ("queue-chain", &|| queue_path(&o, ctxs, Posting::Chain)),
        ("queue-batch", &|| queue_path(&o, ctxs, Posting::Batch)),
    ];
    for (name, path) in paths {
        match path() {
            Ok(c) => println!("{name:<14} {:>9} {:>12} {:>12}", c.requests, c.completions, c.empty_polls),
            Err(e) => fail(format!("{name}: {e}")),
        }
    }
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("verbs-cost: {e}");
    std::process::exit(1)
}

fn parse() -> Options {
    let mut o = Options { from: "rxe1".into(), to: "rxe0".into(), gid_index: 1, rounds: 64, depth: 64 };
    let usage = || -> ! {
        eprintln!("usage: verbs-cost [--from DEV] [--to DEV] [-x GID_INDEX] [--rounds N] [--depth N]");
        std::process::exit(2)
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--from" => o.from = v,
            "--to" => o.to = v,
            "-x" => o.gid_index = v.parse().unwrap_or_else(|_| usage()),
            "--rounds" => o.rounds = v.parse().unwrap_or_else(|_| usage()),
            "--depth" => o.depth = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if o.rounds == 0 || o.depth == 0 {
        usage();
    }
    o
}

/// What one path did.
#[derive(Default)]
struct Counts {
    requests: usize,
    completions: usize,
    empty_polls: usize,
}

type Scope<'s, 'env> = PostScope<'s, 'env, Rc, ReadyToSend>;

/// A connected RC pair, `--from` to `--to`: the sending QP (extended with `ext_qp`, on an
/// extended CQ with `ext_cq`), its protection domain, and the target's 8-byte region; `f`
/// measures with them.
fn with_pair<R>(
    o: &Options,
    (ctx_from, ctx_to): (&Context, &Context),
    (ext_qp, ext_cq): (bool, bool),
    f: impl FnOnce(&QueuePair<'_, Rc, ReadyToSend>, &ProtectionDomain<'_>, RemoteRegion) -> Result<R>,
) -> Result<R> {
    let depth = o.depth as u32;
    let (pd, pd_to) = (ctx_from.alloc_pd()?, ctx_to.alloc_pd()?);
    let cq = if ext_cq {
        ctx_from.create_cq_ex(depth, None, WcFields::empty())?
    } else {
        ctx_from.create_cq(depth, None)?
    };
    let cq_to = ctx_to.create_cq(1, None)?;
    let caps = QpCaps { max_send_wr: depth, max_recv_wr: 1, ..QpCaps::default() };
    let mut attr = QpCreateAttr::new(&cq, &cq).caps(caps);
    if ext_qp {
        attr = attr.send_ops(SendOps::RDMA_WRITE);
    }
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let qp = pd.create_qp::<Rc>(attr)?.init(InitAttr::new(1).access(access))?;
    let target = pd_to
        .create_qp::<Rc>(QpCreateAttr::new(&cq_to, &cq_to).caps(QpCaps { max_recv_wr: 1, ..QpCaps::default() }))?
        .init(InitAttr::new(1).access(access))?;
    let dst = pd_to.alloc_mr(8, access)?;
    let (psn, psn_to) = (0x1234, 0x5678);
    let (here, there) = (qp.endpoint(o.gid_index, psn)?, target.endpoint(o.gid_index, psn_to)?);
    let qp = qp.handshake(there, o.gid_index, psn)?;
    let _target = target.handshake(here, o.gid_index, psn_to)?;
    f(&qp, &pd, dst.remote())
}

/// The posting scope: `post_send` on a classic QP and CQ, or batches on an extended QP and CQ.
fn scope_path(o: &Options, ctxs: (&Context, &Context), extended: bool) -> Result<Counts> {
    with_pair(o, ctxs, (extended, extended), |qp, pd, remote| {
        let src = pd.alloc_mr(8, AccessFlags::LOCAL_WRITE)?;
        let sge = [src.sge(..)?];
        let mut wcs: Vec<WorkCompletion> = vec![WorkCompletion::default(); o.depth];
        let mut counts = Counts::default();
        qp.scope(DRAIN, |s| -> Result<()> {
            let mut reqs: Vec<SendRequest<'_, '_>> = Vec::with_capacity(o.depth);
            for round in 0..o.rounds {
                let first = (round * o.depth) as u64;
                if extended {
                    post_batch(s, &mut reqs, &sge, remote, first)?;
                } else {
                    post_classic(s, &mut reqs, &sge, remote, first)?;
                }
                counts.requests += o.depth;
                std::thread::sleep(SETTLE);
                counts.empty_polls += if extended { poll_lazy(s, &mut wcs)? } else { poll_classic(s, &mut wcs)? };
                counts.completions += o.depth;
            }
            Ok(())
        })?;
        Ok(counts)
    })
}

/// A [`SendQueue`] of slots on an extended QP, posting as `posting` says.
fn queue_path(o: &Options, ctxs: (&Context, &Context), posting: Posting) -> Result<Counts> {
    with_pair(o, ctxs, (true, false), |qp, pd, remote| {
        let pool = SlotPool::new(pd, 8, o.depth, AccessFlags::LOCAL_WRITE)?;
        let mut sq = SendQueue::new(qp, DRAIN)?;
        sq.set_posting(posting)?;
        let mut counts = Counts::default();
        for _ in 0..o.rounds {
            if posting == Posting::Batch {
                submit_batch(&mut sq, &pool, remote)?;
            } else {
                submit_chain(&mut sq, &pool, remote)?;
            }
            counts.requests += o.depth;
            std::thread::sleep(SETTLE);
            let (mut done, mut failed) = (0, None);
            let mut check = |c: SlotCompletion<'_>| {
                if let Err(e) = c.ok() {
                    failed.get_or_insert(e);
                }
            };
            while done < o.depth {
                let n = sq.poll(&mut check)?;
                if n == 0 {
                    counts.empty_polls += 1;
                    done += sq.wait(WAIT, &mut check)?;
                }
                done += n;
            }
            if let Some(e) = failed {
                return Err(e);
            }
            counts.completions += o.depth;
        }
        Ok(counts)
    })
}

/// Pushes a WRITE of every free slot of `pool`, then submits them.
fn submit_all<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, remote: RemoteRegion) -> Result<()> {
    while let Some(slot) = pool.try_take() {
        sq.push(SlotRequest::write(slot, 8, remote)).map_err(|r| r.error)?;
    }
    sq.submit().map(drop)
}

/// One round of the send queue posting chains: the writes' push and one `ibv_post_send`.
#[inline(never)]
fn submit_chain<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, remote: RemoteRegion) -> Result<()> {
    submit_all(sq, pool, remote)
}

/// One round of the send queue posting batches: the writes' push and one batch.
#[inline(never)]
fn submit_batch<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, remote: RemoteRegion) -> Result<()> {
    black_box(Posting::Batch);
    submit_all(sq, pool, remote)
}

/// Fills `reqs` with its capacity of WRITEs of `sge` to `remote`, numbered from `first`.
fn fill<'a, 's>(reqs: &mut Vec<SendRequest<'a, 's>>, sge: &'a [Sge<'s>], remote: RemoteRegion, first: u64) {
    reqs.clear();
    let n = reqs.capacity() as u64;
    reqs.extend((first..first + n).map(|id| SendRequest::write(id, sge, remote)));
}

/// One round of the classic path: the writes in one `ibv_post_send` chain.
#[inline(never)]
fn post_classic<'a, 's>(
    s: &mut Scope<'s, '_>,
    reqs: &mut Vec<SendRequest<'a, 's>>,
    sge: &'a [Sge<'s>],
    remote: RemoteRegion,
    first: u64,
) -> Result<()> {
    fill(reqs, sge, remote, first);
    s.post_send(reqs)
}

/// One round of the extended path: the same writes in one batch (`ibv_wr_start`, one
/// `ibv_wr_rdma_write` + `ibv_wr_set_sge` each, `ibv_wr_complete`).
#[inline(never)]
fn post_batch<'a, 's>(
    s: &mut Scope<'s, '_>,
    reqs: &mut Vec<SendRequest<'a, 's>>,
    sge: &'a [Sge<'s>],
    remote: RemoteRegion,
    first: u64,
) -> Result<()> {
    fill(reqs, sge, remote, first);
    let mut batch = s.batch()?;
    for wr in reqs.iter() {
        batch.push(wr)?;
    }
    batch.complete().map(drop)
}

/// Polls the classic CQ (`ibv_poll_cq`) until every completion of the round is in; returns the
/// polls that found none.
#[inline(never)]
fn poll_classic(s: &mut Scope<'_, '_>, wcs: &mut [WorkCompletion]) -> Result<usize> {
    poll_round(s, wcs, false)
}

/// As [`poll_classic`] on the extended CQ: the same calls, which poll lazily there
/// (`ibv_start_poll`, the `ibv_wc_read_*` of a [`WorkCompletion`]'s fields, `ibv_end_poll`).
#[inline(never)]
fn poll_lazy(s: &mut Scope<'_, '_>, wcs: &mut [WorkCompletion]) -> Result<usize> {
    poll_round(s, wcs, true)
}

/// The loop both polling functions inline; `tag` keeps the two from being merged into one.
#[inline(always)]
fn poll_round(s: &mut Scope<'_, '_>, wcs: &mut [WorkCompletion], tag: bool) -> Result<usize> {
    black_box(tag);
    let (mut got, mut empty) = (0, 0);
    while got < wcs.len() {
        let mut n = s.poll(&mut wcs[got..])?.len();
        if n == 0 {
            // Not in yet (a slow round): wait for one, sleeping, at most WAIT.
            empty += 1;
            n = s.wait(1, &mut wcs[got..], WAIT)?.len();
        }
        for wc in &wcs[got..got + n] {
            wc.ok()?;
        }
        got += n;
    }
    Ok(empty)
}
