//! Sealed control messages ([`caps::SEALED`](crate::wire::caps::SEALED)): with a shared
//! secret, every control message after the sender's PROOF ends with a tag that only the two
//! peers can compute.
//!
//! ```text
//! tag = HMAC-SHA256(direction key, number || message without its tag)[..16]
//! direction key = HMAC-SHA256(digest secret, "rdcp seal v1 sender" | "rdcp seal v1 receiver")
//! ```
//!
//! The digest secret is the session's ([`crate::auth`]: from the secret and both nonces), so
//! keys are fresh per session. `number` counts the sealed messages of one direction from 0
//! (a `u64`, big-endian): control messages travel in order over one reliable connection, so
//! a message dropped, repeated, reordered or taken from another session or direction fails
//! its tag. The header's length covers the tag, so the message cannot be cut or extended
//! either. What the proofs and the keyed digest leave open is closed with it: the fields of
//! an ENTRY (path, mode, time), END, READY, CREDIT, and the verdict of every ACK.
//!
//! Before the proofs nothing can be sealed: a receiver that refuses a HELLO or a wrong proof
//! answers with a plain ACK. A sender takes such an ACK, after its proof, only as a failure
//! (`Sender::handle`), never as a success.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::auth::Role;
use crate::wire::{self, Header, Message, WireError, HEADER_LEN, TAG_LEN};

/// One direction of a session's sealed messages: its key, and the number of the next message.
pub(crate) struct Seal {
    key: [u8; 32],
    next: u64,
}

/// Both directions of a session with a secret, as one side sees them.
#[derive(Debug)]
pub(crate) struct Seals {
    /// The messages this side sends.
    pub(crate) outgoing: Seal,
    /// The messages its peer sends.
    pub(crate) incoming: Seal,
}

impl Seals {
    /// The seals of `own`'s side of the session whose digest secret is `digest_secret`.
    pub(crate) fn new(digest_secret: &[u8; 32], own: Role) -> Self {
        let peer = match own {
            Role::Sender => Role::Receiver,
            Role::Receiver => Role::Sender,
        };
        Seals { outgoing: Seal::new(digest_secret, own), incoming: Seal::new(digest_secret, peer) }
    }
}

/// Why a sealed message was not opened.
#[derive(Debug)]
pub(crate) enum Unsealed {
    /// Its tag is missing or wrong: changed on the path, or not from the peer that proved the
    /// secret.
    Tag,
    /// The tag is right but the message does not decode (a peer's bug).
    Wire(WireError),
}

impl Seal {
    /// The messages `from` sends in the session whose digest secret is `digest_secret`
    /// ([`crate::auth::Secret::digest_secret`]).
    pub(crate) fn new(digest_secret: &[u8; 32], from: Role) -> Self {
        let mut m = hmac(digest_secret);
        m.update(match from {
            Role::Sender => b"rdcp seal v1 sender",
            Role::Receiver => b"rdcp seal v1 receiver",
        });
        Seal { key: m.finalize().into_bytes().into(), next: 0 }
    }

    /// Seals the encoded message in `frame` (as `wire::encode` wrote it): its length grows by
    /// [`TAG_LEN`] and the tag is appended.
    pub(crate) fn seal(&mut self, frame: &mut Vec<u8>) {
        let len = frame.len() + TAG_LEN;
        frame[8..12].copy_from_slice(&(len as u32).to_be_bytes());
        let tag = self.mac(frame).finalize().into_bytes();
        frame.extend_from_slice(&tag[..TAG_LEN]);
        self.next += 1;
    }

    /// Checks the tag of the message at the start of `buf` (padding after it is ignored) and
    /// decodes it. The message's number is used up only when its tag is right.
    pub(crate) fn open(&mut self, buf: &[u8]) -> Result<(Header, Message), Unsealed> {
        let h = wire::decode_header(buf).map_err(Unsealed::Wire)?;
        let len = h.len as usize;
        if len < HEADER_LEN + TAG_LEN {
            return Err(Unsealed::Tag);
        }
        let (message, tag) = buf[..len].split_at(len - TAG_LEN);
        self.mac(message).verify_truncated_left(tag).map_err(|_| Unsealed::Tag)?;
        self.next += 1;
        wire::decode_sealed(buf).map_err(Unsealed::Wire)
    }

    fn mac(&self, message: &[u8]) -> Hmac<Sha256> {
        let mut m = hmac(&self.key);
        m.update(&self.next.to_be_bytes());
        m.update(message);
        m
    }
}

/// The key is never shown: only the number of the next message.
impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seal").field("next", &self.next).finish_non_exhaustive()
    }
}

fn hmac(key: &[u8; 32]) -> Hmac<Sha256> {
    <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::Status;
    use crate::wire::{Ack, End, Message};

    fn sealed(s: &mut Seal, m: &Message) -> Vec<u8> {
        let mut b = Vec::new();
        wire::encode(7, m, &mut b).unwrap();
        s.seal(&mut b);
        b
    }

    fn ack(status: Status) -> Message {
        Message::Ack(Ack { status, received: 10, detail: String::new(), retry_after_ms: 0 })
    }

    #[test]
    fn a_sealed_message_opens_once_in_its_place_and_direction_only() {
        let secret = [5; 32];
        let (mut tx, mut rx) = (Seal::new(&secret, Role::Receiver), Seal::new(&secret, Role::Receiver));
        let first = sealed(&mut tx, &ack(Status::Ok));
        let mut padded = first.clone();
        padded.extend_from_slice(&[0; 40]);
        assert_eq!(rx.open(&padded).unwrap().1, ack(Status::Ok), "padding after it is ignored");
        assert!(matches!(rx.open(&first), Err(Unsealed::Tag)), "a replay fails: its number is used");
        let second = sealed(&mut tx, &Message::End(End { entries: 3 }));
        assert_eq!(rx.open(&second).unwrap().1, Message::End(End { entries: 3 }));

        // The other direction's key, another session's secret: refused.
        let mut other = Seal::new(&secret, Role::Sender);
        assert!(matches!(
            other.open(&sealed(&mut Seal::new(&secret, Role::Receiver), &ack(Status::Ok))),
            Err(Unsealed::Tag)
        ));
        let mut elsewhere = Seal::new(&[6; 32], Role::Receiver);
        let m = sealed(&mut Seal::new(&secret, Role::Receiver), &ack(Status::Ok));
        assert!(matches!(elsewhere.open(&m), Err(Unsealed::Tag)));
    }

    #[test]
    fn any_changed_cut_or_plain_message_fails() {
        let secret = [9; 32];
        let m = sealed(&mut Seal::new(&secret, Role::Receiver), &ack(Status::ChecksumMismatch));
        for at in HEADER_LEN..m.len() {
            let mut bad = m.clone();
            bad[at] ^= 1;
            assert!(Seal::new(&secret, Role::Receiver).open(&bad).is_err(), "byte {at} changed");
        }
        // The status turned into Ok: the forgery the tag is for.
        let mut forged = m.clone();
        forged[20..22].copy_from_slice(&Status::Ok.code().to_be_bytes());
        assert!(matches!(Seal::new(&secret, Role::Receiver).open(&forged), Err(Unsealed::Tag)));
        // Cut to a shorter length (the header's length rewritten to match).
        let mut cut = m[..m.len() - 1].to_vec();
        let len = cut.len() as u32;
        cut[8..12].copy_from_slice(&len.to_be_bytes());
        assert!(matches!(Seal::new(&secret, Role::Receiver).open(&cut), Err(Unsealed::Tag)));
        // A plain (unsealed) message, as a receiver that never proved the secret sends.
        let mut plain = Vec::new();
        wire::encode(7, &ack(Status::Ok), &mut plain).unwrap();
        assert!(Seal::new(&secret, Role::Receiver).open(&plain).is_err());
        // The longest message, sealed, stays within the limit.
        let e = Message::Entry(wire::Entry {
            index: 0,
            kind: wire::EntryKind::File,
            flags: 0,
            mode: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            size: 0,
            resume: 0,
            path: "a/".repeat(wire::MAX_PATH_LEN / 2),
        });
        let long = sealed(&mut Seal::new(&secret, Role::Sender), &e);
        assert!(long.len() <= wire::MAX_MESSAGE_LEN, "{} bytes", long.len());
        assert_eq!(Seal::new(&secret, Role::Sender).open(&long).unwrap().1, e);
    }
}
