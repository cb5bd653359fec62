// The safe layer has the same rule: a scope of a QP in ReadyToReceive has no post_send.
use std::time::Duration;

use rdma_verbs::{Result, MemoryRegion, QueuePair, Rc, ReadyToReceive, SendRequest};

fn post(qp: &QueuePair<'_, Rc, ReadyToReceive>, mr: &MemoryRegion<'_>) {
    let _ = qp.scope(Duration::from_secs(1), |s| -> Result<()> {
        let sge = [mr.sge(..).unwrap()];
        s.post_send(&mut [SendRequest::send(1, &sge)])
    });
}

fn main() {}
