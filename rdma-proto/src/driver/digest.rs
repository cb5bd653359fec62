//! Computing the session's whole-file digest ([`Digest`]), and which one is faster on this CPU.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::Xxh3;
use xxhash_rust::xxh64::Xxh64;

use crate::digest::DigestKey;
use crate::Digest;

/// A running digest of one file: reset for each file with the digest its session uses (and
/// its key, when keyed).
pub(crate) enum Hasher {
    Xxh3_128(Box<Xxh3>),
    Xxh64(Xxh64),
    Blake3(Box<blake3::Hasher>),
}

impl Hasher {
    /// A digest of `digest`, keyed with `key` when it is keyed. A keyed digest without a key
    /// fails closed: it is keyed with random bytes, so that its digest matches no one's (the
    /// machines give a key whenever they choose a keyed digest; a driver that asked before
    /// the proofs would otherwise compute what anyone on the path can).
    pub(crate) fn new(digest: Digest, key: Option<&DigestKey>) -> Self {
        match (digest, key) {
            (Digest::Xxh64, _) => Hasher::Xxh64(Xxh64::new(0)),
            (Digest::Blake3Keyed, Some(k)) => Hasher::Blake3(Box::new(blake3::Hasher::new_keyed(k.as_bytes()))),
            (Digest::Blake3Keyed, None) => {
                Hasher::Blake3(Box::new(blake3::Hasher::new_keyed(&super::random_bytes::<32>())))
            }
            _ => Hasher::Xxh3_128(Box::new(Xxh3::new())),
        }
    }

    /// `digest` as someone without the secret computes it: a keyed digest is plain BLAKE3.
    /// The test forger's (`SendOptions::test_tamper`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn without_key(digest: Digest) -> Self {
        match digest {
            Digest::Blake3Keyed => Hasher::Blake3(Box::new(blake3::Hasher::new())),
            d => Hasher::new(d, None),
        }
    }

    /// Starts over, with `digest` (and `key`, see [`new`](Self::new)).
    pub(crate) fn reset(&mut self, digest: Digest, key: Option<&DigestKey>) {
        match (digest, &mut *self) {
            (Digest::Xxh3_128, Hasher::Xxh3_128(h)) => h.reset(),
            (Digest::Xxh64, Hasher::Xxh64(h)) => h.reset(0),
            (d, _) => *self = Hasher::new(d, key),
        }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Xxh3_128(h) => h.update(bytes),
            Hasher::Xxh64(h) => h.update(bytes),
            Hasher::Blake3(h) => {
                h.update(bytes);
            }
        }
    }

    /// The digest so far, big-endian, as a FIN carries it ([`Digest::size`] bytes).
    pub(crate) fn finish(&self) -> Vec<u8> {
        match self {
            Hasher::Xxh3_128(h) => h.digest128().to_be_bytes().to_vec(),
            Hasher::Xxh64(h) => h.digest().to_be_bytes().to_vec(),
            Hasher::Blake3(h) => h.finalize().as_bytes().to_vec(),
        }
    }
}

/// The digest that hashes fastest on this CPU, measured once per process (about 1 MiB of
/// each, a few milliseconds under emulation, well under one natively).
///
/// Which one wins depends on the machine, by a wide margin either way: XXH3-128 is built on
/// SIMD and XXH64 on scalar 64-bit multiplies. In the project's QEMU TCG guest XXH64 hashed
/// 2.0-2.9 GB/s and XXH3-128 0.58-0.65 GB/s; natively on the same host XXH3-128 ran 15-20 GB/s
/// and XXH64 10-12 GB/s ([`docs/protocol.md`, "Integrity"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#integrity)).
pub fn fastest_digest() -> Digest {
    static FASTEST: OnceLock<Digest> = OnceLock::new();
    *FASTEST.get_or_init(|| {
        let buf: Vec<u8> = (0..256 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let time = |d: Digest| {
            let mut best = Duration::MAX;
            for _ in 0..4 {
                let t = Instant::now();
                let mut h = Hasher::new(d, None);
                h.update(std::hint::black_box(&buf));
                std::hint::black_box(h.finish());
                best = best.min(t.elapsed());
            }
            best
        };
        let (xxh3, xxh64) = (time(Digest::Xxh3_128), time(Digest::Xxh64));
        let fastest = if xxh64 < xxh3 { Digest::Xxh64 } else { Digest::Xxh3_128 };
        tracing::debug!(?xxh3, ?xxh64, %fastest, "digest speed on this CPU (256 KiB)");
        fastest
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_digest_is_the_published_algorithm_big_endian() {
        let data = b"rdma-copy";
        let mut h = Hasher::new(Digest::Xxh64, None);
        h.update(&data[..4]);
        h.update(&data[4..]);
        assert_eq!(h.finish(), xxhash_rust::xxh64::xxh64(data, 0).to_be_bytes());
        h.reset(Digest::Xxh3_128, None);
        h.update(data);
        assert_eq!(h.finish(), xxhash_rust::xxh3::xxh3_128(data).to_be_bytes());
        let key = DigestKey([9; 32]);
        h.reset(Digest::Blake3Keyed, Some(&key));
        h.update(data);
        assert_eq!(h.finish(), blake3::keyed_hash(&[9; 32], data).as_bytes());
        h.reset(Digest::Blake3Keyed, Some(&DigestKey([8; 32])));
        h.update(data);
        assert_ne!(h.finish(), blake3::keyed_hash(&[9; 32], data).as_bytes(), "another key, another digest");
        for d in Digest::ALL {
            assert_eq!(Hasher::new(d, Some(&key)).finish().len(), d.size(), "{d}");
        }
        // Keyed but without a key: fails closed, neither plain BLAKE3 nor the same twice.
        let unkeyed = || {
            let mut h = Hasher::new(Digest::Blake3Keyed, None);
            h.update(data);
            h.finish()
        };
        assert_ne!(unkeyed(), blake3::hash(data).as_bytes(), "not what anyone can compute");
        assert_ne!(unkeyed(), unkeyed());
    }
}
