//! The control plane's wire codec (`rdma_proto::wire`): encoding and decoding each message kind.
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `wire_encode/KIND` | `wire::encode` of one HELLO, GRANT, CREDIT, FIN or ACK into a reused `Vec` (no allocation once it has grown) |
//! | `wire_decode/KIND` | `wire::decode` of the same bytes (HELLO, FIN and ACK allocate their name, digest or detail) |
//!
//! Throughput is in bytes of the encoded message (header included). No device is needed:
//!
//! ```sh
//! cargo bench --bench codec                # on any host; results in target/criterion
//! cargo bench --bench codec -- wire_decode # one group
//! ```

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma_proto::wire::{self, caps, Ack, Credit, Fin, Grant, Hello, Message};
use rdma_proto::Status;

/// One message of each kind, with the field values a real session sends.
fn messages() -> Vec<(&'static str, Message)> {
    vec![
        (
            "HELLO",
            Message::Hello(Hello {
                version_min: 1,
                version_max: 1,
                caps: caps::DIGEST_XXH3_128,
                size: 256 << 20,
                chunk: 1 << 20,
                depth: 16,
                name: "backup-2024-11-21.tar.zst".into(),
                resume: None,
                lanes: 1,
            }),
        ),
        (
            "GRANT",
            Message::Grant(Grant {
                version: 1,
                caps: caps::DIGEST_XXH3_128,
                addr: 0x7f3a_2c00_0000,
                rkey: 0x1234,
                slot_size: 1 << 20,
                slot_count: 16,
                resume_from: 0,
                lanes: None,
            }),
        ),
        ("CREDIT", Message::Credit(Credit { consumed: 4242 })),
        ("FIN", Message::Fin(Fin { chunks: 256, size: 256 << 20, digest: vec![0xa5; wire::DIGEST_LEN] })),
        (
            "ACK",
            Message::Ack(Ack { status: Status::Ok, received: 256 << 20, detail: String::new(), retry_after_ms: 0 }),
        ),
    ]
}

fn codec(c: &mut Criterion) {
    const SESSION: u64 = 0x0123_4567_89ab_cdef;
    let msgs = messages();
    let mut g = c.benchmark_group("wire_encode");
    g.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    let mut out = Vec::with_capacity(wire::MAX_MESSAGE_LEN);
    for (kind, msg) in &msgs {
        wire::encode(SESSION, msg, &mut out).expect("a valid message");
        g.throughput(Throughput::Bytes(out.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(kind), msg, |b, msg| {
            b.iter(|| wire::encode(black_box(SESSION), black_box(msg), &mut out).expect("a valid message"))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("wire_decode");
    g.sample_size(30).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for (kind, msg) in &msgs {
        let mut bytes = Vec::new();
        wire::encode(SESSION, msg, &mut bytes).expect("a valid message");
        assert_eq!(wire::decode(&bytes).expect("decodes").1, *msg, "{kind} round trip");
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(kind), &bytes, |b, bytes| {
            b.iter(|| wire::decode(black_box(bytes)).expect("decodes"))
        });
    }
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
