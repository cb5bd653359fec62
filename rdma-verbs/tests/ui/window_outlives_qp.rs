// A bound memory window cannot outlive the QP it was bound through: a type 2 window is bound
// to that QP, and destroying the QP under it is refused by the compiler.
use std::time::Duration;

use rdma_verbs::*;

fn grant<'a>(pd: &'a ProtectionDomain<'a>, qp: QueuePair<'a, Rc, ReadyToSend>, region: &MemoryRegion<'a>) -> Result<()> {
    let window = pd.alloc_mw(WindowType::Type2)?;
    let bound = qp.scope(Duration::from_secs(1), |s| s.bind_window(1, window, region, .., AccessFlags::REMOTE_READ))?;
    drop(qp);
    println!("{:?}", bound.remote());
    Ok(())
}

fn main() {}
