//! Cost of the device layer's control verbs.
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `devices/ibv_get_device_list+free` | `DeviceList::available` and its drop (measured on any host: without RDMA the list is empty) |
//! | `devices/ibv_query_port` | `Context::query_port` of the server device's port |
//! | `devices/ibv_query_gid_ex` | `Context::query_gid` of its RoCE v2 GID (the topology's GID index) |
//!
//! ```sh
//! cargo bench --bench devices       # on any host (the queries need a device)
//! scripts/bench -- devices/         # in the Soft-RoCE VM, results in target/criterion
//! ```
//! Without a device it measures listing devices only and prints one line saying so; under
//! `RDMA_TEST_REQUIRE_DEVICE=1` (set in the VM) a missing device fails.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use rdma_verbs::{Context, DeviceList};

fn device_layer(c: &mut Criterion) {
    let mut g = c.benchmark_group("devices");
    g.sample_size(20).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    g.bench_function("ibv_get_device_list+free", |b| {
        b.iter(|| black_box(DeviceList::available().expect("ibv_get_device_list").len()))
    });
    let Some(topo) = common::topology("devices", "port and GID queries") else { return };
    let ctx = Context::open(&topo.server.device).unwrap_or_else(|e| panic!("opening {}: {e}", topo.server.device));
    g.bench_function("ibv_query_port", |b| b.iter(|| black_box(ctx.query_port(topo.port).expect("ibv_query_port"))));
    g.bench_function("ibv_query_gid_ex", |b| {
        b.iter(|| black_box(ctx.query_gid(topo.port, topo.gid_index).expect("ibv_query_gid_ex")))
    });
    g.finish();
}

criterion_group!(benches, device_layer);
criterion_main!(benches);
