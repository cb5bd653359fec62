// A thread can own a QP only if its parents are shared (Arc): a borrowed PD keeps the QP's
// lifetime tied to the stack, and `std::thread::spawn` needs 'static.
use rdma_verbs::{Context, QpCreateAttr, Rc};

fn main() {
    let ctx = Context::open("rxe0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
    std::thread::spawn(move || drop(qp)); // error: `pd` does not live long enough
}
