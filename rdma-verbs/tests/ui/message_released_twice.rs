// A received message is released (posted again) once: `release` takes it by value.
use rdma_verbs::RecvRing;

fn twice(ring: &mut RecvRing<'_>) {
    let msg = ring.try_recv().unwrap().unwrap();
    ring.release(msg).unwrap();
    ring.release(msg).unwrap(); // error: use of moved value `msg`
}

fn main() {}
