// A memory region cannot outlive the protection domain it was registered in.
use rdma_verbs::{AccessFlags, Context};

fn main() {
    let ctx = Context::open("rxe0").unwrap();
    let mr = {
        let pd = ctx.alloc_pd().unwrap();
        pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap()
    };
    drop(mr);
}
