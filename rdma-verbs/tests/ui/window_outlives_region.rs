// A bound memory window borrows its region: the region cannot be dropped (deregistered, its
// buffer freed) while a peer may still reach it through the window.
use std::time::Duration;

use rdma_verbs::*;

fn grant(qp: &QueuePair<'_, Rc, ReadyToSend>) -> Result<()> {
    let pd = qp.pd();
    let window = pd.alloc_mw(WindowType::Type1)?;
    let region = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    let bound = qp.scope(Duration::from_secs(1), |s| s.bind_window(1, window, &region, .., AccessFlags::REMOTE_READ))?;
    drop(region);
    println!("{:?}", bound.remote());
    Ok(())
}

fn main() {}
