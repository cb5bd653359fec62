//! The whole-file digest a session uses: which capability bit names which algorithm, how many
//! bytes its FIN carries, and how the receiver picks one of those the sender offers.
//!
//! The sender offers every digest it can compute; the receiver picks one and grants only its
//! bit, so a GRANT names exactly one. A receiver or sender from before [`Digest::Xxh64`]
//! knows only XXH3-128 and goes on using it. Which one is faster depends on the CPU: measured
//! in the project's VM (QEMU TCG), XXH64 hashed 2.0-2.9 GB/s and XXH3-128 0.58-0.65 GB/s;
//! natively on the same host XXH3-128 ran 15-20 GB/s and XXH64 10-12 GB/s
//! ([`docs/protocol.md`, "Integrity"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#integrity)).

use crate::wire::caps;

/// A whole-file digest: what the sender's FIN carries and the receiver compares. XXH3-128 and
/// XXH64 are not cryptographic: they catch accidents (a bug, a late or misplaced WRITE, a torn
/// copy). With a shared secret ([`crate::auth`]) the session uses [`Digest::Blake3Keyed`],
/// keyed from the secret, so that a change of the data on the path fails the verdict too.
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
    /// BLAKE3 in keyed mode ([`caps::DIGEST_BLAKE3`]), 32 bytes, keyed with the file's
    /// [`DigestKey`]: derived from the shared secret, both nonces of the session and the
    /// entry's index ([`crate::auth`]). Only a session whose sides proved a secret uses it, and
    /// such a session uses nothing else: a receiver with a secret grants only it, and a sender
    /// with a secret takes no other grant (so nobody on the path can strip the offer).
    Blake3Keyed,
}

impl Digest {
    /// Every digest this version implements, the receiver's fallback order last (the keyed one
    /// is never a fallback: it is chosen by the secret, not by the offer).
    pub const ALL: [Digest; 3] = [Digest::Xxh64, Digest::Xxh3_128, Digest::Blake3Keyed];

    /// The capability bit that offers or grants it.
    pub const fn cap(self) -> u32 {
        match self {
            Digest::Xxh3_128 => caps::DIGEST_XXH3_128,
            Digest::Xxh64 => caps::DIGEST_XXH64,
            Digest::Blake3Keyed => caps::DIGEST_BLAKE3,
        }
    }

    /// Bytes of the digest a FIN carries.
    pub const fn size(self) -> usize {
        match self {
            Digest::Xxh3_128 => 16,
            Digest::Xxh64 => 8,
            Digest::Blake3Keyed => 32,
        }
    }

    /// Its name, as the command line spells it (`xxh3-128`, `xxh64`, `blake3-keyed`).
    pub const fn name(self) -> &'static str {
        match self {
            Digest::Xxh3_128 => "xxh3-128",
            Digest::Xxh64 => "xxh64",
            Digest::Blake3Keyed => "blake3-keyed",
        }
    }

    /// Whether it is keyed (needs a [`DigestKey`], so a shared secret).
    pub const fn is_keyed(self) -> bool {
        matches!(self, Digest::Blake3Keyed)
    }

    /// The digest a receiver grants for a HELLO's capabilities. With a secret (`keyed`):
    /// [`Digest::Blake3Keyed`] if the sender offers it, else `None`. Without: `preferred` if the
    /// sender offers it and it is not keyed, else the first unkeyed one of
    /// [`ALL`](Self::ALL) it offers; `None` when it offers none this version knows. A HELLO
    /// with `None` is refused.
    pub fn choose(offered: u32, preferred: Digest, keyed: bool) -> Option<Digest> {
        if keyed {
            return (offered & caps::DIGEST_BLAKE3 != 0).then_some(Digest::Blake3Keyed);
        }
        let unkeyed = |d: &Digest| !d.is_keyed() && offered & d.cap() != 0;
        if unkeyed(&preferred) {
            return Some(preferred);
        }
        Digest::ALL.into_iter().find(unkeyed)
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

/// The key of one file's [`Digest::Blake3Keyed`]: 32 bytes derived from the session's shared
/// secret, both nonces and the file's index in the session ([`crate::auth`]), so that no key
/// serves two files or two sessions. Given by the machines
/// ([`Sender::digest_key`](crate::sender::Sender::digest_key),
/// [`Receiver::digest_key`](crate::receiver::Receiver::digest_key)) once both sides proved the
/// secret. Its bytes are never shown (`Debug` prints nothing of them).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DigestKey(pub(crate) [u8; 32]);

impl DigestKey {
    /// The key's bytes, for the hasher (`blake3::Hasher::new_keyed`).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for DigestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DigestKey(..)")
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
            .filter(|d| !d.is_keyed())
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown digest {s:?}: xxh3-128 or xxh64 (blake3-keyed comes with a secret)"))
    }
}

/// Every unkeyed digest bit this version knows (what any sender offers; one with a secret
/// offers [`caps::DIGEST_BLAKE3`] too).
pub const DIGEST_CAPS: u32 = caps::DIGEST_XXH3_128 | caps::DIGEST_XXH64;
