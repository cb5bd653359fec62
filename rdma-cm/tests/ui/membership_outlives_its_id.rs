// A multicast membership borrows the identifier that joined (and the QP it attached): it cannot
// outlive them, so the group is always left, and the QP detached, before either goes.
use std::time::Duration;

use rdma_cm::UdId;
use rdma_verbs::{QpCreateAttr, Ud};

fn main() {
    let t = Duration::from_secs(1);
    let group = "239.77.0.1:0".parse().unwrap();
    let mut id = UdId::new().unwrap().resolve_addr(None, group).wait(t).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq)).unwrap()).unwrap();
    let membership = id.join(group, &qp).wait(t).unwrap();
    drop(id);
    drop(membership);
}
