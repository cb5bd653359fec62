//! Cost of the device layer's control verbs.
//!
//! Without an RDMA device (a host without RDMA), it measures listing devices only and says so.
//! In the VM: `scripts/softroce run -- cargo bench` is not possible (the guest cannot write
//! `target/`); build with `cargo bench --no-run` and run the binary in the VM instead.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rdma_verbs::{Context, DeviceList};

fn device_layer(c: &mut Criterion) {
    c.bench_function("ibv_get_device_list + free", |b| b.iter(|| black_box(DeviceList::available().unwrap().len())));
    let Ok(ctx) = Context::open_first() else {
        println!("devices: no RDMA device here; port and GID queries not measured");
        return;
    };
    c.bench_function(&format!("ibv_query_port ({})", ctx.name()), |b| b.iter(|| black_box(ctx.query_port(1).unwrap())));
    c.bench_function(&format!("ibv_query_gid_ex ({})", ctx.name()), |b| {
        b.iter(|| black_box(ctx.query_gid(1, 0).unwrap()))
    });
}

criterion_group!(benches, device_layer);
criterion_main!(benches);
