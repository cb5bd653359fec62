//! What a whole-file digest costs here, against a plain copy: the measurement behind
//! rdma-copy's choice of XXH3-128 over BLAKE3 (`docs/protocol.md`). Run it where the transfer runs (in the VM:
//! `scripts/softroce run -- target/release/examples/digest-cost`).
//!
//! Prints MB/s (10^6 bytes) over 1 MiB buffers for: memcpy, BLAKE3 plain and keyed (its SIMD
//! as detected), HMAC-SHA256 (the keyed digests a session with a secret could use), XXH3-128
//! and XXH64 (not cryptographic), and which of the two the receiver picks here. With
//! `floor BYTES CHUNK`, runs the receiver's floor instead (see `floor`).

use std::hint::black_box;
use std::time::Instant;

fn rate(name: &str, bytes: usize, mut f: impl FnMut()) {
    f(); // warm-up
    let rounds = 64;
    let t = Instant::now();
    for _ in 0..rounds {
        f();
    }
    let s = t.elapsed().as_secs_f64();
    println!("{name:>12}: {:8.1} MB/s", (bytes * rounds) as f64 / s / 1e6);
}

/// `digest-cost floor BYTES CHUNK`: the receiver's floor, the work no receiver of the file can
/// skip: a copy of each `CHUNK` bytes out of a (here: one) ring slot, and XXH64 over the copy,
/// for `BYTES` in all. Run under callgrind twice (two sizes), its marginal instructions per
/// byte are what `scripts/compare` holds the receiver's against.
fn floor(bytes: usize, chunk: usize) {
    let slot: Vec<u8> = (0..chunk).map(|i| (i * 31 % 251) as u8).collect();
    let mut copy = vec![0u8; chunk];
    let mut hasher = xxhash_rust::xxh64::Xxh64::new(0);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk);
        copy[..n].copy_from_slice(black_box(&slot[..n]));
        hasher.update(black_box(&copy[..n]));
        left -= n;
    }
    println!("floor: {bytes} bytes in chunks of {chunk}, xxh64 {:016x}", hasher.digest());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, bytes, chunk] = &args[..] {
        if mode == "floor" {
            match (bytes.parse(), chunk.parse()) {
                (Ok(bytes), Ok(chunk)) if chunk > 0 => return floor(bytes, chunk),
                _ => {}
            }
        }
        eprintln!("usage: digest-cost [floor BYTES CHUNK]");
        std::process::exit(2);
    }
    const LEN: usize = 1 << 20;
    let src: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; LEN];
    rate("memcpy", LEN, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    });
    rate("blake3", LEN, || {
        black_box(blake3::hash(black_box(&src)));
    });
    rate("blake3-keyed", LEN, || {
        black_box(blake3::keyed_hash(&[7; 32], black_box(&src)));
    });
    rate("hmac-sha256", LEN, || {
        use hmac::Mac;
        let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&[7; 32]).unwrap();
        m.update(black_box(&src));
        black_box(m.finalize().into_bytes());
    });
    rate("xxh3-128", LEN, || {
        black_box(xxhash_rust::xxh3::xxh3_128(black_box(&src)));
    });
    rate("xxh64", LEN, || {
        black_box(xxhash_rust::xxh64::xxh64(black_box(&src), 0));
    });
    println!("(rdma-copy's receiver picks {} here)", rdma_proto::driver::fastest_digest());
}
