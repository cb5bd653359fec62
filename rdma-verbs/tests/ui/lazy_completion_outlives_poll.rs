// A completion of a lazy poll is lent to the closure for the length of the call, inside the
// poll (between ibv_start_poll and ibv_end_poll): it cannot be kept past it.
use rdma_verbs::*;

fn keep(cq: &CompletionQueue<'_>) -> Result<u64> {
    let mut kept = None;
    cq.poll_each(16, |wc| kept = Some(wc))?;
    Ok(kept.map_or(0, |wc| wc.wr_id()))
}

fn main() {}
