//! The whole-file digest a session uses: which capability bit names which algorithm, how many
//! bytes its FIN carries, and how the receiver picks one of those the sender offers.
//!
//! The sender offers every digest it can compute; the receiver picks one and grants only its
//! bit, so a GRANT names exactly one. A receiver or sender from before [`Digest::Xxh64`]
//! knows only XXH3-128 and goes on using it. Which one is faster depends on the CPU: measured
//! in the project's VM (QEMU TCG), XXH64 hashed 2.0-2.9 GB/s and XXH3-128 0.58-0.65 GB/s;
//! natively on the same host XXH3-128 ran 15-20 GB/s and XXH64 10-12 GB/s
//! (`docs/protocol.md`, "Integrity").

use crate::wire::caps;

/// A whole-file digest: what the sender's FIN carries and the receiver compares. Neither is
/// cryptographic; both catch accidents (a bug, a late or misplaced WRITE, a torn copy), and
/// a shared secret ([`crate::auth`]) is what keeps a hostile peer out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Digest {
    /// XXH3-128 ([`caps::DIGEST_XXH3_128`]), 16 bytes big-endian: every version of the
    /// protocol knows it.
    #[default]
    Xxh3_128,
    /// XXH64 with seed 0 ([`caps::DIGEST_XXH64`]), 8 bytes big-endian: scalar 64-bit
    /// arithmetic, the faster of the two where SIMD is emulated.
    Xxh64,
}

impl Digest {
    /// Every digest this version implements, the receiver's fallback order last.
    pub const ALL: [Digest; 2] = [Digest::Xxh64, Digest::Xxh3_128];

    /// The capability bit that offers or grants it.
    pub const fn cap(self) -> u32 {
        match self {
            Digest::Xxh3_128 => caps::DIGEST_XXH3_128,
            Digest::Xxh64 => caps::DIGEST_XXH64,
        }
    }

    /// Bytes of the digest a FIN carries.
    pub const fn size(self) -> usize {
        match self {
            Digest::Xxh3_128 => 16,
            Digest::Xxh64 => 8,
        }
    }

    /// Its name, as the command line spells it (`xxh3-128`, `xxh64`).
    pub const fn name(self) -> &'static str {
        match self {
            Digest::Xxh3_128 => "xxh3-128",
            Digest::Xxh64 => "xxh64",
        }
    }

    /// The digest a receiver grants for a HELLO's capabilities: `preferred` if the sender
    /// offers it, else the first of [`ALL`](Self::ALL) it offers; `None` when it offers none
    /// this version knows (the HELLO is then refused).
    pub fn choose(offered: u32, preferred: Digest) -> Option<Digest> {
        if offered & preferred.cap() != 0 {
            return Some(preferred);
        }
        Digest::ALL.into_iter().find(|d| offered & d.cap() != 0)
    }

    /// The digest a GRANT names: `None` unless exactly one digest bit this version knows is
    /// set.
    pub fn granted(caps: u32) -> Option<Digest> {
        let mut set = Digest::ALL.into_iter().filter(|d| caps & d.cap() != 0);
        match (set.next(), set.next()) {
            (Some(d), None) => Some(d),
            _ => None,
        }
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Digest {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown digest {s:?}: xxh3-128 or xxh64"))
    }
}

/// Every digest bit this version knows.
pub const DIGEST_CAPS: u32 = caps::DIGEST_XXH3_128 | caps::DIGEST_XXH64;
