// Nor can the region be moved away (or dropped) inside the scope that uses it.
use std::time::Duration;

use rdma_verbs::{Result, MemoryRegion, QueuePair, Rc, ReadyToSend, SendRequest};

fn post(qp: &QueuePair<'_, Rc, ReadyToSend>, mr: MemoryRegion<'_>) {
    let _ = qp.scope(Duration::from_secs(1), |s| -> Result<()> {
        let sge = [mr.sge(..).unwrap()];
        s.post_send(&mut [SendRequest::send(1, &sge)]).unwrap();
        drop(mr);
        Ok(())
    });
}

fn main() {}
