// The bytes of a message cannot be read after it was released: the slot is posted again and
// the NIC may write it.
use rdma_verbs::RecvRing;

fn read_after(ring: &mut RecvRing<'_>) -> u8 {
    let msg = ring.try_recv().unwrap().unwrap();
    let bytes = msg.bytes();
    ring.release(msg).unwrap(); // error: cannot move out of `msg` while borrowed
    bytes[0]
}

fn main() {}
