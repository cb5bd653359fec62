// An open batch holds the provider's send-queue lock, taken by the thread that opened it:
// it cannot be completed on another thread.
use rdma_verbs::*;

fn finish_elsewhere(s: &mut PostScope<'_, '_, Rc, ReadyToSend>) -> Result<()> {
    let batch = s.batch()?;
    std::thread::scope(|t| {
        t.spawn(move || batch.complete());
    });
    Ok(())
}

fn main() {}
