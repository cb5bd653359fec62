// A slot posted through a SendQueue is the request's: the application cannot write it (or read
// it) until the completion gives it back.
use rdma_verbs::{RemoteRegion, SlotRequest, SendQueue, Rc, SlotPool};

fn post<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, peer: RemoteRegion) {
    let mut slot = pool.try_take().unwrap();
    sq.push(SlotRequest::write(slot, 8, peer)).unwrap();
    slot.as_mut_slice().unwrap()[0] = 1; // error: `slot` was moved into the request
}

fn main() {}
