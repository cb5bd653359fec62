// `connect` takes a QP in `Init` (from `init_qp`), not one fresh from `create_qp`.
use std::time::Duration;

use rdma_cm::{CmId, ConnParams};
use rdma_verbs::{Context, QpCreateAttr, Rc};

fn main() {
    let t = Duration::from_secs(1);
    let id = CmId::new().unwrap().resolve(None, "10.77.0.1:7471".parse().unwrap()).wait(t).unwrap();
    let ctx = Context::open("rxe0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    let _conn = id.connect(qp, &ConnParams::new()).wait(t);
}
