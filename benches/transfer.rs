//! The file transfer (`rdma_proto::driver`): one 64 MiB file, sender and receiver in one process.
//!
//! | benchmark | what one iteration is |
//! |---|---|
//! | `transfer/send_file/64MiB` | `send_file` of a 64 MiB file from the topology's client address to a `Server` on its server address (port 7472): connect, HELLO/GRANT, every chunk read into a slot and RDMA-WRITten (1 MiB chunks, 4 in flight: `SendOptions`' defaults), FIN, the receiver's digest check and ACK, disconnect |
//!
//! The receiver runs `Server::serve` on a thread of this process with `dir: None`: it checks
//! each chunk into the whole-file digest and discards the data (as `rdma-copy recv --discard`),
//! so no disk write is measured. The file is written once to the temporary directory (the
//! guest's tmpfs in the VM) and read from the page cache. Throughput is in bytes of the file.
//!
//! ```sh
//! scripts/bench -- transfer         # in the Soft-RoCE VM, results in target/criterion
//! cargo bench --bench transfer      # on a host with RDMA devices (RDMA_TEST_* picks them)
//! ```
//! Without a device it prints one line and measures nothing; under `RDMA_TEST_REQUIRE_DEVICE=1`
//! (set in the VM) a missing device fails.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use rdma_proto::driver::{send_file, ReceiveOptions, ReceiveReport, SendOptions, Server};

const SIZE: usize = 64 << 20;
/// The receiver's port (fixed, so a capture can name it).
const PORT: u16 = 7472;

/// A file removed when dropped (also when a benchmark panics).
struct TempFile(PathBuf);

impl TempFile {
    /// `len` bytes (a multiple of 1 MiB): one MiB of a pseudo-random pattern, repeated.
    fn new(len: usize) -> Self {
        let path = std::env::temp_dir().join(format!("rdma-bench-transfer-{}.bin", std::process::id()));
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mib: Vec<u8> = (0..(1 << 20) / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
            for _ in 0..len >> 20 {
                f.write_all(&mib)?;
            }
            f.into_inner()?.sync_all()
        };
        write().unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn transfer(c: &mut Criterion) {
    let Some(topo) = common::topology("transfer", "the file transfer") else { return };
    let listen = SocketAddr::new(topo.server.addr.into(), PORT);
    let opts = ReceiveOptions::default(); // dir None: checked in memory, not stored
    let stop = opts.stop.clone();
    let server = Server::bind(listen, opts).unwrap_or_else(|e| panic!("listening on {listen}: {e}"));
    let mut send = SendOptions::new(listen);
    send.from = Some(SocketAddr::new(topo.client.addr.into(), 0));
    let (sessions, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s2, f2) = (sessions.clone(), failed.clone());
    let report = move |r: ReceiveReport| {
        s2.fetch_add(1, Ordering::Relaxed);
        if r.result.is_err() {
            eprintln!("transfer: the receiver's session failed: {:?}", r.result);
            f2.fetch_add(1, Ordering::Relaxed);
        }
    };
    let sent = std::thread::scope(|s| {
        let serving = s.spawn(|| server.serve(None, report));
        // Stops the server even if a send panics (the stop flag wakes its accept loop).
        struct Stop(rdma_proto::driver::Flag);
        impl Drop for Stop {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        let stop = Stop(stop);

        let mut g = c.benchmark_group("transfer");
        g.sample_size(10).sampling_mode(SamplingMode::Flat);
        g.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(10));
        g.throughput(Throughput::Bytes(SIZE as u64));
        let mut file = None;
        let mut sent = 0usize;
        g.bench_function(BenchmarkId::new("send_file", common::size_name(SIZE)), |b| {
            let file: &TempFile = file.get_or_insert_with(|| TempFile::new(SIZE));
            b.iter(|| {
                let r = send_file(&file.0, &send, |_, _| ()).unwrap_or_else(|e| panic!("send_file: {e}"));
                assert_eq!(r.bytes, SIZE as u64);
                sent += 1;
            })
        });
        g.finish();
        drop(stop);
        serving.join().expect("the server thread panicked").expect("serving");
        sent
    });
    assert_eq!(failed.load(Ordering::Relaxed), 0, "a receiver session failed");
    assert_eq!(sessions.load(Ordering::Relaxed), sent, "files sent and sessions reported differ");
}

criterion_group!(benches, transfer);
criterion_main!(benches);
