//! The wire format of the control plane: every message the two sides send each other by
//! RDMA Send/Recv, and its codec.
//!
//! A message is a fixed [`Header`] of [`HEADER_LEN`] bytes followed by its body. All integers
//! are big-endian (network byte order). The header carries the message's total length, so a
//! message read from a zero-padded buffer (a receive slot, CM private data) is cut at its own
//! end. Decoding never panics: anything truncated, oversized, of an unknown kind or with
//! invalid fields is a [`WireError`]. The layout, field by field, is in [`docs/protocol.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md).
//!
//! # Compatibility
//! A later version appends fields to the end of a body and announces them with a capability
//! bit or a higher protocol version: a decoder reads the fields it knows and ignores the rest
//! of the body (within [`MAX_MESSAGE_LEN`]). New message kinds are sent only to a peer whose
//! version (negotiated by HELLO and GRANT) knows them.

use std::fmt;

use crate::status::Status;

/// The four bytes every message starts with.
pub const MAGIC: [u8; 4] = *b"RDCP";
/// The version of the framing (the header); a different value is refused outright.
pub const FRAME_VERSION: u8 = 1;
/// Bytes in the header.
pub const HEADER_LEN: usize = 20;
/// The largest message this version sends or accepts, header and [`TAG_LEN`] included: an
/// ENTRY with the longest path, sealed, fits.
pub const MAX_MESSAGE_LEN: usize = 1024 + TAG_LEN;
/// Bytes of the tag a sealed message ends with ([`caps::SEALED`], [`crate::seal`]).
pub const TAG_LEN: usize = 16;
/// The longest file name, in bytes of UTF-8 (as `NAME_MAX` on Linux).
pub const MAX_NAME_LEN: usize = 255;
/// The longest digest a FIN carries.
pub const MAX_DIGEST_LEN: usize = 64;
/// The longest relative path an ENTRY carries (what fits in one message after its fixed
/// fields).
pub const MAX_PATH_LEN: usize = 960;
/// The name a HELLO gives a batch (capability [`caps::BATCH`]): the destination itself.
pub const BATCH_NAME: &str = ".";
/// The longest detail text an ACK carries.
pub const MAX_DETAIL_LEN: usize = 512;
/// The most lanes (connections) one session is striped over ([`caps::LANES`]).
pub const MAX_LANES: u16 = 16;
/// Bytes of a session's lane token ([`Lanes::token`]).
pub const LANE_TOKEN_LEN: usize = 16;
/// Bytes of a LANE message (it must fit a connect request's 56 bytes of private data).
pub const LANE_LEN: usize = HEADER_LEN + 2 + LANE_TOKEN_LEN;
/// Bytes of a KNOCK's MAC ([`Knock::mac`]).
pub const KNOCK_MAC_LEN: usize = 16;
/// Bytes of a KNOCK message (it must fit a connect request's 56 bytes of private data).
pub const KNOCK_LEN: usize = HEADER_LEN + 8 + KNOCK_MAC_LEN;
/// Bytes of the version-1 digest (XXH3-128).
pub const DIGEST_LEN: usize = 16;
/// The protocol versions this implementation speaks.
pub const PROTOCOL_VERSIONS: std::ops::RangeInclusive<u16> = 1..=1;

/// Capability flags a HELLO offers and a GRANT accepts (the intersection is what the session
/// uses). Bits this version does not know are ignored, never refused.
pub mod caps {
    /// The whole-file digest is XXH3-128 ([`DIGEST_LEN`](super::DIGEST_LEN) bytes, big-endian).
    /// Required in version 1: measured in the VM, BLAKE3 hashed 38 MB/s, XXH3-128 441 MB/s,
    /// against a transfer of about 70 MB/s ([`docs/protocol.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md)).
    pub const DIGEST_XXH3_128: u32 = 1 << 0;
    /// The whole-file digest is BLAKE3 in keyed mode (32 bytes), keyed per file from the
    /// shared secret ([`crate::digest::Digest::Blake3Keyed`]). Offered, and granted, only with
    /// [`AUTH`]: a receiver with a secret grants nothing else, a sender with one takes nothing
    /// else. Measured in the VM it hashes about 35 MB/s (XXH64 1.3-2.5 GB/s), natively about
    /// 2.3-3.2 GB/s: the price of data that nobody on the path can change undetected.
    pub const DIGEST_BLAKE3: u32 = 1 << 1;
    /// The whole-file digest is XXH64 (seed 0, 8 bytes big-endian; [`crate::digest::Digest`]).
    /// A sender offers it with XXH3-128; the receiver grants one of them.
    pub const DIGEST_XXH64: u32 = 1 << 2;
    /// Resuming: the HELLO carries the file's resume key, the GRANT the bytes the receiver
    /// already holds of that version; only the rest is sent, and the digest covers every byte.
    pub const RESUME: u32 = 1 << 8;
    /// Many files and directories in one session (over one connection and one grant): the
    /// HELLO names the batch (`.`, the destination itself, with the batch's total bytes), then
    /// each file or directory is an ENTRY answered by READY or an ACK of its own, and END asks
    /// for the summary ACK. A receiver without it refuses the name `.` (`BadName`).
    pub const BATCH: u32 = 1 << 9;
    /// Both sides prove they know a shared secret (CHALLENGE and PROOF, [`crate::auth`]). A
    /// sender with a secret offers it; a receiver with one requires it.
    pub const AUTH: u32 = 1 << 10;
    /// Striping: a session's chunks spread over several connections (lanes). The HELLO
    /// appends the lanes wanted, the GRANT the lanes granted and the token each extra lane
    /// presents (a [`Lane`](super::Lane) message as its connect request's private data).
    pub const LANES: u32 = 1 << 11;
    /// Sealed messages: with [`AUTH`], every control message after the sender's PROOF, in
    /// both directions, ends with a [`TAG_LEN`](super::TAG_LEN)-byte tag keyed from the
    /// secret and numbered in its direction ([`crate::seal`]), so that no field of an ENTRY,
    /// END, READY, CREDIT or ACK can be changed, dropped, replayed or injected on the path.
    /// Offered, and granted, only with `AUTH`: a receiver with a secret refuses a sender that
    /// does not offer it, a sender with one refuses a grant without it.
    pub const SEALED: u32 = 1 << 12;
    /// Resuming with proof of the prefix: before a partial is continued, the sender proves it
    /// holds the bytes the receiver already stored. The receiver sends a CHALLENGE that names
    /// the entry and `from` ([`Challenge::prefix`](super::Challenge::prefix)) with a fresh
    /// nonce; the sender answers with a PROOF whose `mac` is BLAKE3 keyed with
    /// [`crate::auth::prefix_key`] over its first `from` bytes. A wrong proof gets the file
    /// from byte 0 in a new temporary, and the partial is left to its owner. A receiver
    /// resumes only for a sender that offers it with [`RESUME`]: an older sender's resume key
    /// is not enough to continue someone's partial.
    pub const RESUME_PROOF: u32 = 1 << 13;
    /// Cancelling: a sender whose send is cancelled tells the receiver with a CANCEL before it
    /// leaves, so that the receiver reports the transfer cancelled rather than its peer gone.
    /// Offered by every sender; a receiver that knows it grants it, and only then is CANCEL
    /// sent.
    pub const CANCEL: u32 = 1 << 14;
    /// Probes: the sender's connection takes the receiver's probes, zero-length RDMA WRITEs
    /// that make it acknowledge (or NAK) what the receiver sent before them
    /// (`rdma_verbs::SendQueue::probe`; its QP allows remote writes, and no region of it is
    /// remotely writable). Offered by a sender whose configuration says so
    /// (`SenderConfig::probes`; this crate's driver always does); a receiver probes only a
    /// sender that offered it, as one whose QP refuses remote writes would fail the
    /// connection on the first probe. Not echoed in the GRANT: the receiver's QP always takes
    /// WRITEs.
    pub const PROBES: u32 = 1 << 15;
    /// Every capability this version implements.
    pub const SUPPORTED: u32 = DIGEST_XXH3_128
        | DIGEST_XXH64
        | DIGEST_BLAKE3
        | AUTH
        | RESUME
        | BATCH
        | LANES
        | SEALED
        | RESUME_PROOF
        | CANCEL
        | PROBES;
}

/// What kind of message follows the header (`kind` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Sender to receiver: the file offered.
    Hello = 1,
    /// Receiver to sender: the slot ring granted.
    Grant = 2,
    /// Receiver to sender: how many chunks it has taken out of the ring.
    Credit = 3,
    /// Sender to receiver: every chunk was written; the digest.
    Fin = 4,
    /// Receiver to sender: the outcome.
    Ack = 5,
    /// Receiver to sender: prove you know the secret (capability [`caps::AUTH`]).
    Challenge = 6,
    /// Either way: a proof of the secret (capability [`caps::AUTH`]).
    Proof = 7,
    /// Sender to receiver, in a batch: the next file or directory ([`caps::BATCH`]).
    Entry = 8,
    /// Receiver to sender, in a batch: the entry's file is open; send its chunks.
    Ready = 9,
    /// Sender to receiver, in a batch: no more entries; the summary ACK is asked for.
    End = 10,
    /// Sender to receiver, as an extra lane's connect private data: the lane's number and
    /// the session's token ([`caps::LANES`]).
    Lane = 11,
    /// Sender to receiver, as a session's first connect request's private data: an early
    /// proof of the secret ([`Knock`]).
    Knock = 12,
    /// Sender to receiver: the send was cancelled; the sender leaves ([`caps::CANCEL`]).
    Cancel = 13,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Grant,
            3 => Kind::Credit,
            4 => Kind::Fin,
            5 => Kind::Ack,
            6 => Kind::Challenge,
            7 => Kind::Proof,
            8 => Kind::Entry,
            9 => Kind::Ready,
            10 => Kind::End,
            11 => Kind::Lane,
            12 => Kind::Knock,
            13 => Kind::Cancel,
            _ => return None,
        })
    }
}

/// The fixed part of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The message kind.
    pub kind: Kind,
    /// Total bytes of the message, header included.
    pub len: u32,
    /// The session the message belongs to (chosen by the sender, echoed by the receiver).
    pub session: u64,
}

/// HELLO: the sender offers one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Lowest protocol version the sender speaks.
    pub version_min: u16,
    /// Highest protocol version the sender speaks.
    pub version_max: u16,
    /// Capabilities offered ([`caps`]).
    pub caps: u32,
    /// File size in bytes.
    pub size: u64,
    /// Chunk size the sender wants (bytes per WRITE).
    pub chunk: u32,
    /// Chunks in flight the sender wants.
    pub depth: u32,
    /// The file's name: one path component (checked by [`crate::name::check`]).
    pub name: String,
    /// With [`caps::RESUME`]: the key of this version of the file (the sender's hash of its
    /// name, size and identity), which a receiver's partial of it carries. Appended after the
    /// name when present.
    pub resume: Option<u64>,
    /// With [`caps::LANES`]: the connections (lanes) the sender wants to stripe its chunks
    /// over, 1 when it does not stripe. On the wire only with `LANES` offered, after the
    /// resume key (then always there, 0 when none).
    pub lanes: u16,
}

/// GRANT: the receiver accepts, and lends its ring of slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The protocol version chosen (within the HELLO's range).
    pub version: u16,
    /// Capabilities the session uses (a subset of the HELLO's).
    pub caps: u32,
    /// Address of slot 0 in the receiver's registered ring.
    pub addr: u64,
    /// Remote key of the ring.
    pub rkey: u32,
    /// Bytes per slot: the chunk size of the session (at most the HELLO's).
    pub slot_size: u32,
    /// Slots in the ring. Chunk `n` goes to slot `n % slot_count`, written once the receiver's
    /// credit says chunk `n - slot_count` has left the slot.
    pub slot_count: u32,
    /// With [`caps::RESUME`]: the bytes the receiver already holds (a prefix of the file, from
    /// an earlier session). Chunk `n` then starts at `resume_from + n * slot_size`. Appended
    /// when not 0 (absent reads as 0).
    pub resume_from: u64,
    /// With [`caps::LANES`] granted: the lanes and their token (else `None`).
    pub lanes: Option<Lanes>,
}

/// The lanes a GRANT grants ([`caps::LANES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes {
    /// Connections the session's chunks are spread over, lane 0 (this connection) included:
    /// 2 ..= [`MAX_LANES`].
    pub count: u16,
    /// The session's token: each extra lane presents it ([`Lane`]), and the receiver takes
    /// only a lane whose token is a live session's.
    pub token: [u8; LANE_TOKEN_LEN],
}

/// LANE: an extra lane of a session, sent as its connect request's private data
/// ([`caps::LANES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    /// The lane's number, 1 ..= the lanes granted − 1 (lane 0 is the session's first
    /// connection).
    pub lane: u16,
    /// The token of the session's GRANT.
    pub token: [u8; LANE_TOKEN_LEN],
}

/// KNOCK: a sender with the secret proves it in its session's first connect request (its
/// private data), before any connection exists, so that a receiver whose places are all taken
/// by connections that proved nothing gives it one of theirs ([`docs/protocol.md`, "Threat
/// model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)). The header's session field is the knock's own random id, which a receiver takes
/// once. A receiver without a secret, or one that does not know KNOCK, serves the request as
/// one without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Knock {
    /// When the knock was made: seconds since the Unix epoch, by the sender's clock.
    pub time: u64,
    /// HMAC-SHA256(secret, "rdcp knock v1" || id || time), its first [`KNOCK_MAC_LEN`] bytes.
    pub mac: [u8; KNOCK_MAC_LEN],
}

/// CANCEL: the sender's send was cancelled and it leaves ([`caps::CANCEL`], sent only to a
/// receiver that granted it). No body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancel;

/// CREDIT: chunks `0..consumed` have left the ring (stored or checked): their slots may be
/// written again. Cumulative, so a repeated or late credit is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    /// Chunks taken out of the ring so far.
    pub consumed: u64,
}

/// FIN: the sender wrote every chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fin {
    /// Chunks written.
    pub chunks: u64,
    /// Bytes written.
    pub size: u64,
    /// The whole-file digest (XXH3-128: 16 bytes).
    pub digest: Vec<u8>,
}

/// ACK: the receiver's verdict, answering a HELLO (a refusal) or a FIN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The outcome.
    pub status: Status,
    /// Bytes the receiver stored.
    pub received: u64,
    /// A human-readable detail (may be empty).
    pub detail: String,
    /// With [`Status::Busy`]: how long the sender should wait before it asks again, in
    /// milliseconds (0: no hint). Appended after the detail only when not 0; a receiver that
    /// predates it sends none, and a sender that predates it ignores it.
    pub retry_after_ms: u32,
}

/// CHALLENGE: the receiver requires the shared secret; its nonce. With
/// [`caps::RESUME_PROOF`], also the challenge to prove a partial's prefix ([`prefix`](Self::prefix)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The receiver's nonce.
    pub nonce: [u8; crate::auth::NONCE_LEN],
    /// With [`caps::RESUME_PROOF`]: prove the first bytes of a file before they are resumed
    /// from. Appended after the nonce (`index`, then `from`) when present; a CHALLENGE of the
    /// secret has none.
    pub prefix: Option<PrefixClaim>,
}

/// What a prefix CHALLENGE asks the sender to prove it holds ([`caps::RESUME_PROOF`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixClaim {
    /// The entry (0 for a single file).
    pub index: u32,
    /// The bytes the receiver holds of it: the proof covers the file's first `from` bytes.
    pub from: u64,
}

/// PROOF: the sender's answer to a CHALLENGE, or the receiver's own proof before its GRANT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// The nonce of the side that proves (the sender's fresh one, or the receiver's echoed).
    pub nonce: [u8; crate::auth::NONCE_LEN],
    /// HMAC-SHA256 of the session ([`crate::auth`]).
    pub mac: [u8; crate::auth::PROOF_LEN],
}

/// What an ENTRY is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryKind {
    /// A regular file: its chunks follow a READY.
    File = 0,
    /// A directory: created (with its parents) and answered by an ACK at once.
    Directory = 1,
}

/// Bits of an ENTRY's `flags`.
pub mod entry_flags {
    /// Apply the entry's `mode` (permission bits) on the receiver.
    pub const MODE: u8 = 1 << 0;
    /// Apply the entry's modification time on the receiver.
    pub const MTIME: u8 = 1 << 1;
}

/// ENTRY: one file or directory of a batch, by its path relative to the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entry's number in the batch, from 0.
    pub index: u32,
    /// File or directory.
    pub kind: EntryKind,
    /// [`entry_flags`]: which of `mode` and `mtime` the receiver applies.
    pub flags: u8,
    /// Permission bits (`0o7777` at most; the receiver keeps `0o777` of them).
    pub mode: u32,
    /// Modification time: seconds since the epoch.
    pub mtime_sec: i64,
    /// Modification time: nanoseconds (below 1e9).
    pub mtime_nsec: u32,
    /// Bytes (0 for a directory).
    pub size: u64,
    /// The file version's resume key (capability `RESUME`); 0: none.
    pub resume: u64,
    /// `/`-separated relative path, each component a valid name, at most [`MAX_PATH_LEN`] bytes.
    pub path: String,
}

/// READY: the entry's file is open; chunk `n` is the bytes at `resume_from + n * slot_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// The entry it answers.
    pub index: u32,
    /// Bytes of this file the receiver already holds (capability `RESUME`).
    pub resume_from: u64,
}

/// END: the batch is over after `entries` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// ENTRY messages sent.
    pub entries: u32,
}

/// A decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Message {
    Hello(Hello),
    Grant(Grant),
    Credit(Credit),
    Fin(Fin),
    Ack(Ack),
    Challenge(Challenge),
    Proof(Proof),
    Entry(Entry),
    Ready(Ready),
    End(End),
    Lane(Lane),
    Knock(Knock),
    Cancel(Cancel),
}

impl Message {
    /// The message's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Grant(_) => Kind::Grant,
            Message::Credit(_) => Kind::Credit,
            Message::Fin(_) => Kind::Fin,
            Message::Ack(_) => Kind::Ack,
            Message::Challenge(_) => Kind::Challenge,
            Message::Proof(_) => Kind::Proof,
            Message::Entry(_) => Kind::Entry,
            Message::Ready(_) => Kind::Ready,
            Message::End(_) => Kind::End,
            Message::Lane(_) => Kind::Lane,
            Message::Knock(_) => Kind::Knock,
            Message::Cancel(_) => Kind::Cancel,
        }
    }
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the header, or than the header's length says.
    #[error("truncated message: {got} bytes, {need} needed")]
    Truncated {
        /// Bytes available.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The message does not start with [`MAGIC`].
    #[error("not a message of this protocol (bad magic)")]
    BadMagic,
    /// The framing version is not [`FRAME_VERSION`].
    #[error("unknown framing version {0}")]
    FrameVersion(u8),
    /// The kind byte names no message.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The length field is below the header or above [`MAX_MESSAGE_LEN`].
    #[error("message length {0} out of range")]
    BadLength(u32),
    /// A field's value is invalid.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(field: &'static str, reason: impl fmt::Display) -> WireError {
    WireError::Invalid { field, reason: reason.to_string() }
}

/// Reads big-endian fields off a body, failing on truncation.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
    total: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(WireError::Truncated { got: self.total, need: HEADER_LEN + self.at.saturating_add(n) });
        };
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    /// An appended `u64`: `None` when the body ends here (a peer that does not send it).
    fn optional_u64(&mut self) -> Result<Option<u64>, WireError> {
        if self.at == self.buf.len() {
            Ok(None)
        } else {
            self.u64().map(Some)
        }
    }
    /// An appended `u32`: `None` when the body ends here.
    fn optional_u32(&mut self) -> Result<Option<u32>, WireError> {
        if self.at == self.buf.len() {
            Ok(None)
        } else {
            self.u32().map(Some)
        }
    }
    fn text(&mut self, len: usize, field: &'static str) -> Result<String, WireError> {
        let b = self.take(len)?;
        std::str::from_utf8(b).map(str::to_owned).map_err(|_| invalid(field, "not UTF-8"))
    }
}

/// Decodes the header at the start of `buf` (which may hold padding after the message).
///
/// # Errors
/// [`WireError`] for fewer than [`HEADER_LEN`] bytes, a bad magic or framing version, an
/// unknown kind, or a length out of range or beyond `buf`.
pub fn decode_header(buf: &[u8]) -> Result<Header, WireError> {
    if buf.len() < HEADER_LEN {
        return Err(WireError::Truncated { got: buf.len(), need: HEADER_LEN });
    }
    if buf[0..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if buf[4] != FRAME_VERSION {
        return Err(WireError::FrameVersion(buf[4]));
    }
    let kind = Kind::from_u8(buf[5]).ok_or(WireError::UnknownKind(buf[5]))?;
    // buf[6..8]: flags, reserved (sent as 0, ignored).
    let len = u32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
    if (len as usize) < HEADER_LEN || len as usize > MAX_MESSAGE_LEN {
        return Err(WireError::BadLength(len));
    }
    if len as usize > buf.len() {
        return Err(WireError::Truncated { got: buf.len(), need: len as usize });
    }
    let mut s = [0; 8];
    s.copy_from_slice(&buf[12..20]);
    Ok(Header { kind, len, session: u64::from_be_bytes(s) })
}

/// Decodes the message at the start of `buf`; bytes after its length (padding) are ignored.
///
/// # Errors
/// As [`decode_header`], and [`WireError::Truncated`] / [`WireError::Invalid`] for a body
/// that is short or has invalid fields.
pub fn decode(buf: &[u8]) -> Result<(Header, Message), WireError> {
    decode_within(buf, 0)
}

/// Decodes the sealed message at the start of `buf`: its last [`TAG_LEN`] bytes (within its
/// length) are the tag, not part of the body. Checking the tag is [`crate::seal`]'s.
///
/// # Errors
/// As [`decode`]; [`WireError::Truncated`] for a message too short to hold a tag.
pub fn decode_sealed(buf: &[u8]) -> Result<(Header, Message), WireError> {
    decode_within(buf, TAG_LEN)
}

/// [`decode`] of a message whose body ends `tail` bytes before its length.
fn decode_within(buf: &[u8], tail: usize) -> Result<(Header, Message), WireError> {
    let h = decode_header(buf)?;
    let end = (h.len as usize).checked_sub(tail).filter(|&end| end >= HEADER_LEN);
    let end = end.ok_or(WireError::Truncated { got: h.len as usize, need: HEADER_LEN + tail })?;
    let body = &buf[HEADER_LEN..end];
    let mut r = Reader { buf: body, at: 0, total: end };
    let m = match h.kind {
        Kind::Hello => {
            let version_min = r.u16()?;
            let version_max = r.u16()?;
            if version_min > version_max {
                return Err(invalid("version range", format!("{version_min} > {version_max}")));
            }
            let caps = r.u32()?;
            let size = r.u64()?;
            let chunk = r.u32()?;
            let depth = r.u32()?;
            let name_len = usize::from(r.u16()?);
            if name_len > MAX_NAME_LEN {
                return Err(invalid("name", format!("{name_len} bytes, at most {MAX_NAME_LEN}")));
            }
            let name = r.text(name_len, "name")?;
            let (resume, lanes) = if caps & caps::LANES != 0 {
                // With LANES the key is always there (0: none), then the lanes wanted.
                let key = r.u64()?;
                (((caps & caps::RESUME) != 0 || key != 0).then_some(key), r.u16()?)
            } else {
                (r.optional_u64()?, 1)
            };
            Message::Hello(Hello { version_min, version_max, caps, size, chunk, depth, name, resume, lanes })
        }
        Kind::Grant => {
            let (version, caps) = (r.u16()?, r.u32()?);
            let (addr, rkey, slot_size, slot_count) = (r.u64()?, r.u32()?, r.u32()?, r.u32()?);
            let (resume_from, lanes) = if caps & caps::LANES != 0 {
                // With LANES: `resume_from` always, then the lanes block.
                let from = r.u64()?;
                (from, Some(Lanes { count: r.u16()?, token: r.array()? }))
            } else {
                (r.optional_u64()?.unwrap_or(0), None)
            };
            Message::Grant(Grant { version, caps, addr, rkey, slot_size, slot_count, resume_from, lanes })
        }
        Kind::Credit => Message::Credit(Credit { consumed: r.u64()? }),
        Kind::Fin => {
            let chunks = r.u64()?;
            let size = r.u64()?;
            let len = usize::from(r.u8()?);
            if len > MAX_DIGEST_LEN {
                return Err(invalid("digest", format!("{len} bytes, at most {MAX_DIGEST_LEN}")));
            }
            Message::Fin(Fin { chunks, size, digest: r.take(len)?.to_vec() })
        }
        Kind::Ack => {
            let code = r.u16()?;
            let status = Status::from_code(code).ok_or_else(|| invalid("status", format!("unknown code {code}")))?;
            let received = r.u64()?;
            let len = usize::from(r.u16()?);
            if len > MAX_DETAIL_LEN {
                return Err(invalid("detail", format!("{len} bytes, at most {MAX_DETAIL_LEN}")));
            }
            let detail = r.text(len, "detail")?;
            let retry_after_ms = r.optional_u32()?.unwrap_or(0);
            Message::Ack(Ack { status, received, detail, retry_after_ms })
        }
        Kind::Challenge => {
            let nonce = r.array()?;
            let prefix = match r.optional_u32()? {
                Some(index) => Some(PrefixClaim { index, from: r.u64()? }),
                None => None,
            };
            Message::Challenge(Challenge { nonce, prefix })
        }
        Kind::Proof => Message::Proof(Proof { nonce: r.array()?, mac: r.array()? }),
        Kind::Entry => {
            let index = r.u32()?;
            let kind = match r.u8()? {
                0 => EntryKind::File,
                1 => EntryKind::Directory,
                k => return Err(invalid("entry kind", format!("unknown kind {k}"))),
            };
            let flags = r.u8()?;
            let mode = r.u32()?;
            let mtime_sec = r.u64()? as i64;
            let mtime_nsec = r.u32()?;
            if mtime_nsec >= 1_000_000_000 {
                return Err(invalid("mtime", format!("{mtime_nsec} nanoseconds")));
            }
            let size = r.u64()?;
            let resume = r.u64()?;
            let path_len = usize::from(r.u16()?);
            if path_len > MAX_PATH_LEN {
                return Err(invalid("path", format!("{path_len} bytes, at most {MAX_PATH_LEN}")));
            }
            let path = r.text(path_len, "path")?;
            Message::Entry(Entry { index, kind, flags, mode, mtime_sec, mtime_nsec, size, resume, path })
        }
        Kind::Ready => Message::Ready(Ready { index: r.u32()?, resume_from: r.u64()? }),
        Kind::End => Message::End(End { entries: r.u32()? }),
        Kind::Lane => Message::Lane(Lane { lane: r.u16()?, token: r.array()? }),
        Kind::Knock => Message::Knock(Knock { time: r.u64()?, mac: r.array()? }),
        Kind::Cancel => Message::Cancel(Cancel),
    };
    Ok((h, m))
}

/// Encodes `msg` of `session` into `out` (cleared first).
///
/// # Errors
/// [`WireError::Invalid`] for a name or digest over its limit, or a HELLO whose version range
/// is empty (what `decode` would refuse; nothing is sent). A detail over its limit is cut.
pub fn encode(session: u64, msg: &Message, out: &mut Vec<u8>) -> Result<(), WireError> {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.push(FRAME_VERSION);
    out.push(msg.kind() as u8);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&[0; 4]); // length, filled in below
    out.extend_from_slice(&session.to_be_bytes());
    match msg {
        Message::Hello(h) => {
            if h.name.len() > MAX_NAME_LEN {
                return Err(invalid("name", format!("{} bytes, at most {MAX_NAME_LEN}", h.name.len())));
            }
            // Refused as `decode` refuses it: never send what the peer cannot read.
            if h.version_min > h.version_max {
                return Err(invalid("version range", format!("{} > {}", h.version_min, h.version_max)));
            }
            out.extend_from_slice(&h.version_min.to_be_bytes());
            out.extend_from_slice(&h.version_max.to_be_bytes());
            out.extend_from_slice(&h.caps.to_be_bytes());
            out.extend_from_slice(&h.size.to_be_bytes());
            out.extend_from_slice(&h.chunk.to_be_bytes());
            out.extend_from_slice(&h.depth.to_be_bytes());
            out.extend_from_slice(&(h.name.len() as u16).to_be_bytes());
            out.extend_from_slice(h.name.as_bytes());
            if h.caps & caps::LANES != 0 {
                // The key always (0: none), so that the lanes after it have their place.
                out.extend_from_slice(&h.resume.unwrap_or(0).to_be_bytes());
                out.extend_from_slice(&h.lanes.to_be_bytes());
            } else if let Some(key) = h.resume {
                out.extend_from_slice(&key.to_be_bytes());
            }
        }
        Message::Grant(g) => {
            out.extend_from_slice(&g.version.to_be_bytes());
            out.extend_from_slice(&g.caps.to_be_bytes());
            out.extend_from_slice(&g.addr.to_be_bytes());
            out.extend_from_slice(&g.rkey.to_be_bytes());
            out.extend_from_slice(&g.slot_size.to_be_bytes());
            out.extend_from_slice(&g.slot_count.to_be_bytes());
            // The lanes block (capability LANES): `resume_from` always, the lanes, the token.
            match (g.caps & caps::LANES != 0, g.lanes) {
                (true, Some(l)) => {
                    out.extend_from_slice(&g.resume_from.to_be_bytes());
                    out.extend_from_slice(&l.count.to_be_bytes());
                    out.extend_from_slice(&l.token);
                }
                (false, None) => {
                    // Only when not 0: a GRANT that resumes nothing is the version-1 GRANT,
                    // whatever its caps (one encoding per message).
                    if g.resume_from != 0 {
                        out.extend_from_slice(&g.resume_from.to_be_bytes());
                    }
                }
                _ => return Err(invalid("lanes", "given if and only if LANES is granted")),
            }
        }
        Message::Credit(c) => out.extend_from_slice(&c.consumed.to_be_bytes()),
        Message::Fin(f) => {
            if f.digest.len() > MAX_DIGEST_LEN {
                return Err(invalid("digest", format!("{} bytes, at most {MAX_DIGEST_LEN}", f.digest.len())));
            }
            out.extend_from_slice(&f.chunks.to_be_bytes());
            out.extend_from_slice(&f.size.to_be_bytes());
            out.push(f.digest.len() as u8);
            out.extend_from_slice(&f.digest);
        }
        Message::Ack(a) => {
            // A long detail is cut (at a character boundary), not refused: the verdict matters.
            let mut end = a.detail.len().min(MAX_DETAIL_LEN);
            while !a.detail.is_char_boundary(end) {
                end -= 1;
            }
            out.extend_from_slice(&a.status.code().to_be_bytes());
            out.extend_from_slice(&a.received.to_be_bytes());
            out.extend_from_slice(&(end as u16).to_be_bytes());
            out.extend_from_slice(&a.detail.as_bytes()[..end]);
            // Only when not 0: an ACK without a hint is the version-1 ACK as first specified.
            if a.retry_after_ms != 0 {
                out.extend_from_slice(&a.retry_after_ms.to_be_bytes());
            }
        }
        Message::Challenge(c) => {
            out.extend_from_slice(&c.nonce);
            if let Some(p) = c.prefix {
                out.extend_from_slice(&p.index.to_be_bytes());
                out.extend_from_slice(&p.from.to_be_bytes());
            }
        }
        Message::Proof(p) => {
            out.extend_from_slice(&p.nonce);
            out.extend_from_slice(&p.mac);
        }
        Message::Entry(e) => {
            if e.path.len() > MAX_PATH_LEN {
                return Err(invalid("path", format!("{} bytes, at most {MAX_PATH_LEN}", e.path.len())));
            }
            if e.mtime_nsec >= 1_000_000_000 {
                return Err(invalid("mtime", format!("{} nanoseconds", e.mtime_nsec)));
            }
            out.extend_from_slice(&e.index.to_be_bytes());
            out.push(e.kind as u8);
            out.push(e.flags);
            out.extend_from_slice(&e.mode.to_be_bytes());
            out.extend_from_slice(&e.mtime_sec.to_be_bytes());
            out.extend_from_slice(&e.mtime_nsec.to_be_bytes());
            out.extend_from_slice(&e.size.to_be_bytes());
            out.extend_from_slice(&e.resume.to_be_bytes());
            out.extend_from_slice(&(e.path.len() as u16).to_be_bytes());
            out.extend_from_slice(e.path.as_bytes());
        }
        Message::Ready(r) => {
            out.extend_from_slice(&r.index.to_be_bytes());
            out.extend_from_slice(&r.resume_from.to_be_bytes());
        }
        Message::End(e) => out.extend_from_slice(&e.entries.to_be_bytes()),
        Message::Lane(l) => {
            out.extend_from_slice(&l.lane.to_be_bytes());
            out.extend_from_slice(&l.token);
        }
        Message::Knock(k) => {
            out.extend_from_slice(&k.time.to_be_bytes());
            out.extend_from_slice(&k.mac);
        }
        Message::Cancel(Cancel) => {}
    }
    let len = out.len() as u32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Message) {
        let mut buf = Vec::new();
        encode(7, &m, &mut buf).unwrap();
        assert!(buf.len() <= MAX_MESSAGE_LEN);
        buf.extend_from_slice(&[0; 40]); // padding of a receive slot
        let (h, back) = decode(&buf).unwrap();
        assert_eq!((h.session, h.kind), (7, m.kind()));
        assert_eq!(back, m);
    }

    #[test]
    fn every_kind_round_trips_through_padding() {
        round_trip(Message::Hello(Hello {
            version_min: 1,
            version_max: 3,
            caps: caps::DIGEST_XXH3_128,
            size: 1 << 40,
            chunk: 1 << 20,
            depth: 32,
            name: "a".repeat(MAX_NAME_LEN),
            resume: None,
            lanes: 1,
        }));
        round_trip(Message::Grant(Grant {
            version: 1,
            caps: 1,
            addr: u64::MAX,
            rkey: 9,
            slot_size: 4096,
            slot_count: 16,
            resume_from: 0,
            lanes: None,
        }));
        round_trip(Message::Credit(Credit { consumed: 99 }));
        round_trip(Message::Challenge(Challenge { nonce: [3; 16], prefix: None }));
        let prefix = Some(PrefixClaim { index: 7, from: 1 << 33 });
        round_trip(Message::Challenge(Challenge { nonce: [4; 16], prefix }));
        round_trip(Message::Entry(Entry {
            index: 3,
            kind: EntryKind::File,
            flags: entry_flags::MODE | entry_flags::MTIME,
            mode: 0o640,
            mtime_sec: -5,
            mtime_nsec: 999_999_999,
            size: 1 << 33,
            resume: 0xfeed,
            path: "a/".repeat(MAX_PATH_LEN / 2),
        }));
        round_trip(Message::Ready(Ready { index: 3, resume_from: 7 }));
        round_trip(Message::End(End { entries: 12 }));
        round_trip(Message::Fin(Fin { chunks: 3, size: 5, digest: vec![1; 32] }));
        round_trip(Message::Ack(Ack {
            status: Status::NoSpace,
            received: 4,
            detail: "disk full".into(),
            retry_after_ms: 0,
        }));
        round_trip(Message::Ack(Ack {
            status: Status::Busy,
            received: 0,
            detail: "full".into(),
            retry_after_ms: 1500,
        }));
    }

    #[test]
    fn every_cut_of_a_message_is_truncated_not_a_panic() {
        let mut buf = Vec::new();
        let hello = Hello {
            version_min: 1,
            version_max: 1,
            caps: 1,
            size: 1,
            chunk: 1,
            depth: 1,
            name: "f".into(),
            resume: None,
            lanes: 1,
        };
        encode(1, &Message::Hello(hello), &mut buf).unwrap();
        for cut in 0..buf.len() {
            assert!(matches!(decode(&buf[..cut]), Err(WireError::Truncated { .. })), "cut {cut}");
        }
    }

    #[test]
    fn a_length_that_cuts_into_a_field_is_truncated() {
        let mut buf = Vec::new();
        encode(1, &Message::Credit(Credit { consumed: 1 }), &mut buf).unwrap();
        buf[8..12].copy_from_slice(&(HEADER_LEN as u32 + 4).to_be_bytes());
        assert!(matches!(decode(&buf), Err(WireError::Truncated { .. })));
    }
}
