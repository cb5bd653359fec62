// A batch of work requests borrows its posting scope while it is open: nothing else can post
// through the scope until the batch is completed or dropped (aborted).
use rdma_verbs::*;

fn post<'s>(s: &mut PostScope<'s, '_, Rc, ReadyToSend>, a: SendRequest<'_, 's>, mut b: SendRequest<'_, 's>) -> Result<()> {
    let mut batch = s.batch()?;
    batch.push(&a)?;
    s.post_send(std::slice::from_mut(&mut b))?;
    batch.complete()?;
    Ok(())
}

fn main() {}
