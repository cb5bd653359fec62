// Only a queue pair in ReadyToSend can post sends: one in Init cannot.
use rdma_verbs::{Init, QueuePair, Rc, SendRequest};

fn post(qp: &QueuePair<'_, Rc, Init>, wr: SendRequest<'_, '_>) {
    let mut wrs = [wr];
    let _ = unsafe { qp.post_send(&mut wrs) };
}

fn main() {}
