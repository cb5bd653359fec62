// A connection's queue pair borrows the PD and CQ it was created on: the connection cannot
// outlive them.
use std::time::Duration;

use rdma_cm::{CmId, ConnParams, Connection};
use rdma_verbs::{AccessFlags, Context, QpCreateAttr, Rc};

fn connect(ctx: &Context) -> Connection<'_> {
    let t = Duration::from_secs(1);
    let id = CmId::new().unwrap().resolve(None, "10.77.0.1:7471".parse().unwrap()).wait(t).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap();
    id.connect(qp, &ConnParams::new()).wait(t).unwrap()
}

fn main() {
    let ctx = Context::open("rxe0").unwrap();
    let _conn = connect(&ctx);
}
