// A protection domain cannot outlive its device context.
use rdma_verbs::Context;

fn main() {
    let pd = {
        let ctx = Context::open("rxe0").unwrap();
        ctx.alloc_pd().unwrap()
    };
    drop(pd);
}
