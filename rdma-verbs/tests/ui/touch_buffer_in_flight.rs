// While a request posted in a scope may use a region, no plain slice of it can be taken:
// the scope keeps the region borrowed until the request completed.
use std::time::Duration;

use rdma_verbs::{Result, MemoryRegion, QueuePair, Rc, ReadyToSend, SendRequest};

fn post(qp: &QueuePair<'_, Rc, ReadyToSend>, mut mr: MemoryRegion<'_>) {
    let _ = qp.scope(Duration::from_secs(1), |s| -> Result<()> {
        let sge = [mr.sge(..).unwrap()];
        s.post_send(&mut [SendRequest::send(1, &sge)]).unwrap();
        mr.as_mut_slice().unwrap()[0] = 1;
        Ok(())
    });
}

fn main() {}
