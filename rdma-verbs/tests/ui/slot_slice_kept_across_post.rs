// A slice of a slot cannot outlive posting the slot: the slice borrows it, posting moves it.
use rdma_verbs::{RemoteRegion, SlotRequest, SendQueue, Rc, SlotPool};

fn post<'r>(sq: &mut SendQueue<'r, Rc>, pool: &SlotPool<'r>, peer: RemoteRegion) {
    let mut slot = pool.try_take().unwrap();
    let bytes = slot.as_mut_slice().unwrap();
    sq.push(SlotRequest::write(slot, 8, peer)).unwrap(); // error: cannot move out of `slot`
    bytes[0] = 1;
}

fn main() {}
