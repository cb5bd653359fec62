//! Authorization by a shared secret: a challenge-response that proves each side knows the
//! secret without sending it (HMAC-SHA256), bound to the session and the file offered.
//!
//! ```text
//! sender                                   receiver (holds the secret)
//!   HELLO (caps AUTH)                 ──▶   no AUTH offered: ACK NotAuthorized
//!                                     ◀──  CHALLENGE (receiver nonce Nr)
//!   PROOF (Ns, MAC("sender", ...))    ──▶   wrong: ACK NotAuthorized (nothing opened yet)
//!                                     ◀──  PROOF (Nr, MAC("receiver", ...)), then GRANT
//!   checks the receiver's proof before it takes the GRANT: a receiver that cannot show it
//!   gets no data
//! ```
//!
//! `MAC(role, ...)` is HMAC-SHA256 keyed with the secret over a label naming the role, the
//! session id, both nonces, the file's size and its name: a proof answers one challenge of one
//! session for one file, and the two roles' proofs differ (neither side can reflect the other's).
//! Nonces are 16 random bytes from each side; the machines take them as inputs (they have no
//! randomness of their own).
//!
//! Once both proofs are exchanged each side also derives the session's digest secret
//! (`HMAC(secret, "rdcp digest v1" || session || Ns || Nr)`) and from it each file's
//! [`DigestKey`] (`HMAC(digest secret, "rdcp file" || index)`): the whole-file digest of a
//! session with a secret is BLAKE3 keyed with it ([`crate::Digest::Blake3Keyed`]), so that
//! data changed on the path fails the verdict.
//!
//! The secret is never sent, logged or printed: [`Secret`]'s `Debug` shows only its length.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::digest::DigestKey;

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// The fewest bytes a secret may have.
pub const MIN_SECRET_LEN: usize = 16;

/// A shared secret. Cheap to clone; its bytes are never shown (`Debug` prints the length).
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// A secret of `bytes` (surrounding whitespace, such as a file's final newline, removed).
    ///
    /// # Errors
    /// A sentence when fewer than [`MIN_SECRET_LEN`] bytes remain.
    pub fn new(bytes: &[u8]) -> Result<Self, String> {
        let trimmed = trim_ascii(bytes);
        if trimmed.len() < MIN_SECRET_LEN {
            return Err(format!(
                "a secret needs at least {MIN_SECRET_LEN} bytes, this one has {} (e.g. `head -c 32 /dev/urandom | base64`)",
                trimmed.len()
            ));
        }
        Ok(Secret(trimmed.into()))
    }

    /// The proof `role` gives for the session `t` describes: see the module's docs.
    pub(crate) fn proof(&self, role: Role, t: &Transcript<'_>) -> [u8; PROOF_LEN] {
        self.mac(role, t).finalize().into_bytes().into()
    }

    /// Whether `proof` is what `role` gives for the session `t` describes (compared in
    /// constant time).
    pub(crate) fn verify(&self, proof: &[u8], role: Role, t: &Transcript<'_>) -> bool {
        self.mac(role, t).verify_slice(proof).is_ok()
    }

    /// The key a receiver with this secret stores a resumable partial under, for the resume
    /// key `key` a sender offered: the first 8 bytes of HMAC-SHA256(secret, "rdcp resume v1" ||
    /// key). The names on disk (`.KEY.part.rdcp-tmp`) then tell a local user nothing a HELLO
    /// could use, and a key seen on the wire opens nothing without the secret.
    #[cfg(feature = "driver")]
    pub(crate) fn partial_key(&self, key: u64) -> u64 {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        m.update(b"rdcp resume v1");
        m.update(&key.to_be_bytes());
        let out = m.finalize().into_bytes();
        u64::from_be_bytes(out[..8].try_into().expect("32 bytes"))
    }

    /// A KNOCK's MAC ([`crate::wire::Knock`]) for the knock `id` made at `time` by a sender at
    /// `from` to a receiver listening at `to`: the first 16 bytes of HMAC-SHA256(secret, "rdcp
    /// knock v1" || id || time || from || to's address || to's port), each address as 16 bytes
    /// (an IPv4 address mapped). A knock therefore vouches only for a request from that
    /// address to that listener.
    pub(crate) fn knock_mac(
        &self,
        id: u64,
        time: u64,
        from: std::net::IpAddr,
        to: std::net::SocketAddr,
    ) -> [u8; crate::wire::KNOCK_MAC_LEN] {
        let out = self.knock(id, time, from, to).finalize().into_bytes();
        out[..crate::wire::KNOCK_MAC_LEN].try_into().expect("32 bytes")
    }

    /// Whether `mac` is the KNOCK MAC of `id`, `time`, `from` and `to` (compared in constant
    /// time).
    pub(crate) fn verify_knock(
        &self,
        mac: &[u8],
        id: u64,
        time: u64,
        from: std::net::IpAddr,
        to: std::net::SocketAddr,
    ) -> bool {
        self.knock(id, time, from, to).verify_truncated_left(mac).is_ok()
    }

    fn knock(&self, id: u64, time: u64, from: std::net::IpAddr, to: std::net::SocketAddr) -> Hmac<Sha256> {
        let octets = |ip: std::net::IpAddr| match ip.to_canonical() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        m.update(b"rdcp knock v1");
        m.update(&id.to_be_bytes());
        m.update(&time.to_be_bytes());
        m.update(&octets(from));
        m.update(&octets(to.ip()));
        m.update(&to.port().to_be_bytes());
        m
    }

    /// The session's digest secret, from which each file's [`DigestKey`] is derived
    /// ([`digest_key`]): HMAC-SHA256(secret, "rdcp digest v1" || session || Ns || Nr). Both
    /// sides compute it once the proofs are exchanged; it never crosses the wire.
    pub(crate) fn digest_secret(&self, t: &Transcript<'_>) -> [u8; 32] {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        m.update(b"rdcp digest v1");
        m.update(&t.session.to_be_bytes());
        m.update(t.sender_nonce);
        m.update(t.receiver_nonce);
        m.finalize().into_bytes().into()
    }

    fn mac(&self, role: Role, t: &Transcript<'_>) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        m.update(match role {
            Role::Sender => b"rdcp auth v1 sender",
            Role::Receiver => b"rdcp auth v1 receiver",
        });
        m.update(&t.session.to_be_bytes());
        m.update(t.sender_nonce);
        m.update(t.receiver_nonce);
        m.update(&t.size.to_be_bytes());
        m.update(t.name.as_bytes());
        m
    }
}

/// The key of the `index`th file's digest in a session whose digest secret is `secret`
/// ([`Secret::digest_secret`]; a single file is index 0): HMAC-SHA256(secret, "rdcp file" ||
/// index). A file's keyed digest then proves its own bytes only: swapping two files' data and
/// their FINs on the path fails both.
pub(crate) fn digest_key(secret: &[u8; 32], index: u32) -> DigestKey {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(b"rdcp file");
    m.update(&index.to_be_bytes());
    DigestKey(m.finalize().into_bytes().into())
}

/// The key of a prefix proof ([`caps::RESUME_PROOF`](crate::wire::caps::RESUME_PROOF)): BLAKE3
/// keyed with it over a file's first `from` bytes is what a sender shows to resume that file.
/// HMAC-SHA256(nonce, "rdcp prefix v1" || session || index), `nonce` the receiver's fresh one
/// (sent in the CHALLENGE): the key is not secret, it only makes each proof new, so that a proof
/// seen once (on the wire, or from an earlier session) proves nothing again. What the proof
/// shows is that the sender holds the bytes: nobody can compute it without them.
pub fn prefix_key(nonce: &[u8; NONCE_LEN], session: u64, index: u32) -> DigestKey {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(nonce).expect("HMAC takes a key of any length");
    m.update(b"rdcp prefix v1");
    m.update(&session.to_be_bytes());
    m.update(&index.to_be_bytes());
    DigestKey(m.finalize().into_bytes().into())
}

/// Whether `a` and `b` are equal, in time that depends on their length only (a proof compared
/// with the one expected tells nothing of where they differ).
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A session's digest secret ([`Secret::digest_secret`]) as a machine keeps it: its bytes are
/// never shown (`Debug` prints `DigestSecret(..)`), so that printing a machine shows no key.
#[derive(Clone, Copy)]
pub(crate) struct DigestSecret(pub(crate) [u8; 32]);

impl std::ops::Deref for DigestSecret {
    type Target = [u8; 32];
    fn deref(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for DigestSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestSecret(..)")
    }
}

/// What a proof covers: one session, both nonces, the file offered.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transcript<'a> {
    pub(crate) session: u64,
    pub(crate) sender_nonce: &'a [u8; NONCE_LEN],
    pub(crate) receiver_nonce: &'a [u8; NONCE_LEN],
    pub(crate) size: u64,
    pub(crate) name: &'a str,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// `bytes` without ASCII whitespace at either end (`<[u8]>::trim_ascii` is newer than the MSRV).
fn trim_ascii(mut bytes: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = bytes {
        if !first.is_ascii_whitespace() {
            break;
        }
        bytes = rest;
    }
    while let [rest @ .., last] = bytes {
        if !last.is_ascii_whitespace() {
            break;
        }
        bytes = rest;
    }
    bytes
}

/// Which side a proof is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Sender,
    Receiver,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "driver")]
    fn a_partial_s_key_needs_the_secret() {
        let (a, b) = (Secret::new(b"a secret of sixteen+").unwrap(), Secret::new(b"another of sixteen+").unwrap());
        assert_eq!(a.partial_key(7), a.partial_key(7), "the same key each session");
        assert_ne!(a.partial_key(7), 7, "not the key the HELLO carries");
        assert_ne!(a.partial_key(7), a.partial_key(8));
        assert_ne!(a.partial_key(7), b.partial_key(7), "another secret, another name on disk");
    }

    #[test]
    fn proofs_bind_role_session_nonces_and_file() {
        let s = Secret::new(b"0123456789abcdef0123\n").unwrap();
        let (ns, nr) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let t = Transcript { session: 7, sender_nonce: &ns, receiver_nonce: &nr, size: 10, name: "f" };
        let p = s.proof(Role::Sender, &t);
        assert!(s.verify(&p, Role::Sender, &t));
        assert!(!s.verify(&p, Role::Receiver, &t), "a proof cannot be reflected");
        assert!(!s.verify(&p, Role::Sender, &Transcript { session: 8, ..t }));
        assert!(!s.verify(&p, Role::Sender, &Transcript { sender_nonce: &nr, receiver_nonce: &ns, ..t }));
        assert!(!s.verify(&p, Role::Sender, &Transcript { size: 11, ..t }));
        assert!(!s.verify(&p, Role::Sender, &Transcript { name: "g", ..t }));
        assert!(!s.verify(&p[..31], Role::Sender, &t));
        let other = Secret::new(b"0123456789abcdef0124").unwrap();
        assert!(!other.verify(&p, Role::Sender, &t));
    }

    #[test]
    fn short_secrets_are_refused_and_none_is_shown() {
        assert!(Secret::new(b"  short\n").is_err());
        let s = Secret::new(b"a very secret value!").unwrap();
        assert_eq!(format!("{s:?}"), "Secret(20 bytes)");
    }
}
