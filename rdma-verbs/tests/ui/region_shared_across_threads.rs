// A region's bytes are written through `&self` (`write_at`): two threads holding `&MemoryRegion`
// would race on them, so a region may move to another thread but not be shared.
use rdma_verbs::{AccessFlags, Context};

fn main() {
    let ctx = Context::open("rxe0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| mr.write_at(0, b"one").unwrap());
        s.spawn(|| mr.write_at(0, b"two").unwrap());
    });
}
