// Connecting needs a resolved route: an identifier with only its address resolved has no
// `connect`.
use std::time::Duration;

use rdma_cm::{CmId, ConnParams};
use rdma_verbs::{AccessFlags, Context, QpCreateAttr, Rc};

fn main() {
    let t = Duration::from_secs(1);
    let id = CmId::new().unwrap().resolve_addr(None, "10.77.0.1:7471".parse().unwrap()).wait(t).unwrap();
    let ctx = Context::open("rxe0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    let qp = qp.init(rdma_verbs::InitAttr::new(1).access(AccessFlags::empty())).unwrap();
    let _conn = id.connect(qp, &ConnParams::new()).wait(t);
}
