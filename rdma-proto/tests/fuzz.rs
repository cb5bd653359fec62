//! Fuzzing of what a peer controls on the receiver's side, for a bounded time: the
//! decoder (arbitrary bytes and structure-aware mutations of valid messages of all seven kinds)
//! and the receiver's state machine fed arbitrary sequences of inputs: junk and mutated messages
//! of every kind and session, WRITE arrivals with any immediate and length, the driver's answers
//! given when the machine asked for them and when it did not, and timeouts at any time. Its
//! configurations sometimes hold a shared secret (capability `AUTH`) and sometimes resume
//! (`RESUME`): HELLOs come with and without `AUTH`, `RESUME` and a resume key; PROOFs are
//! valid (computed here with the secret and both nonces, by docs/protocol.md's formula),
//! with a flipped bit, another secret, reflected (the receiver's label), for another session or
//! file, or answering another challenge; the driver answers `Resumed` with a prefix of the file,
//! all of it, or more than the file.
//!
//! Each receiver case is checked twice at every step:
//! - against **what users rely on** ([`Watch`], independent of how the machine works): every
//!   action names the opened file and a granted slot, no chunk is stored outside the file or
//!   over a slot not yet credited, nothing follows a commit asked for but its answer, a commit
//!   is asked for only once every chunk of a FIN that matches the HELLO was stored, one Finish
//!   and nothing after it, the ACK is the last message and agrees with the Finish, an ACK `Ok`
//!   only for a commit that succeeded, a failure after the open always discards; with a secret,
//!   nothing is opened (and no GRANT sent) before a PROOF of the sender's that verifies, the
//!   receiver's own PROOF (correct, with its CHALLENGE's nonce) only after that, a wrong proof
//!   ends in ACK NotAuthorized with nothing opened and `auth_failed()`; resuming, the GRANT's
//!   `resume_from` is what the driver answered, chunk `n` is stored at `resume_from + n *
//!   slot_size` and never past the file's end, and the ACK counts the bytes held;
//! - against **the rules of `docs/protocol.md`** ([`Spec`], an executable copy of its receiver
//!   tables, Authenticating and the resume flow included): the exact actions and messages each
//!   input must produce, and the deadline.
//!
//! Stable Rust has no coverage-guided fuzzer, so this is proptest with a time budget: batches of
//! random cases until `RDMA_FUZZ_SECS` (default 10) seconds are spent, shared among the targets.
//! `cargo xtask test` runs it with the default (twice: with the driver and the core alone). A
//! longer run: `RDMA_FUZZ_SECS=600 cargo test -p rdma-proto --test fuzz --release`. A failing
//! case is shrunk, printed, and its seed saved in `fuzz.proptest-regressions` beside this file
//! (replayed first by every later run; commit it with the fix). `PROPTEST_RNG_SEED=N` makes a
//! run repeatable.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestError, TestRunner};
use rdma_proto::auth::{Secret, NONCE_LEN, PROOF_LEN};
use rdma_proto::receiver::{Action, Input, Receiver, ReceiverConfig};
use rdma_proto::wire::{
    self, caps, decode, decode_header, encode, Ack, Challenge, Credit, Fin, Grant, Header, Hello, Message, PrefixClaim,
    Proof, DIGEST_LEN, HEADER_LEN, MAX_DETAIL_LEN, MAX_DIGEST_LEN, MAX_MESSAGE_LEN, MAX_NAME_LEN,
};
use rdma_proto::{Digest, Outcome, ProtocolError, Status};
use sha2::Sha256;

// ---- The time budget. ----

/// Seconds of fuzzing per run of this binary, shared among its targets.
fn budget() -> Duration {
    let secs = std::env::var("RDMA_FUZZ_SECS").ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(10.0);
    Duration::from_secs_f64(secs.max(0.0))
}

/// Runs `test` on cases of `strategy` in batches until `share` of the budget is spent (at least
/// one batch). Failures are shrunk and persisted as a `proptest!` test's are.
fn fuzz<S>(name: &str, share: f64, batch: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) -> u64
where
    S: Strategy,
    S::Value: Debug,
{
    let config = Config {
        cases: batch,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fuzz.proptest-regressions"
        )))),
        // Shrinking a long sequence of inputs takes many steps (proptest's default is 4 per
        // case of a batch): give it time, but not forever.
        max_shrink_iters: 1_000_000,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    let until = budget().mul_f64(share);
    let start = Instant::now();
    // One seeded master: each batch draws its own generator from it (PROPTEST_RNG_SEED fixes it).
    let mut master = TestRunner::new(config.clone());
    let mut cases = 0u64;
    loop {
        let mut runner = TestRunner::new_with_rng(config.clone(), master.new_rng());
        match runner.run(&strategy, &test) {
            Ok(()) => cases += u64::from(batch),
            Err(TestError::Fail(why, input)) => {
                // Pretty unless that makes a line of every byte.
                let mut shown = format!("{input:#?}");
                if shown.lines().count() > 300 {
                    shown = format!("{input:?}");
                }
                panic!("fuzz {name}: {why}\nafter {cases} passing cases; minimal failing input:\n{shown}")
            }
            Err(TestError::Abort(why)) => panic!("fuzz {name}: aborted: {why}"),
        }
        if start.elapsed() >= until {
            break;
        }
    }
    eprintln!("fuzz {name}: {cases} cases in {:.1?}", start.elapsed());
    cases
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($fmt)*)));
        }
    };
}

// ---- Structure-aware mutations of encoded messages. ----

/// Values that sit on the codec's limits, written big-endian over a field.
#[derive(Debug, Clone)]
enum Word {
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
}

fn word() -> impl Strategy<Value = Word> {
    let edges16 = prop::sample::select(vec![0u16, 1, 2, 15, 16, 17, 64, 65, 255, 256, 512, 513, 1024, 1025, u16::MAX]);
    let edges32 = prop::sample::select(vec![0u32, 1, 19, 20, 21, 46, 1023, 1024, 1025, u32::MAX - 1, u32::MAX]);
    let edges64 = prop::sample::select(vec![0u64, 1, 2, 1 << 32, (1 << 32) - 1, u64::MAX - 1, u64::MAX]);
    prop_oneof![
        any::<u8>().prop_map(Word::U8),
        prop_oneof![edges16, any::<u16>()].prop_map(Word::U16),
        prop_oneof![edges32, any::<u32>()].prop_map(Word::U32),
        prop_oneof![edges64, any::<u64>()].prop_map(Word::U64),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    /// Flip one bit.
    Flip(Index, u8),
    /// Write a value at any offset.
    Word(Index, Word),
    /// Write a value over one of the fields `docs/protocol.md` lists for the message's kind.
    Field(Index, Word),
    /// Append zeros inside the message: its length grows by as much (a later version's fields).
    Grow(u16),
    /// Make the variable part (name, digest, detail) `limit + by` bytes long, its count and the
    /// message's length to match.
    Count(i8),
    /// Set the header's length: an edge, or off the real one by a little.
    Len(u32),
    LenBy(i8),
    Insert(Index, Vec<u8>),
    Remove(Index, u8),
    Truncate(Index),
    /// Zero padding after the message, as a receive slot holds.
    Pad(u16),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let len = prop::sample::select(vec![0u32, 19, 20, 21, 28, 46, 1023, 1024, 1025, u32::MAX]);
    prop_oneof![
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<Index>(), word()).prop_map(|(i, w)| Mutation::Word(i, w)),
        4 => (any::<Index>(), word()).prop_map(|(i, w)| Mutation::Field(i, w)),
        1 => (0u16..=1100).prop_map(Mutation::Grow),
        2 => prop_oneof![-2i8..=2, any::<i8>()].prop_map(Mutation::Count),
        1 => prop_oneof![len, any::<u32>()].prop_map(Mutation::Len),
        2 => any::<i8>().prop_map(Mutation::LenBy),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (any::<Index>(), 1u8..16).prop_map(|(i, n)| Mutation::Remove(i, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (0u16..=1100).prop_map(Mutation::Pad),
    ]
}

fn mutate(buf: &mut Vec<u8>, m: &Mutation) {
    let real_len = |b: &[u8]| if b.len() >= 12 { u32::from_be_bytes([b[8], b[9], b[10], b[11]]) } else { 0 };
    let set_len = |b: &mut Vec<u8>, len: u32| {
        if b.len() >= 12 {
            b[8..12].copy_from_slice(&len.to_be_bytes());
        }
    };
    match m {
        Mutation::Flip(i, bit) if !buf.is_empty() => {
            let at = i.index(buf.len());
            buf[at] ^= 1 << bit;
        }
        Mutation::Word(i, w) if !buf.is_empty() => {
            let at = i.index(buf.len());
            overwrite(buf, at, w);
        }
        Mutation::Field(i, w) if buf.len() > 5 => {
            // Offsets of the header's fields, then of the body's of each kind.
            let body: &[usize] = match buf[5] {
                1 => &[20, 22, 24, 28, 36, 40, 44, 46],
                2 => &[20, 22, 26, 34, 38, 42, 46],
                3 => &[20],
                4 => &[20, 28, 36, 37],
                5 => &[20, 22, 30, 32],
                6 => &[20],
                7 => &[20, 36],
                _ => &[],
            };
            let fields: Vec<usize> =
                [0, 4, 5, 6, 8, 12].iter().chain(body).copied().filter(|&f| f < buf.len()).collect();
            let at = fields[i.index(fields.len())];
            overwrite(buf, at, w);
        }
        Mutation::Count(by) if buf.len() > 5 => {
            // (offset of the count, its bytes, the limit)
            let (at, width, limit) = match buf[5] {
                1 => (44, 2, MAX_NAME_LEN),
                4 => (36, 1, MAX_DIGEST_LEN),
                5 => (30, 2, MAX_DETAIL_LEN),
                _ => return,
            };
            let n = limit.saturating_add_signed(isize::from(*by));
            buf.resize(at + width, 0);
            let count = (n as u16).to_be_bytes();
            buf[at..].copy_from_slice(&count[2 - width..]);
            buf.resize(at + width + n, b'a');
            let len = buf.len() as u32;
            set_len(buf, len);
        }
        Mutation::Grow(n) => {
            let len = real_len(buf).wrapping_add(u32::from(*n));
            buf.resize(buf.len() + usize::from(*n), 0);
            set_len(buf, len);
        }
        Mutation::Len(len) => set_len(buf, *len),
        Mutation::LenBy(by) => {
            let len = real_len(buf).wrapping_add_signed(i32::from(*by));
            set_len(buf, len);
        }
        Mutation::Insert(i, bytes) => {
            let at = i.index(buf.len() + 1);
            buf.splice(at..at, bytes.iter().copied());
        }
        Mutation::Remove(i, n) if !buf.is_empty() => {
            let at = i.index(buf.len());
            let end = (at + usize::from(*n)).min(buf.len());
            buf.drain(at..end);
        }
        Mutation::Truncate(i) => {
            let at = i.index(buf.len() + 1);
            buf.truncate(at);
        }
        Mutation::Pad(n) => buf.resize(buf.len() + usize::from(*n), 0),
        _ => {}
    }
}

fn overwrite(buf: &mut [u8], at: usize, w: &Word) {
    let bytes = match w {
        Word::U8(v) => v.to_be_bytes().to_vec(),
        Word::U16(v) => v.to_be_bytes().to_vec(),
        Word::U32(v) => v.to_be_bytes().to_vec(),
        Word::U64(v) => v.to_be_bytes().to_vec(),
    };
    let n = bytes.len().min(buf.len() - at);
    buf[at..at + n].copy_from_slice(&bytes[..n]);
}

// ---- Proofs of the shared secret, computed from docs/protocol.md's formula. ----

type Nonce = [u8; NONCE_LEN];

/// Whose proof: the two labels of `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Sender,
    Receiver,
}

/// What a proof covers besides the nonces: the session and the file the HELLO offered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Offered {
    session: u64,
    size: u64,
    name: String,
}

/// `MAC_role = HMAC-SHA256(secret, label_role || session || Ns || Nr || size || name)`.
fn mac(key: &[u8], role: Role, t: &Offered, ns: &Nonce, nr: &Nonce) -> [u8; PROOF_LEN] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(match role {
        Role::Sender => &b"rdcp auth v1 sender"[..],
        Role::Receiver => &b"rdcp auth v1 receiver"[..],
    });
    m.update(&t.session.to_be_bytes());
    m.update(ns);
    m.update(nr);
    m.update(&t.size.to_be_bytes());
    m.update(t.name.as_bytes());
    m.finalize().into_bytes().into()
}

// ---- Sealed messages (capability SEALED), from docs/protocol.md's formula. ----

fn hmac32(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes a key of any length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The seal keys of a session (the sender's direction, the receiver's):
/// `HMAC(HMAC(secret, "rdcp digest v1" || session || Ns || Nr), "rdcp seal v1 " || role)`.
fn seal_keys(key: &[u8], session: u64, ns: &Nonce, nr: &Nonce) -> ([u8; 32], [u8; 32]) {
    let ds = hmac32(key, &[b"rdcp digest v1", &session.to_be_bytes(), ns, nr]);
    (hmac32(&ds, &[b"rdcp seal v1 sender"]), hmac32(&ds, &[b"rdcp seal v1 receiver"]))
}

const TAG_LEN: usize = 16;

/// The `n`th message of a direction keyed `key`, sealed: its length grows by the tag, which is
/// `HMAC(key, n || message)` cut to 16 bytes. Too short a frame is left as it is.
fn seal(key: &[u8; 32], n: u64, frame: &mut Vec<u8>) {
    if frame.len() < HEADER_LEN {
        return;
    }
    let len = (frame.len() + TAG_LEN) as u32;
    frame[8..12].copy_from_slice(&len.to_be_bytes());
    let tag = hmac32(key, &[&n.to_be_bytes(), frame]);
    frame.extend_from_slice(&tag[..TAG_LEN]);
}

/// Whether the message at the start of `buf` (its header decoded) ends with the `n`th tag of
/// `key`.
fn sealed_right(key: &[u8; 32], n: u64, h: &Header, buf: &[u8]) -> bool {
    let len = h.len as usize;
    len >= HEADER_LEN + TAG_LEN
        && hmac32(key, &[&n.to_be_bytes(), &buf[..len - TAG_LEN]])[..TAG_LEN] == buf[len - TAG_LEN..len]
}

/// The key of a receiver without a secret, for proofs nobody can check.
const NO_KEY: &[u8] = b"no secret was configured here";

// ---- Valid messages. ----

/// Valid UTF-8 of at most `max` bytes: up to 64 characters of any kind, or one repeated up to
/// the limit.
fn text(max: usize) -> impl Strategy<Value = String> {
    let long = (any::<char>(), 0..=max).prop_map(move |(c, n)| c.to_string().repeat(n / c.len_utf8()));
    let short = prop::collection::vec(any::<char>(), 0..=max.min(64));
    prop_oneof![3 => short, 1 => long.prop_map(|s| s.chars().collect::<Vec<char>>())].prop_map(move |chars| {
        let mut s = String::new();
        for c in chars {
            if s.len() + c.len_utf8() > max {
                break;
            }
            s.push(c);
        }
        s
    })
}

/// Names a receiver takes and names it must refuse.
fn name() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "f".to_owned(),
        "file.bin".into(),
        "..hidden".into(),
        "é".into(),
        "x".repeat(MAX_NAME_LEN),
        String::new(),
        ".".into(),
        "..".into(),
        "a/b".into(),
        "../etc".into(),
        "a\\b".into(),
        "nul\0".into(),
        "tab\t".into(),
        "a.rdcp-tmp".into(),
    ]);
    prop_oneof![4 => Just("f".to_owned()), 3 => fixed, 2 => text(MAX_NAME_LEN)]
}

fn hello() -> impl Strategy<Value = Hello> {
    let versions = prop_oneof![
        6 => Just((1u16, 1u16)),
        1 => Just((0, u16::MAX)),
        1 => Just((0, 0)),
        1 => Just((2, 3)),
        1 => any::<(u16, u16)>().prop_map(|(a, b)| (a.min(b), a.max(b))),
    ];
    let caps = prop_oneof![
        6 => Just(caps::DIGEST_XXH3_128),
        3 => Just(caps::DIGEST_XXH3_128 | caps::DIGEST_XXH64),
        1 => Just(caps::DIGEST_XXH64 | caps::AUTH | caps::RESUME),
        2 => Just(caps::DIGEST_XXH3_128 | caps::AUTH),
        1 => Just(caps::DIGEST_XXH3_128 | caps::DIGEST_BLAKE3 | caps::AUTH),
        2 => Just(caps::DIGEST_XXH3_128 | caps::DIGEST_BLAKE3 | caps::AUTH | caps::SEALED),
        1 => Just(caps::DIGEST_BLAKE3 | caps::AUTH | caps::SEALED | caps::RESUME),
        1 => Just(caps::DIGEST_XXH3_128 | caps::RESUME),
        2 => Just(caps::DIGEST_XXH3_128 | caps::RESUME | caps::RESUME_PROOF),
        2 => Just(caps::DIGEST_XXH3_128 | caps::AUTH | caps::RESUME),
        1 => Just(caps::DIGEST_BLAKE3 | caps::AUTH | caps::SEALED | caps::RESUME | caps::RESUME_PROOF),
        1 => Just(caps::RESUME | caps::AUTH),
        1 => Just(u32::MAX),
        1 => Just(0),
        1 => Just(caps::DIGEST_BLAKE3),
        1 => any::<u32>(),
    ];
    let size = prop_oneof![
        6 => 0u64..=300,
        1 => prop::sample::select(vec![1u64 << 40, (1 << 40) + 1, u64::MAX - 1, u64::MAX]),
        1 => any::<u64>(),
    ];
    let chunk = prop_oneof![6 => 1u32..=40, 1 => Just(0), 1 => Just(u32::MAX), 1 => any::<u32>()];
    let depth = prop_oneof![6 => 1u32..=8, 1 => Just(0), 1 => Just(u32::MAX), 1 => any::<u32>()];
    let resume = prop_oneof![1 => Just(None), 1 => any::<u64>().prop_map(Some)];
    (versions, caps, size, chunk, depth, name(), resume, any::<u16>()).prop_map(
        |((version_min, version_max), caps, size, chunk, depth, name, resume, lanes)| {
            // With LANES the key is always on the wire: absent reads as 0 with RESUME, and 0
            // reads as absent without it.
            let (resume, lanes) = match (caps & caps::LANES != 0, caps & caps::RESUME != 0) {
                (false, _) => (resume, 1),
                (true, true) => (Some(resume.unwrap_or(0)), lanes),
                (true, false) => (resume.filter(|&k| k != 0), lanes),
            };
            Hello { version_min, version_max, caps, size, chunk, depth, name, resume, lanes }
        },
    )
}

fn grant() -> impl Strategy<Value = Grant> {
    let resume_from = prop_oneof![2 => Just(0u64), 1 => any::<u64>()];
    (any::<(u16, u32, u64, u32, u32, u32)>(), resume_from, any::<(u16, [u8; 16])>()).prop_map(
        |((version, caps, addr, rkey, slot_size, slot_count), resume_from, (count, token))| Grant {
            version,
            caps,
            addr,
            rkey,
            slot_size,
            slot_count,
            resume_from,
            // The lanes block is there exactly when LANES is granted.
            lanes: (caps & caps::LANES != 0).then_some(wire::Lanes { count, token }),
        },
    )
}

fn small_or_any() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..=16, 1 => any::<u64>()]
}

fn fin() -> impl Strategy<Value = Fin> {
    (small_or_any(), prop_oneof![0u64..=300, any::<u64>()], prop::collection::vec(any::<u8>(), 0..=MAX_DIGEST_LEN))
        .prop_map(|(chunks, size, digest)| Fin { chunks, size, digest })
}

fn ack() -> impl Strategy<Value = Ack> {
    (prop::sample::select(Status::ALL.to_vec()), any::<u64>(), text(MAX_DETAIL_LEN))
        .prop_map(|(status, received, detail)| Ack { status, received, detail, retry_after_ms: 0 })
}

/// A valid message of any kind.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        hello().prop_map(Message::Hello),
        grant().prop_map(Message::Grant),
        small_or_any().prop_map(|consumed| Message::Credit(Credit { consumed })),
        fin().prop_map(Message::Fin),
        ack().prop_map(Message::Ack),
        any::<Nonce>().prop_map(|nonce| Message::Challenge(Challenge { nonce, prefix: None })),
        any::<(Nonce, [u8; PROOF_LEN])>().prop_map(|(nonce, mac)| Message::Proof(Proof { nonce, mac })),
    ]
}

fn encoded(session: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode(session, m, &mut out).expect("a generated message is within the limits");
    out
}

// ---- The decoder. ----

/// Whatever decodes re-encodes to the same message, and the encoding is the bytes read: the
/// decoder reads every field where `docs/protocol.md` puts it and nothing else, but the
/// reserved flags, the length, and bytes past the body (appended fields of a later version).
fn check_decoding(buf: &[u8]) -> Result<(), TestCaseError> {
    let header = decode_header(buf);
    let (h, m) = match decode(buf) {
        Ok(hm) => hm,
        Err(e) => {
            // A header error is the message's error.
            if let Err(he) = header {
                ensure!(he == e, "decode_header says {he:?}, decode {e:?}");
            }
            return Ok(());
        }
    };
    ensure!(header == Ok(h), "decode_header {header:?} disagrees with decode's {h:?}");
    let len = h.len as usize;
    ensure!((HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) && len <= buf.len(), "length {len} of {} bytes", buf.len());
    ensure!(h.kind == m.kind(), "a {:?} header with a {:?} body", h.kind, m.kind());
    let mut again = Vec::new();
    let r = encode(h.session, &m, &mut again);
    ensure!(r.is_ok(), "decoded {m:?}, which does not encode: {r:?}");
    ensure!(again.len() <= len, "re-encoded to {} bytes, longer than the {len} read", again.len());
    let back = decode(&again);
    let want = Header { kind: h.kind, len: again.len() as u32, session: h.session };
    ensure!(back == Ok((want, m.clone())), "{m:?} re-encoded decodes to {back:?}");
    let mut read = buf[..again.len()].to_vec();
    read[6..12].copy_from_slice(&again[6..12]);
    ensure!(read == again, "the encoding of {m:?} is not the bytes it was read from");
    Ok(())
}

#[test]
fn fuzz_the_decoder_with_arbitrary_bytes() {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN + 64),
        // A valid header start, so that the body decoders get the junk.
        (1u8..=7, prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN)).prop_map(|(kind, rest)| {
            let mut b = wire::MAGIC.to_vec();
            b.extend_from_slice(&[wire::FRAME_VERSION, kind, 0, 0]);
            let len = (HEADER_LEN + rest.len().saturating_sub(12)) as u32;
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&rest);
            b
        }),
    ];
    fuzz("decoder, arbitrary bytes", 0.15, 512, bytes, |b| check_decoding(&b));
}

#[test]
fn fuzz_the_decoder_with_mutated_messages() {
    let cases = (any::<u64>(), message(), prop::collection::vec(mutation(), 1..8));
    fuzz("decoder, mutated messages", 0.15, 512, cases, |(session, m, muts)| {
        let mut buf = encoded(session, &m);
        for mu in &muts {
            mutate(&mut buf, mu);
        }
        check_decoding(&buf)
    });
}

// ---- The receiver: inputs. ----

/// Which session a message names.
#[derive(Debug, Clone, Copy)]
enum Sid {
    /// The honest sender's (the session of the case).
    Ours,
    Zero,
    Other(u64),
}

/// A chunk number relative to the receiver's progress, or any.
#[derive(Debug, Clone, Copy)]
enum Seq {
    /// The oldest chunk the machine asked to store and the driver has not answered.
    Oldest,
    /// The next chunk to arrive.
    Next,
    By(i8),
    Any(u64),
}

#[derive(Debug, Clone)]
enum Tick {
    By(Duration),
    /// One nanosecond before the deadline the machine reports.
    JustBefore,
    AtDeadline,
    Past(Duration),
}

#[derive(Debug, Clone)]
enum Op {
    /// What an honest sender does next: HELLO, the next WRITE the credit allows, the FIN.
    Sender,
    /// What an honest driver does next: answer the open, the oldest store, or the commit (with
    /// this status: the digest may differ, the disk fail).
    Driver(Status),
    Hello(Sid, Hello, Vec<Mutation>),
    /// A FIN for the case's file: its chunk count and size off by a little, any digest length.
    Fin {
        sid: Sid,
        chunks_by: i8,
        size_by: i8,
        digest_len: u8,
        muts: Vec<Mutation>,
    },
    Message(Sid, Message, Vec<Mutation>),
    Bytes(Vec<u8>),
    /// The next chunk's WRITE, its immediate and length off by a little.
    Write {
        imm_by: i8,
        len_by: i8,
    },
    RawWrite {
        imm: u32,
        len: u32,
    },
    Ready {
        addr: u64,
        rkey: u32,
    },
    OpenFailed(Status),
    Stored(Seq),
    StoreFailed(Status),
    Finalized(Status),
    /// A PROOF with the sender's nonce `nonce`, forged as `forge` says, for the HELLO the
    /// machine took and the nonce of its CHALLENGE.
    Proof {
        sid: Sid,
        forge: Forge,
        nonce: Nonce,
        muts: Vec<Mutation>,
    },
    /// The driver's answer to a resume lookup, asked for or not.
    Resumed(Lookup),
    Time(Tick),
}

/// How a PROOF of the sender is made.
#[derive(Debug, Clone)]
enum Forge {
    /// With the receiver's secret, as docs/protocol.md says: it verifies.
    Valid,
    /// The sender's nonce is the receiver's own, echoed: still a valid proof of the secret.
    EchoedNonce,
    /// A valid MAC with one bit flipped.
    Flip(Index, u8),
    /// With another secret.
    WrongSecret,
    /// The receiver's own proof (its label, its nonce) sent back.
    Reflected,
    /// A valid proof of another session.
    OtherSession(u64),
    /// A valid proof for another file (the size or the name differs).
    OtherFile(bool),
    /// A valid proof that answers another challenge (a recorded one).
    Replayed(Nonce),
    Junk([u8; PROOF_LEN]),
}

/// The bytes a resume lookup found, as a share of the file taken (or beyond it).
#[derive(Debug, Clone)]
enum Held {
    Zero,
    All,
    Part(Index),
    /// The whole chunks of a share: a checkpoint's offset.
    Chunks(Index),
    /// Past the file's end by this much (at least 1): a driver's bug.
    Beyond(u64),
}

impl Held {
    fn of(&self, size: u64, slot_size: u32) -> u64 {
        let part = |i: &Index| ((u128::from(size) * i.index(1 << 20) as u128) >> 20) as u64;
        match self {
            Held::Zero => 0,
            Held::All => size,
            Held::Part(i) => part(i),
            Held::Chunks(i) => part(i) / u64::from(slot_size.max(1)) * u64::from(slot_size.max(1)),
            Held::Beyond(by) => size.saturating_add((*by).max(1)),
        }
    }
}

/// A hostile or buggy driver's `Resumed`.
#[derive(Debug, Clone)]
enum Lookup {
    Held(Held),
    Any(u64),
}

/// How the honest sender proves the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    /// It offers no `AUTH` (it has no secret).
    None,
    /// With the receiver's secret.
    Right,
    /// With another one.
    Wrong,
}

/// The file an honest sender offers, and what an honest driver finds of it.
#[derive(Debug, Clone)]
struct Offer {
    session: u64,
    size: u64,
    chunk: u32,
    depth: u32,
    auth: Auth,
    /// The sender's nonce.
    nonce: Nonce,
    /// The resume key its HELLO carries (with `RESUME`).
    key: Option<u64>,
    /// What the driver's lookup finds of a partial: nothing (no `Resumed`), a prefix, or (a
    /// buggy driver) more than the file.
    held: Option<Held>,
    /// The digests its HELLO offers: XXH3-128 alone (a sender from before XXH64) or both.
    digests: u32,
    /// Whether it holds other bytes than the receiver's partial: its proof of the prefix is
    /// wrong.
    other_bytes: bool,
}

/// A receiver's configuration, with the secret's bytes as the MAC keys them and its nonce.
#[derive(Debug, Clone)]
struct Conf {
    cfg: ReceiverConfig,
    key: Option<Vec<u8>>,
    nonce: Nonce,
}

fn status() -> impl Strategy<Value = Status> {
    prop::sample::select(Status::ALL.to_vec())
}

fn sid() -> impl Strategy<Value = Sid> {
    prop_oneof![6 => Just(Sid::Ours), 1 => Just(Sid::Zero), 1 => any::<u64>().prop_map(Sid::Other)]
}

fn muts() -> impl Strategy<Value = Vec<Mutation>> {
    prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(mutation(), 1..4)]
}

/// An input: of an honest sender or driver with weight `honest` (against about 25 for all the
/// others together).
fn op(honest: u32) -> impl Strategy<Value = Op> {
    let seq = prop_oneof![
        3 => Just(Seq::Oldest),
        1 => Just(Seq::Next),
        1 => any::<i8>().prop_map(Seq::By),
        1 => any::<u64>().prop_map(Seq::Any),
    ];
    let tick = prop_oneof![
        4 => (0u64..5_000).prop_map(|us| Tick::By(Duration::from_micros(us))),
        1 => Just(Tick::JustBefore),
        1 => Just(Tick::AtDeadline),
        1 => prop::sample::select(vec![Duration::from_secs(3600), Duration::from_secs(u64::MAX)]).prop_map(Tick::Past),
    ];
    let digest_len = prop_oneof![4 => Just(DIGEST_LEN as u8), 2 => Just(8), 1 => 0u8..=MAX_DIGEST_LEN as u8];
    prop_oneof![
        honest => Just(Op::Sender),
        honest => prop_oneof![8 => Just(Status::Ok), 1 => status()].prop_map(Op::Driver),
        2 => (sid(), hello(), muts()).prop_map(|(s, h, m)| Op::Hello(s, h, m)),
        2 => (sid(), -1i8..=1, -1i8..=1, digest_len, muts()).prop_map(|(sid, chunks_by, size_by, digest_len, muts)| {
            Op::Fin { sid, chunks_by, size_by, digest_len, muts }
        }),
        2 => (sid(), message(), muts()).prop_map(|(s, m, mu)| Op::Message(s, m, mu)),
        1 => prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN + 64).prop_map(Op::Bytes),
        2 => (-2i8..=2, -2i8..=2).prop_map(|(imm_by, len_by)| Op::Write { imm_by, len_by }),
        1 => any::<(u32, u32)>().prop_map(|(imm, len)| Op::RawWrite { imm, len }),
        1 => any::<(u64, u32)>().prop_map(|(addr, rkey)| Op::Ready { addr, rkey }),
        1 => status().prop_map(Op::OpenFailed),
        2 => seq.prop_map(Op::Stored),
        1 => status().prop_map(Op::StoreFailed),
        1 => status().prop_map(Op::Finalized),
        2 => (sid(), forge(), any::<Nonce>(), muts()).prop_map(|(sid, forge, nonce, muts)| Op::Proof {
            sid,
            forge,
            nonce,
            muts
        }),
        1 => resume_from().prop_map(Op::Resumed),
        6 => tick.prop_map(Op::Time),
    ]
}

fn forge() -> impl Strategy<Value = Forge> {
    prop_oneof![
        4 => Just(Forge::Valid),
        1 => Just(Forge::EchoedNonce),
        2 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Forge::Flip(i, b)),
        1 => Just(Forge::WrongSecret),
        2 => Just(Forge::Reflected),
        1 => any::<u64>().prop_map(Forge::OtherSession),
        1 => any::<bool>().prop_map(Forge::OtherFile),
        1 => any::<Nonce>().prop_map(Forge::Replayed),
        1 => any::<[u8; PROOF_LEN]>().prop_map(Forge::Junk),
    ]
}

fn held() -> impl Strategy<Value = Held> {
    prop_oneof![
        1 => Just(Held::Zero),
        1 => Just(Held::All),
        2 => any::<Index>().prop_map(Held::Part),
        2 => any::<Index>().prop_map(Held::Chunks),
        1 => prop_oneof![Just(1u64), 1u64..=100, any::<u64>()].prop_map(Held::Beyond),
    ]
}

fn resume_from() -> impl Strategy<Value = Lookup> {
    prop_oneof![
        3 => held().prop_map(Lookup::Held),
        1 => any::<u64>().prop_map(Lookup::Any),
    ]
}

fn receiver_config() -> impl Strategy<Value = Conf> {
    let max_size = prop_oneof![4 => Just(u64::MAX), 1 => Just(1 << 40), 2 => 0u64..=400];
    let max_chunk = prop_oneof![4 => Just(4 << 20), 1 => Just(0), 2 => 1u32..=40, 1 => Just(u32::MAX)];
    let budget = prop_oneof![4 => Just(64 << 20), 1 => Just(0), 2 => 1u64..=400, 1 => Just(u64::MAX)];
    let max_slots = prop_oneof![4 => 1u32..=8, 1 => Just(0), 1 => Just(64), 1 => Just(u32::MAX)];
    let timeout = prop_oneof![
        4 => Just(Duration::from_secs(10)),
        1 => Just(Duration::ZERO),
        2 => (0u64..20_000).prop_map(Duration::from_micros),
        1 => Just(Duration::MAX),
    ];
    let hello_timeout = prop_oneof![
        4 => Just(Duration::from_secs(10)),
        1 => Just(Duration::ZERO),
        2 => (0u64..20_000).prop_map(Duration::from_micros),
        1 => Just(Duration::MAX),
    ];
    // A secret of 16 to 48 bytes, any inside, none of them whitespace at either end (the key),
    // given with whitespace around it or not (which `Secret::new` trims).
    let key = (33u8..=126, prop::collection::vec(any::<u8>(), 14..=46), 33u8..=126).prop_map(|(a, mid, b)| {
        let mut k = vec![a];
        k.extend(mid);
        k.push(b);
        k
    });
    let secret = prop_oneof![2 => Just(None), 1 => (key, prop::sample::select(vec!["", "\n", " \t"])).prop_map(Some)];
    // The pace floor: none, the default, a few bytes per second (reached or not by the fuzzed
    // writes of a few bytes), or one no sender reaches.
    let min_rate = prop_oneof![
        2 => Just(0),
        2 => Just(rdma_proto::receiver::DEFAULT_MIN_RATE),
        2 => 1u64..=64,
        1 => Just(u64::MAX)
    ];
    let auth = (secret, any::<bool>(), any::<Nonce>(), any::<bool>());
    (max_size, max_chunk, budget, max_slots, (timeout, min_rate), hello_timeout, auth).prop_map(
        |(
            max_size,
            max_chunk,
            budget,
            max_slots,
            (timeout, min_rate),
            hello_timeout,
            (secret, resume, nonce, xxh64),
        )| {
            let mut c = ReceiverConfig::default();
            (c.max_size, c.max_chunk, c.memory_budget, c.max_slots, c.timeout, c.hello_timeout) =
                (max_size, max_chunk, budget, max_slots, timeout, hello_timeout);
            c.min_rate = min_rate;
            c.resume = resume;
            c.digest = if xxh64 { Digest::Xxh64 } else { Digest::Xxh3_128 };
            // Batches (and their byte limit) are tests/batch.rs's: this model is of one file
            // per session, and a batch's HELLO is refused here as by a receiver without them.
            (c.batch, c.max_session_bytes) = (false, u64::MAX);
            // Striping is tests/lanes.rs's: this model is of one lane, and a HELLO offering
            // LANES is served on one, as by a receiver without them.
            c.max_lanes = 1;
            c.secret = secret.as_ref().map(|(key, around)| {
                let given = [around.as_bytes(), key, around.as_bytes()].concat();
                Secret::new(&given).expect("a secret of at least 16 bytes")
            });
            Conf { cfg: c, key: secret.map(|(key, _)| key), nonce }
        },
    )
}

/// A file of at most a dozen chunks, so that a case of a few hundred inputs can send it whole.
fn offer() -> impl Strategy<Value = Offer> {
    let auth = prop_oneof![4 => Just(Auth::Right), 1 => Just(Auth::None), 1 => Just(Auth::Wrong)];
    let key = prop_oneof![1 => Just(None), 1 => any::<u64>().prop_map(Some)];
    let held = prop_oneof![1 => Just(None), 3 => held().prop_map(Some)];
    let digests = prop_oneof![Just(caps::DIGEST_XXH3_128), Just(caps::DIGEST_XXH3_128 | caps::DIGEST_XXH64)];
    let other_bytes = prop_oneof![3 => Just(false), 1 => Just(true)];
    let sender = (auth, any::<Nonce>(), key, held, (digests, other_bytes));
    (1u64.., 1u32..=40, 1u32..=8, sender).prop_flat_map(
        |(session, chunk, depth, (auth, nonce, key, held, (digests, other_bytes)))| {
            (0..=u64::from(chunk) * 12 + 3).prop_map(move |size| Offer {
                session,
                size,
                chunk,
                depth,
                auth,
                nonce,
                key,
                held: held.clone(),
                digests,
                other_bytes,
            })
        },
    )
}

/// The proof of a prefix this fuzzer's driver answers `Resumed` with: a sender that shows it
/// (with the receiver's nonce) resumes, any other proof starts the file over.
const PREFIX: [u8; PROOF_LEN] = [0x5a; PROOF_LEN];

// ---- The receiver: the rules of docs/protocol.md, executable. ----

/// What a step produced: the actions, with each message sent decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Open {
        name: String,
        size: u64,
        slot_size: u32,
        slot_count: u32,
    },
    Challenge {
        session: u64,
        nonce: Nonce,
    },
    /// A prefix CHALLENGE (`RESUME_PROOF`).
    PrefixChallenge {
        session: u64,
        nonce: Nonce,
        claim: PrefixClaim,
    },
    /// The file starts over from byte 0, the partial left alone.
    StartOver,
    Proof {
        session: u64,
        nonce: Nonce,
        mac: [u8; PROOF_LEN],
    },
    Grant {
        session: u64,
        grant: Grant,
    },
    Credit {
        session: u64,
        consumed: u64,
    },
    Ack {
        session: u64,
        status: Status,
        received: u64,
    },
    Store {
        seq: u64,
        slot: u32,
        offset: u64,
        len: u32,
    },
    Finalize(Vec<u8>),
    Discard,
    Finish(End),
}

/// A Finish, without its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Acked(Status),
    Wire,
    Peer,
    Timeout,
    Local,
    /// The chunk that arrived last arrived again: no verdict.
    Twice,
    /// The sender kept a pace below the floor: ACK Busy.
    TooSlow,
    /// A message whose seal is wrong: no verdict, so that the sender retries as after a lost
    /// connection.
    Unsealed,
    /// The sender's CANCEL: no verdict.
    Cancelled,
}

impl End {
    fn of(o: &Outcome) -> End {
        match o {
            Outcome::Acked { status, .. } => End::Acked(*status),
            Outcome::Failed(ProtocolError::Wire(_)) => End::Wire,
            Outcome::Failed(ProtocolError::Peer(_)) => End::Peer,
            Outcome::Failed(ProtocolError::Timeout { .. }) => End::Timeout,
            Outcome::Failed(ProtocolError::CompletedTwice { .. }) => End::Twice,
            Outcome::Failed(ProtocolError::TooSlow { .. }) => End::TooSlow,
            Outcome::Failed(ProtocolError::Unsealed) => End::Unsealed,
            Outcome::Failed(ProtocolError::Cancelled) => End::Cancelled,
            Outcome::Failed(_) => End::Local,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd)]
enum Phase {
    AwaitHello,
    Authenticating,
    Opening,
    Proving,
    Data,
    Finalizing,
    Done,
}

/// The receiver as `docs/protocol.md` ("Receiver states", "What the receiver checks on every
/// WRITE arrival", "Data plane", "Authorization", "Resuming") describes it.
#[derive(Debug)]
struct Spec {
    cfg: ReceiverConfig,
    /// The secret's bytes, and the nonce of the CHALLENGE.
    key: Option<Vec<u8>>,
    nonce: Nonce,
    /// The file the HELLO offered, while the sender proves the secret.
    offered: Option<Offered>,
    /// The HELLO's resume key, when both sides resume.
    resume_key: Option<u64>,
    /// The bytes held before the session: chunk `n` is at `base + n * slot_size`.
    base: u64,
    /// Whether the sender must prove `base` bytes before the GRANT ("Resuming").
    expect: bool,
    /// `CANCEL` when the HELLO offered it: granted back.
    cancel: u32,
    /// The sender sent CANCEL: the session ends once the chunks that arrived are stored.
    cancelled: bool,
    /// The ring of the Ready, kept for the GRANT while the sender proves its prefix.
    ring: Option<(u64, u32)>,
    phase: Phase,
    session: u64,
    size: u64,
    slot_size: u32,
    slot_count: u32,
    chunks: u64,
    arrived: u64,
    stored: u64,
    credited: u64,
    fin: Option<Vec<u8>>,
    /// The digest granted: its capability bit and its size.
    digest: (u32, usize),
    opened: bool,
    progress: Instant,
    /// The sender's pace since the GRANT: when the window began, and the bytes written in it.
    pace: Option<(Instant, u64)>,
    out: Vec<Step>,
    /// Once the sender proved the secret: the key and next number of its messages, and of the
    /// receiver's.
    seal_in: Option<([u8; 32], u64)>,
    seal_out: Option<([u8; 32], u64)>,
}

impl Spec {
    fn new(conf: &Conf, now: Instant) -> Spec {
        Spec {
            cfg: conf.cfg.clone(),
            key: conf.key.clone(),
            nonce: conf.nonce,
            offered: None,
            resume_key: None,
            base: 0,
            expect: false,
            cancel: 0,
            cancelled: false,
            ring: None,
            phase: Phase::AwaitHello,
            session: 0,
            size: 0,
            slot_size: 0,
            slot_count: 0,
            chunks: 0,
            arrived: 0,
            stored: 0,
            credited: 0,
            fin: None,
            digest: (0, 0),
            opened: false,
            progress: now,
            pace: None,
            out: Vec::new(),
            seal_in: None,
            seal_out: None,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        // A peer not yet admitted (before its HELLO, and while it proves the secret) has its own
        // bound (`hello_timeout`); every later phase the phase timeout.
        let admitting = matches!(self.phase, Phase::AwaitHello | Phase::Authenticating);
        let timeout = if admitting { self.cfg.hello_timeout } else { self.cfg.timeout };
        let running = matches!(
            self.phase,
            Phase::AwaitHello | Phase::Authenticating | Phase::Opening | Phase::Proving | Phase::Data
        );
        let phase = running.then(|| self.progress.checked_add(timeout)).flatten();
        match (phase, self.pace_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// "Pace": once per `timeout` of the data phase (from the GRANT) the sender must have
    /// written `min_rate` bytes per second of it. In a single file no step of the driver's
    /// (opening, syncing) falls inside the data phase, so all of a window is the peer's.
    fn pace_deadline(&self) -> Option<Instant> {
        let (start, _) = self.pace.filter(|_| self.cfg.min_rate > 0 && self.phase == Phase::Data)?;
        start.checked_add(self.cfg.timeout)
    }

    fn ack(&mut self, status: Status) {
        // "bytes the receiver stored": those held from before and those stored since.
        let received = self.base.saturating_add(self.stored * u64::from(self.slot_size)).min(self.size);
        self.out.push(Step::Ack { session: self.session, status, received });
    }

    fn finish(&mut self, end: End) {
        self.phase = Phase::Done;
        self.out.push(Step::Finish(end));
    }

    /// A failure: the temporary goes, the peer hears `ack` if it has a session.
    fn fail(&mut self, end: End, ack: Option<Status>) {
        if self.opened {
            self.out.push(Step::Discard);
        }
        if let Some(s) = ack {
            if self.phase != Phase::AwaitHello {
                self.ack(s);
            }
        }
        self.finish(end);
    }

    fn refuse(&mut self, status: Status) {
        self.ack(status);
        self.finish(End::Acked(status));
    }

    fn timeout(&mut self, now: Instant) -> Vec<Step> {
        if self.pace_deadline().is_some_and(|d| now >= d) {
            let (start, bytes) = self.pace.expect("a pace deadline has a window");
            let owed = u128::from(self.cfg.min_rate) * now.saturating_duration_since(start).as_millis() / 1000;
            if u128::from(bytes) < owed {
                self.fail(End::TooSlow, Some(Status::Busy));
                return std::mem::take(&mut self.out);
            }
            self.pace = Some((now, 0));
        }
        if self.deadline().is_some_and(|d| now >= d) {
            self.fail(End::Timeout, None);
        }
        std::mem::take(&mut self.out)
    }

    fn handle(&mut self, input: &Input<'_>, now: Instant) -> Vec<Step> {
        if self.phase == Phase::Done || (self.phase == Phase::Finalizing && !matches!(input, Input::Finalized(..))) {
            return Vec::new();
        }
        let peer = |s: &mut Spec, end| s.fail(end, Some(Status::ProtocolMismatch));
        let bug = |s: &mut Spec| s.fail(End::Local, Some(Status::Internal));
        match *input {
            Input::Message(bytes) => match self.unseal(bytes) {
                // Changed on the path, or not from the peer that proved the secret: no verdict.
                Err(End::Unsealed) => self.fail(End::Unsealed, None),
                Err(end) => peer(self, end),
                Ok((h, _)) if self.phase != Phase::AwaitHello && h.session != self.session => peer(self, End::Peer),
                Ok((h, Message::Hello(hello))) if self.phase == Phase::AwaitHello => self.hello(h.session, hello, now),
                Ok((_, Message::Proof(p))) if self.phase == Phase::Authenticating => self.proof(&p, now),
                Ok((_, Message::Proof(p))) if self.phase == Phase::Proving => self.prefix_proof(&p, now),
                // The sender's send was cancelled: no verdict, once the chunks that arrived are
                // stored (below).
                Ok((_, Message::Cancel(_))) if self.phase != Phase::AwaitHello => self.cancelled = true,
                Ok((h, Message::Fin(fin))) if self.phase == Phase::Data && self.fin.is_none() => {
                    let _ = h;
                    let fits = fin.chunks == self.chunks && fin.size == self.size && fin.chunks == self.arrived;
                    if !fits || fin.digest.len() != self.digest.1 {
                        peer(self, End::Peer);
                    } else {
                        self.fin = Some(fin.digest);
                        self.progress = now;
                    }
                }
                Ok(_) => peer(self, End::Peer),
            },
            // The chunk that arrived last, again: the device's duplicate (or a peer's), which ends
            // the session without a verdict.
            Input::WriteArrived { imm, .. }
                if self.phase == Phase::Data
                    && self.fin.is_none()
                    && self.arrived < self.chunks
                    && self.arrived >= 1
                    && imm == (self.arrived - 1) as u32 =>
            {
                self.fail(End::Twice, None)
            }
            Input::WriteArrived { imm, len } => {
                let seq = self.arrived;
                let ok = self.phase == Phase::Data
                    && self.fin.is_none()
                    && seq < self.chunks
                    && imm == seq as u32
                    && seq < self.credited + u64::from(self.slot_count)
                    && u64::from(len)
                        == (self.size - self.base - seq * u64::from(self.slot_size)).min(u64::from(self.slot_size));
                if !ok {
                    peer(self, End::Peer);
                } else {
                    self.arrived += 1;
                    self.progress = now;
                    if let Some((_, bytes)) = self.pace.as_mut() {
                        *bytes += u64::from(len);
                    }
                    let slot = (seq % u64::from(self.slot_count)) as u32;
                    let offset = self.base + seq * u64::from(self.slot_size);
                    self.out.push(Step::Store { seq, slot, offset, len });
                }
            }
            // Resuming: the driver holds the first `from` bytes; only the rest is asked for. A
            // `from` past the end is the driver's bug.
            Input::Resumed { from, .. } if self.phase == Phase::Opening && self.resume_key.is_some() => {
                if from > self.size {
                    bug(self)
                } else {
                    self.base = from;
                    self.expect = from > 0;
                    self.chunks = (self.size - from).div_ceil(u64::from(self.slot_size));
                }
            }
            // Resuming from bytes held: the sender proves them first ("Resuming").
            Input::Ready { addr, rkey } if self.phase == Phase::Opening && self.base > 0 && self.expect => {
                self.opened = true;
                self.phase = Phase::Proving;
                self.progress = now;
                self.ring = Some((addr, rkey));
                let claim = PrefixClaim { index: 0, from: self.base };
                self.out.push(Step::PrefixChallenge { session: self.session, nonce: self.nonce, claim });
            }
            Input::Ready { addr, rkey } if self.phase == Phase::Opening => self.grant(addr, rkey, now),
            // A failure the driver calls Ok is its bug: the verdict must not say Ok.
            Input::OpenFailed(s, _) if self.phase == Phase::Opening => {
                self.refuse(if s == Status::Ok { Status::Internal } else { s })
            }
            Input::ChunkStored { seq } if self.phase == Phase::Data && seq == self.stored && seq < self.arrived => {
                self.stored += 1;
                self.progress = now;
            }
            Input::StoreFailed(s, _) if self.phase == Phase::Data => {
                self.fail(End::Local, Some(if s == Status::Ok { Status::Internal } else { s }))
            }
            Input::Finalized(s, _) if self.phase == Phase::Finalizing => {
                if s != Status::Ok {
                    self.out.push(Step::Discard);
                }
                self.ack(s);
                self.finish(End::Acked(s));
            }
            _ => bug(self),
        }
        if self.cancelled && self.stored >= self.arrived && !matches!(self.phase, Phase::Done | Phase::Finalizing) {
            self.fail(End::Cancelled, None);
            return std::mem::take(&mut self.out);
        }
        if self.phase == Phase::Data {
            let batch = u64::from(self.slot_count / 4).max(1);
            let pending = self.stored - self.credited;
            if pending > 0 && (pending >= batch || self.stored == self.arrived) {
                self.credited = self.stored;
                self.out.push(Step::Credit { session: self.session, consumed: self.credited });
            }
            if self.stored == self.chunks {
                if let Some(digest) = self.fin.take() {
                    self.phase = Phase::Finalizing;
                    self.out.push(Step::Finalize(digest));
                }
            }
        }
        std::mem::take(&mut self.out)
    }

    /// The GRANT: the data phase, resuming from `base`.
    fn grant(&mut self, addr: u64, rkey: u32, now: Instant) {
        self.opened = true;
        self.phase = Phase::Data;
        self.progress = now;
        self.pace = Some((now, 0));
        // The capabilities used: the digest, AUTH with a secret (the sender offered it, or
        // it would have been refused), RESUME when both sides resume.
        let auth = if self.key.is_some() { caps::AUTH | caps::SEALED } else { 0 };
        let resume = if self.resume_key.is_some() { caps::RESUME } else { 0 };
        let grant = Grant {
            version: 1,
            caps: self.digest.0 | auth | resume | self.cancel,
            addr,
            rkey,
            slot_size: self.slot_size,
            slot_count: self.slot_count,
            resume_from: self.base,
            lanes: None,
        };
        self.out.push(Step::Grant { session: self.session, grant });
    }

    /// The sender's proof of the prefix ("Resuming"): the receiver's nonce and the driver's
    /// proof resume from `base`; anything else starts the file over from byte 0, the partial
    /// left alone.
    fn prefix_proof(&mut self, p: &Proof, now: Instant) {
        let Some((addr, rkey)) = self.ring else { return self.fail(End::Local, Some(Status::Internal)) };
        self.expect = false;
        if p.nonce == self.nonce && p.mac == PREFIX {
            return self.grant(addr, rkey, now);
        }
        self.progress = now;
        self.base = 0;
        self.chunks = self.size.div_ceil(u64::from(self.slot_size));
        self.resume_key = None;
        self.phase = Phase::Opening;
        self.out.push(Step::StartOver);
    }

    /// A message from the sender, decoded; once sealed, only with the right tag (the number
    /// used up only then).
    fn unseal(&mut self, bytes: &[u8]) -> Result<(Header, Message), End> {
        let Some((key, n)) = &mut self.seal_in else { return decode(bytes).map_err(|_| End::Wire) };
        let h = decode_header(bytes).map_err(|_| End::Wire)?;
        if !sealed_right(key, *n, &h, bytes) {
            return Err(End::Unsealed);
        }
        *n += 1;
        wire::decode_sealed(bytes).map_err(|_| End::Wire)
    }

    /// A message the machine sent, decoded; once sealed, only with the right tag.
    fn sent(&mut self, bytes: &[u8]) -> Result<(Header, Message), String> {
        let Some((key, n)) = &mut self.seal_out else { return decode(bytes).map_err(|e| format!("{e}")) };
        let h = decode_header(bytes).map_err(|e| format!("{e}"))?;
        if !sealed_right(key, *n, &h, bytes) {
            return Err(format!("message {n} of the receiver is not sealed right: {bytes:?}"));
        }
        *n += 1;
        wire::decode_sealed(bytes).map_err(|e| format!("{e}"))
    }

    fn hello(&mut self, session: u64, h: Hello, now: Instant) {
        self.session = session;
        self.progress = now;
        self.cancel = h.caps & caps::CANCEL;
        // The digest: with a secret and a sender that offers AUTH, keyed BLAKE3 or nothing;
        // otherwise the receiver's preferred one when offered, else XXH64, else XXH3-128.
        let digest = if self.key.is_some() && h.caps & caps::AUTH != 0 {
            Some(caps::DIGEST_BLAKE3).filter(|&d| h.caps & d != 0)
        } else {
            let preferred = self.cfg.digest.cap();
            [preferred, caps::DIGEST_XXH64, caps::DIGEST_XXH3_128].into_iter().find(|&d| h.caps & d != 0)
        };
        self.digest = match digest {
            Some(caps::DIGEST_XXH64) => (caps::DIGEST_XXH64, 8),
            Some(caps::DIGEST_BLAKE3) => (caps::DIGEST_BLAKE3, 32),
            Some(d) => (d, 16),
            None => (0, 0),
        };
        // With a secret and AUTH offered, sealed messages are required too.
        let unsealed = self.key.is_some() && h.caps & caps::AUTH != 0 && h.caps & caps::SEALED == 0;
        if h.version_max < 1 || h.version_min > 1 || digest.is_none() || unsealed {
            return self.refuse(Status::ProtocolMismatch);
        }
        if rdma_proto::name::check(&h.name).is_err() {
            return self.refuse(Status::BadName);
        }
        if h.size > self.cfg.max_size {
            return self.refuse(Status::TooLarge);
        }
        if h.chunk == 0 || h.depth == 0 {
            return self.refuse(Status::ProtocolMismatch);
        }
        // slot_size = min(chunk, max_chunk); slot_count = min(depth, max(1, budget / slot_size),
        // max_slots); a configuration of 0 still grants one.
        self.slot_size = h.chunk.min(self.cfg.max_chunk).max(1);
        let fit = (self.cfg.memory_budget / u64::from(self.slot_size)).max(1);
        self.slot_count = u64::from(h.depth).min(fit).min(u64::from(self.cfg.max_slots)).max(1) as u32;
        self.size = h.size;
        self.chunks = h.size.div_ceil(u64::from(self.slot_size));
        // RESUME: the key counts only when the sender offers the capability, with the proof of
        // the prefix (RESUME_PROOF), and this receiver resumes.
        if self.cfg.resume && h.caps & caps::RESUME != 0 && h.caps & caps::RESUME_PROOF != 0 {
            self.resume_key = h.resume;
        }
        if self.key.is_none() {
            return self.open(h.name);
        }
        if h.caps & caps::AUTH == 0 {
            return self.refuse(Status::NotAuthorized);
        }
        // A secret: CHALLENGE, Authenticating; nothing opened yet.
        self.phase = Phase::Authenticating;
        self.offered = Some(Offered { session, size: h.size, name: h.name });
        self.out.push(Step::Challenge { session, nonce: self.nonce });
    }

    /// The sender's PROOF, while authenticating: one that verifies gets the receiver's own and
    /// the Open; any other is NotAuthorized, nothing opened.
    fn proof(&mut self, p: &Proof, now: Instant) {
        let (key, offered) =
            (self.key.clone().expect("authenticating with a key"), self.offered.take().expect("a file"));
        if p.mac != mac(&key, Role::Sender, &offered, &p.nonce, &self.nonce) {
            return self.refuse(Status::NotAuthorized);
        }
        // The PROOF is progress, as the HELLO is. Everything after it is sealed, both ways,
        // the receiver's own PROOF first.
        self.progress = now;
        let (theirs, ours) = seal_keys(&key, self.session, &p.nonce, &self.nonce);
        (self.seal_in, self.seal_out) = (Some((theirs, 0)), Some((ours, 0)));
        let mac = mac(&key, Role::Receiver, &offered, &p.nonce, &self.nonce);
        self.out.push(Step::Proof { session: self.session, nonce: self.nonce, mac });
        self.open(offered.name);
    }

    fn open(&mut self, name: String) {
        self.phase = Phase::Opening;
        self.out.push(Step::Open { name, size: self.size, slot_size: self.slot_size, slot_count: self.slot_count });
    }
}

// ---- The receiver: what users rely on, whatever the rules say. ----

/// Watches the actions of one receiver against the inputs it was given.
#[derive(Debug, Default)]
struct Watch {
    /// The receiver's secret (as the MAC keys it), its nonce, and whether it resumes.
    key: Option<Vec<u8>>,
    nonce: Nonce,
    resume: bool,
    /// The HELLO the machine took (the first one given).
    hello: Option<Hello>,
    /// The CHALLENGE sent: its nonce.
    challenge: Option<Nonce>,
    /// The receiver's own PROOF was sent.
    proved: bool,
    /// A PROOF of the sender's was answered NotAuthorized.
    auth_failed: bool,
    /// The driver's last `Resumed` answer the machine may take (resuming, while opening, within
    /// the file).
    resumed: Option<u64>,
    /// The Open asked for: (size, slot_size, slot_count).
    open: Option<(u64, u32, u32)>,
    /// The GRANT sent: the file is open and the ring lent.
    grant: Option<Grant>,
    /// The prefix CHALLENGE sent (its nonce), and the ring of the Ready it answered.
    prefix: Option<Nonce>,
    ring: Option<(u64, u32)>,
    /// The sender's proof of the prefix was wrong: the file started over, resuming nothing.
    started_over: bool,
    /// The session of the first HELLO given (the one the machine takes).
    session: Option<u64>,
    /// Chunks the machine asked to store, in order.
    stores: u64,
    /// The stores the driver reported done (a prefix of `stores`: the chunks out of the ring).
    stored: Vec<bool>,
    credit: u64,
    /// FINs of the session given after the GRANT and before the commit was asked for.
    fins: Vec<Fin>,
    finalize: Option<Vec<u8>>,
    /// The driver's answer to the Finalize.
    committed: Option<Status>,
    discarded: bool,
    ack: Option<Status>,
    finish: Option<End>,
}

impl Watch {
    fn new(conf: &Conf) -> Watch {
        Watch { key: conf.key.clone(), nonce: conf.nonce, resume: conf.cfg.resume, ..Watch::default() }
    }

    fn stored_prefix(&self) -> u64 {
        self.stored.iter().take_while(|s| **s).count() as u64
    }

    /// The digest the session must use: with a secret and a HELLO that offers AUTH, keyed
    /// BLAKE3 (when offered); otherwise the receiver's preferred one when the HELLO offers it,
    /// else XXH64, else XXH3-128 (`None`: it offers none it may use, and is refused).
    fn digest(&self, cfg: &ReceiverConfig) -> Option<Digest> {
        let offered = self.hello.as_ref()?.caps;
        if self.key.is_some() && offered & caps::AUTH != 0 {
            return Some(Digest::Blake3Keyed).filter(|d| offered & d.cap() != 0);
        }
        [cfg.digest, Digest::Xxh64, Digest::Xxh3_128].into_iter().find(|d| offered & d.cap() != 0)
    }

    /// The bytes held before the session: chunk `n` goes to `base + n * slot_size`.
    fn base(&self) -> u64 {
        self.grant.map_or(self.resumed.unwrap_or(0), |g| g.resume_from)
    }

    /// Chunks the sender is to WRITE, once the ring is granted.
    fn chunks(&self) -> u64 {
        self.open.map_or(0, |(size, slot_size, _)| size.saturating_sub(self.base()).div_ceil(u64::from(slot_size)))
    }

    /// The file the HELLO offered, as a proof covers it.
    fn offered(&self) -> Option<Offered> {
        let (h, session) = (self.hello.as_ref()?, self.session?);
        Some(Offered { session, size: h.size, name: h.name.clone() })
    }

    /// Whether the HELLO taken and the configuration make a resumable session: the key the
    /// machine is to hand the driver.
    fn resume_key(&self) -> Option<u64> {
        let h = self.hello.as_ref()?;
        let offers = h.caps & caps::RESUME != 0 && h.caps & caps::RESUME_PROOF != 0;
        (self.resume && offers && !self.started_over).then_some(h.resume).flatten()
    }

    /// Whether `input` is the sender's right proof of the prefix: the prefix CHALLENGE's nonce
    /// and the proof the driver's lookup named.
    fn right_prefix(&self, input: Option<&Input<'_>>) -> bool {
        let Some(Input::Message(bytes)) = input else { return false };
        // Sealed or not, the body's fields are where decode reads them.
        let proof = decode(bytes).ok().and_then(|(h, m)| match m {
            Message::Proof(p) if Some(h.session) == self.session => Some(p),
            _ => None,
        });
        self.prefix.is_some_and(|n| proof.is_some_and(|p| p.nonce == n && p.mac == PREFIX))
    }

    /// `input` as a PROOF of the session while the receiver authenticates (a CHALLENGE sent,
    /// no proof of its own yet, not over): whether its MAC verifies.
    fn proof_given(&self, input: Option<&Input<'_>>) -> Option<bool> {
        let Some(Input::Message(bytes)) = input else { return None };
        let Ok((h, Message::Proof(p))) = decode(bytes) else { return None };
        if Some(h.session) != self.session || self.challenge.is_none() || self.proved || self.finish.is_some() {
            return None;
        }
        let (key, t) = (self.key.as_ref()?, self.offered()?);
        Some(p.mac == mac(key, Role::Sender, &t, &p.nonce, &self.nonce))
    }

    /// Notes an input before the machine sees it.
    fn input(&mut self, input: &Input<'_>) {
        match *input {
            // The first HELLO names the session (anything else first ends it).
            Input::Message(bytes) if self.session.is_none() && self.finish.is_none() => {
                if let Ok((h, Message::Hello(hello))) = decode(bytes) {
                    self.session = Some(h.session);
                    self.hello = Some(hello);
                }
            }
            // A lookup's answer within the file, while opening a resumable session.
            Input::Resumed { from, .. }
                if self.open.is_some_and(|(size, _, _)| from <= size)
                    && self.grant.is_none()
                    && self.prefix.is_none()
                    && self.finish.is_none()
                    && self.resume_key().is_some() =>
            {
                self.resumed = Some(from);
            }
            Input::Message(bytes) if self.grant.is_some() && self.finalize.is_none() => {
                if let Ok((h, Message::Fin(f))) = decode(bytes) {
                    if Some(h.session) == self.session {
                        self.fins.push(f);
                    }
                }
            }
            Input::ChunkStored { seq } if self.finish.is_none() && self.finalize.is_none() => {
                if let Some(s) = usize::try_from(seq).ok().and_then(|i| self.stored.get_mut(i)) {
                    *s = true;
                }
            }
            Input::Finalized(status, _) if self.finalize.is_some() && self.committed.is_none() => {
                self.committed = Some(status)
            }
            _ => {}
        }
    }

    /// Checks one step's actions; `input` is what caused them (`None`: a timeout).
    fn step(&mut self, cfg: &ReceiverConfig, input: Option<&Input<'_>>, steps: &[Step]) -> Result<(), TestCaseError> {
        let proof = self.proof_given(input);
        for (i, s) in steps.iter().enumerate() {
            ensure!(self.finish.is_none(), "{s:?} after the Finish");
            ensure!(self.ack.is_none() || matches!(s, Step::Discard | Step::Finish(_)), "{s:?} after the ACK");
            if self.finalize.is_some() {
                let answered = self.committed.is_some();
                ensure!(
                    answered && matches!(s, Step::Discard | Step::Ack { .. } | Step::Finish(_)),
                    "{s:?} while the commit asked for is the driver's"
                );
                ensure!(
                    !matches!(s, Step::Discard) || self.committed != Some(Status::Ok),
                    "a Discard of a file committed"
                );
            }
            match s {
                Step::Challenge { session, nonce } => {
                    ensure!(self.key.is_some(), "a CHALLENGE without a secret");
                    ensure!(self.challenge.is_none() && self.open.is_none(), "a CHALLENGE out of place");
                    ensure!(steps.len() == 1, "a CHALLENGE among {steps:?}");
                    let offers = self.hello.as_ref().is_some_and(|h| h.caps & caps::AUTH != 0);
                    let hello =
                        matches!(input, Some(Input::Message(b)) if matches!(decode(b), Ok((_, Message::Hello(_)))));
                    ensure!(hello && offers, "a CHALLENGE answering {input:?}");
                    ensure!(*nonce == self.nonce, "a CHALLENGE with the nonce {nonce:?}, not the receiver's");
                    ensure!(Some(*session) == self.session, "a CHALLENGE of session {session:#x}");
                    self.challenge = Some(*nonce);
                }
                Step::Proof { session, nonce, mac: m } => {
                    // Never before the sender's proof verified: a receiver's proof is what a
                    // sender trusts it by.
                    ensure!(proof == Some(true) && i == 0, "the receiver's PROOF answering {input:?}");
                    ensure!(*nonce == self.nonce, "the receiver's PROOF with the nonce {nonce:?}");
                    let Some(Input::Message(bytes)) = input else { unreachable!() };
                    let Ok((_, Message::Proof(theirs))) = decode(bytes) else { unreachable!() };
                    let (key, t) = (self.key.as_ref().expect("a key"), self.offered().expect("a HELLO"));
                    ensure!(*m == mac(key, Role::Receiver, &t, &theirs.nonce, nonce), "the receiver's PROOF is wrong");
                    ensure!(Some(*session) == self.session, "a PROOF of session {session:#x}");
                    self.proved = true;
                }
                Step::Open { name, size, slot_size, slot_count } => {
                    ensure!(self.open.is_none(), "a second Open");
                    ensure!(matches!(input, Some(Input::Message(_))), "an Open without a HELLO");
                    // With a secret nothing is opened before the sender's proof verified (and
                    // the receiver proved it back).
                    ensure!(self.key.is_none() || (self.proved && proof == Some(true)), "an Open without a proof");
                    let h = self.hello.as_ref().expect("a HELLO before an Open");
                    ensure!((name, *size) == (&h.name, h.size), "an Open of {name:?} ({size} bytes), offered {h:?}");
                    ensure!(rdma_proto::name::check(name).is_ok(), "an Open of the name {name:?}");
                    ensure!(*size <= cfg.max_size, "an Open of {size} bytes, max_size {}", cfg.max_size);
                    ensure!(
                        (1..=cfg.max_chunk.max(1)).contains(slot_size),
                        "slots of {slot_size} bytes, max_chunk {}",
                        cfg.max_chunk
                    );
                    ensure!(
                        (1..=cfg.max_slots.max(1)).contains(slot_count),
                        "{slot_count} slots, max_slots {}",
                        cfg.max_slots
                    );
                    let ring = u128::from(*slot_size) * u128::from(*slot_count);
                    let bound = u128::from(cfg.memory_budget).max(u128::from(*slot_size));
                    ensure!(ring <= bound, "a ring of {ring} bytes, memory_budget {}", cfg.memory_budget);
                    self.open = Some((*size, *slot_size, *slot_count));
                }
                Step::PrefixChallenge { session, nonce, claim } => {
                    ensure!(self.grant.is_none() && self.prefix.is_none(), "a prefix CHALLENGE out of place");
                    let Some(&Input::Ready { addr, rkey }) = input else {
                        return Err(TestCaseError::fail(format!("a prefix CHALLENGE answering {input:?}")));
                    };
                    ensure!(
                        claim.index == 0 && claim.from > 0 && self.resumed == Some(claim.from),
                        "a prefix CHALLENGE of {claim:?}, the driver holds {:?}",
                        self.resumed
                    );
                    ensure!(*nonce == self.nonce, "a prefix CHALLENGE with the nonce {nonce:?}, not the receiver's");
                    ensure!(Some(*session) == self.session, "a prefix CHALLENGE of session {session:#x}");
                    (self.prefix, self.ring) = (Some(*nonce), Some((addr, rkey)));
                }
                Step::StartOver => {
                    ensure!(self.prefix.is_some() && self.grant.is_none(), "a start over out of place");
                    ensure!(!self.right_prefix(input), "a right proof of the prefix started the file over");
                    ensure!(steps.len() == 1, "a start over among {steps:?}");
                    (self.started_over, self.resumed) = (true, None);
                }
                Step::Grant { session, grant } => {
                    ensure!(self.grant.is_none(), "a second GRANT");
                    let Some((_, slot_size, slot_count)) = self.open else {
                        return Err(TestCaseError::fail("a GRANT without an Open"));
                    };
                    let (addr, rkey) = match input {
                        Some(&Input::Ready { addr, rkey }) => (addr, rkey),
                        // Resuming: the GRANT answers the sender's right proof of the prefix.
                        _ if self.right_prefix(input) && !self.started_over => self.ring.expect("a ring"),
                        _ => return Err(TestCaseError::fail(format!("a GRANT answering {input:?}"))),
                    };
                    ensure!(
                        grant.resume_from == 0 || self.right_prefix(input),
                        "a GRANT resuming at {} without a proof of those bytes",
                        grant.resume_from
                    );
                    ensure!(self.key.is_none() || self.proved, "a GRANT without the receiver's proof");
                    let auth = if self.key.is_some() { caps::AUTH | caps::SEALED } else { 0 };
                    let resume = if self.resume_key().is_some() { caps::RESUME } else { 0 };
                    // Resuming at what the driver answered, and only then.
                    let Some(digest) = self.digest(cfg) else {
                        return Err(TestCaseError::fail("a GRANT for a HELLO that offers no digest"));
                    };
                    let cancel = self.hello.as_ref().map_or(0, |h| h.caps & caps::CANCEL);
                    let want = Grant {
                        version: 1,
                        caps: digest.cap() | auth | resume | cancel,
                        addr,
                        rkey,
                        slot_size,
                        slot_count,
                        resume_from: self.resumed.unwrap_or(0),
                        lanes: None,
                    };
                    ensure!(*grant == want, "GRANT {grant:?}, the ring is {want:?}");
                    ensure!(Some(*session) == self.session, "a GRANT of session {session:#x}");
                    self.grant = Some(*grant);
                }
                Step::Credit { session, consumed } => {
                    ensure!(self.grant.is_some(), "a CREDIT before the GRANT");
                    ensure!(Some(*session) == self.session, "a CREDIT of session {session:#x}");
                    ensure!(*consumed > self.credit, "CREDIT {consumed} after {}", self.credit);
                    // A credit lets the sender overwrite the slots: only of chunks stored.
                    ensure!(
                        *consumed <= self.stored_prefix(),
                        "CREDIT {consumed} with {} chunks stored",
                        self.stored_prefix()
                    );
                    self.credit = *consumed;
                }
                Step::Store { seq, slot, offset, len } => {
                    let (Some((size, slot_size, count)), Some(_)) = (self.open, self.grant) else {
                        return Err(TestCaseError::fail("a StoreChunk before the GRANT"));
                    };
                    ensure!(self.fins.is_empty(), "a StoreChunk after the FIN");
                    let Some(&Input::WriteArrived { imm, len: wlen }) = input else {
                        return Err(TestCaseError::fail(format!("a StoreChunk answering {input:?}")));
                    };
                    ensure!(i == 0 && steps.len() == 1, "a StoreChunk among {steps:?}");
                    ensure!(
                        *seq == self.stores && imm == *seq as u32 && wlen == *len,
                        "StoreChunk {seq} for WRITE imm {imm} of {wlen} bytes, {} stored before",
                        self.stores
                    );
                    ensure!(
                        *slot < count && u64::from(*slot) == seq % u64::from(count),
                        "chunk {seq} in slot {slot} of {count}"
                    );
                    let want = size.saturating_sub(*offset).min(u64::from(slot_size));
                    let base = self.base();
                    ensure!(
                        *offset == base + seq * u64::from(slot_size) && u64::from(*len) == want && want > 0,
                        "chunk {seq}: {len} bytes at {offset} of a {size}-byte file resumed at {base}"
                    );
                    ensure!(
                        offset.checked_add(u64::from(*len)).is_some_and(|end| end <= size),
                        "chunk {seq} past the end"
                    );
                    // The slot's previous chunk left the ring and was credited.
                    ensure!(
                        *seq < self.credit + u64::from(count),
                        "chunk {seq} into a slot credited up to {}",
                        self.credit
                    );
                    self.stores += 1;
                    self.stored.push(false);
                }
                Step::Finalize(digest) => {
                    let Some((size, _, _)) = self.open else {
                        return Err(TestCaseError::fail("a Finalize without an Open"));
                    };
                    let chunks = self.chunks();
                    ensure!(self.grant.is_some() && self.finalize.is_none(), "a Finalize out of place");
                    ensure!(
                        self.stores == chunks && self.stored_prefix() == chunks,
                        "a Finalize with {} of {chunks} chunks stored",
                        self.stored_prefix()
                    );
                    ensure!(self.fins.len() == 1, "a Finalize after {} FINs", self.fins.len());
                    let fin = &self.fins[0];
                    ensure!(
                        (fin.chunks, fin.size, &fin.digest) == (chunks, size, digest)
                            && Some(digest.len()) == self.digest(cfg).map(Digest::size),
                        "a Finalize of {digest:?} after {fin:?}"
                    );
                    self.finalize = Some(digest.clone());
                }
                Step::Discard => {
                    ensure!(self.grant.is_some() || self.prefix.is_some(), "a Discard of a file never opened");
                    ensure!(!self.discarded, "a second Discard");
                    self.discarded = true;
                }
                Step::Ack { session, status, received } => {
                    ensure!(Some(*session) == self.session, "an ACK of session {session:#x}");
                    ensure!(
                        *status != Status::Ok || self.committed == Some(Status::Ok),
                        "ACK Ok, the commit answered {:?}",
                        self.committed
                    );
                    let bytes = self.open.map_or(0, |(size, slot_size, _)| {
                        self.base().saturating_add(self.stored_prefix() * u64::from(slot_size)).min(size)
                    });
                    ensure!(*received == bytes, "an ACK for {received} bytes, {bytes} stored");
                    self.ack = Some(*status);
                }
                Step::Finish(end) => {
                    ensure!(i + 1 == steps.len(), "{:?} after the Finish", &steps[i + 1..]);
                    if let Some(answer) = self.committed {
                        ensure!(
                            *end == End::Acked(answer) && self.ack == Some(answer),
                            "{end:?} (ACK {:?}) for a commit that answered {answer}",
                            self.ack
                        );
                    }
                    ensure!(
                        self.finalize.is_none() || self.committed.is_some(),
                        "{end:?} while the commit asked for is the driver's"
                    );
                    match end {
                        End::Acked(status) => {
                            ensure!(self.ack == Some(*status), "Finish {status} with ACK {:?}", self.ack)
                        }
                        End::Timeout | End::Twice | End::Cancelled => {
                            ensure!(self.ack.is_none(), "{end:?} with an ACK")
                        }
                        End::TooSlow => ensure!(self.ack == Some(Status::Busy), "too slow, ACK {:?}", self.ack),
                        _ => ensure!(self.ack != Some(Status::Ok), "a failure ACKed Ok"),
                    }
                    // Whatever failed, the sender hears it once the session is known, but when
                    // the connection is what failed (a timeout, the device's second completion).
                    if self.open.is_some() && !matches!(end, End::Timeout | End::Twice | End::Cancelled) {
                        ensure!(self.ack.is_some(), "{end:?} after the HELLO without an ACK");
                    }
                    // The temporary stays only under its final name.
                    // (Started over and not yet granted, the new temporary may not have been
                    // made: a failed open is refused with nothing to discard.)
                    if self.grant.is_some() || (self.prefix.is_some() && !self.started_over) {
                        let kept = *end == End::Acked(Status::Ok);
                        ensure!(
                            self.discarded != kept,
                            "{end:?} with the temporary {}",
                            if self.discarded { "discarded" } else { "kept" }
                        );
                    }
                    self.finish = Some(*end);
                }
            }
        }
        // The sender's proof decides: one that verifies opens (the receiver's proof first), any
        // other is refused as NotAuthorized with nothing opened, and counted.
        match proof {
            Some(true) => {
                ensure!(matches!(steps, [Step::Proof { .. }, Step::Open { .. }]), "a verifying PROOF gave {steps:?}")
            }
            Some(false) => {
                let session = self.session.expect("a session");
                let refused = [
                    Step::Ack { session, status: Status::NotAuthorized, received: 0 },
                    Step::Finish(End::Acked(Status::NotAuthorized)),
                ];
                ensure!(steps == refused, "a wrong PROOF gave {steps:?}");
                self.auth_failed = true;
            }
            None => {}
        }
        Ok(())
    }
}

// ---- The receiver: one case. ----

/// An input, owned (the machine's borrows its bytes).
#[derive(Debug, Clone)]
enum In {
    Message(Vec<u8>),
    Write { imm: u32, len: u32 },
    Ready { addr: u64, rkey: u32 },
    Resumed(u64),
    OpenFailed(Status),
    Stored(u64),
    StoreFailed(Status),
    Finalized(Status),
}

impl In {
    fn input(&self) -> Input<'_> {
        let why = || "the fuzzer's driver".to_owned();
        match self {
            In::Message(b) => Input::Message(b),
            In::Write { imm, len } => Input::WriteArrived { imm: *imm, len: *len },
            In::Ready { addr, rkey } => Input::Ready { addr: *addr, rkey: *rkey },
            In::Resumed(from) => Input::Resumed { from: *from, proof: PREFIX },
            In::OpenFailed(s) => Input::OpenFailed(*s, why()),
            In::Stored(seq) => Input::ChunkStored { seq: *seq },
            In::StoreFailed(s) => Input::StoreFailed(*s, why()),
            In::Finalized(s) => Input::Finalized(*s, why()),
        }
    }
}

struct Case {
    r: Receiver,
    spec: Spec,
    /// Messages sealed so far as the sender (the number of the next one).
    sealed_sent: u64,
    watch: Watch,
    cfg: ReceiverConfig,
    conf: Conf,
    offer: Offer,
    now: Instant,
    /// Requests the harness's driver has not answered: the open, the stores, the commit.
    open_asked: bool,
    /// The honest driver answered the resume lookup.
    looked_up: bool,
    /// The honest sender sent its PROOF.
    proof_sent: bool,
    /// Whether the honest sender proved the prefix.
    prefix_sent: bool,
    stores_asked: VecDeque<u64>,
    finalize_asked: bool,
    fin_sent: bool,
}

/// The ring the harness's driver lends.
const RING_ADDR: u64 = 0x7f3a_0000_4000;
const RKEY: u32 = 0xbeef;

impl Case {
    fn new(conf: Conf, offer: Offer) -> Case {
        let now = Instant::now();
        Case {
            r: Receiver::new(conf.cfg.clone(), now).with_nonce(conf.nonce),
            spec: Spec::new(&conf, now),
            sealed_sent: 0,
            watch: Watch::new(&conf),
            cfg: conf.cfg.clone(),
            conf,
            offer,
            now,
            open_asked: false,
            looked_up: false,
            proof_sent: false,
            prefix_sent: false,
            stores_asked: VecDeque::new(),
            finalize_asked: false,
            fin_sent: false,
        }
    }

    fn session(&self, sid: Sid) -> u64 {
        match sid {
            Sid::Ours => self.offer.session,
            Sid::Zero => 0,
            Sid::Other(s) => s,
        }
    }

    /// (size, slot_size, slot_count) once the ring is granted.
    fn geometry(&self) -> Option<(u64, u32, u32)> {
        self.watch.open.filter(|_| self.watch.grant.is_some())
    }

    fn chunk_len(&self, seq: u64) -> u32 {
        let Some((size, slot_size, _)) = self.geometry() else { return self.offer.chunk };
        let offset = self.watch.base().saturating_add(seq.saturating_mul(u64::from(slot_size)));
        size.saturating_sub(offset).min(u64::from(slot_size)) as u32
    }

    /// `m` of session `sid`, mutated; once the session is sealed, sealed after the mutations
    /// (as a sender with the secret seals what it sends).
    fn bytes(&mut self, sid: Sid, m: &Message, muts: &[Mutation]) -> Vec<u8> {
        let mut b = Vec::new();
        if encode(self.session(sid), m, &mut b).is_err() {
            b.clear();
        }
        for mu in muts {
            mutate(&mut b, mu);
        }
        if let Some((key, _)) = self.spec.seal_in {
            seal(&key, self.sealed_sent, &mut b);
            self.sealed_sent += 1;
        }
        b
    }

    fn fin(&self, chunks_by: i8, size_by: i8, digest_len: u8) -> Message {
        let (size, slot_size) = self.geometry().map_or((self.offer.size, self.offer.chunk), |(s, z, _)| (s, z));
        let chunks = size.saturating_sub(self.watch.base()).div_ceil(u64::from(slot_size));
        Message::Fin(Fin {
            chunks: chunks.wrapping_add_signed(i64::from(chunks_by)),
            size: size.wrapping_add_signed(i64::from(size_by)),
            digest: vec![0xd1; usize::from(digest_len)],
        })
    }

    /// What an honest sender does next, if anything.
    fn sender(&mut self) -> Option<In> {
        if self.watch.finish.is_some() {
            return None;
        }
        let o = &self.offer;
        if self.watch.session.is_none() {
            // A sender with a secret offers the keyed digest with AUTH.
            let auth = if o.auth == Auth::None { 0 } else { caps::AUTH | caps::DIGEST_BLAKE3 | caps::SEALED };
            let resume = if o.key.is_some() { caps::RESUME | caps::RESUME_PROOF } else { 0 };
            let hello = Hello {
                version_min: 1,
                version_max: 1,
                caps: o.digests | auth | resume,
                size: o.size,
                chunk: o.chunk,
                depth: o.depth,
                name: "f".into(),
                resume: o.key,
                lanes: 1,
            };
            return Some(In::Message(self.bytes(Sid::Ours, &Message::Hello(hello), &[])));
        }
        if let Some(nr) = self.watch.challenge.filter(|_| !self.proof_sent) {
            // Its proof of the secret it holds, for the file it offered.
            self.proof_sent = true;
            let key = self.conf.key.clone().unwrap_or_else(|| NO_KEY.to_vec());
            let key = if o.auth == Auth::Wrong { [&key[..], b"!"].concat() } else { key };
            let t = Offered { session: o.session, size: o.size, name: "f".into() };
            let proof = Proof { nonce: o.nonce, mac: mac(&key, Role::Sender, &t, &o.nonce, &nr) };
            return Some(In::Message(self.bytes(Sid::Ours, &Message::Proof(proof), &[])));
        }
        if let Some(nonce) = self.watch.prefix.filter(|_| !self.prefix_sent && self.watch.grant.is_none()) {
            // Its proof of the bytes the receiver holds: it holds them.
            self.prefix_sent = true;
            let mac = if self.offer.other_bytes { [0xa5; PROOF_LEN] } else { PREFIX };
            return Some(In::Message(self.bytes(Sid::Ours, &Message::Proof(Proof { nonce, mac }), &[])));
        }
        let (_, _, count) = self.geometry()?;
        let next = self.watch.stores;
        if next < self.watch.chunks() {
            let credited = next < self.watch.credit + u64::from(count);
            return credited.then(|| In::Write { imm: next as u32, len: self.chunk_len(next) });
        }
        if !self.fin_sent {
            self.fin_sent = true;
            // A digest of the size the GRANT's digest has.
            let len = self.watch.grant.map_or(DIGEST_LEN, |g| Digest::granted(g.caps).map_or(DIGEST_LEN, Digest::size));
            return Some(In::Message(self.bytes(Sid::Ours, &self.fin(0, 0, len as u8), &[])));
        }
        None
    }

    /// A PROOF of the sender's nonce `ns`, forged as `forge` says, for the HELLO the machine
    /// took (else the honest sender's) and the receiver's nonce.
    fn forge(&self, forge: &Forge, ns: &Nonce) -> Proof {
        let key = self.conf.key.clone().unwrap_or_else(|| NO_KEY.to_vec());
        let o = &self.offer;
        let t = self.watch.offered().unwrap_or_else(|| Offered { session: o.session, size: o.size, name: "f".into() });
        let nr = self.conf.nonce;
        let valid = |t: &Offered, ns: &Nonce, nr: &Nonce| mac(&key, Role::Sender, t, ns, nr);
        let (nonce, m) = match forge {
            Forge::Valid => (*ns, valid(&t, ns, &nr)),
            Forge::EchoedNonce => (nr, valid(&t, &nr, &nr)),
            Forge::Flip(i, bit) => {
                let mut m = valid(&t, ns, &nr);
                m[i.index(PROOF_LEN)] ^= 1 << bit;
                (*ns, m)
            }
            Forge::WrongSecret => (*ns, mac(&[&key[..], b"!"].concat(), Role::Sender, &t, ns, &nr)),
            Forge::Reflected => (*ns, mac(&key, Role::Receiver, &t, ns, &nr)),
            Forge::OtherSession(other) => {
                let session = if *other == t.session { other ^ 1 } else { *other };
                (*ns, valid(&Offered { session, ..t.clone() }, ns, &nr))
            }
            Forge::OtherFile(by_size) => {
                let other = if *by_size {
                    Offered { size: t.size.wrapping_add(1), ..t.clone() }
                } else {
                    Offered { name: format!("{}x", t.name), ..t.clone() }
                };
                (*ns, valid(&other, ns, &nr))
            }
            Forge::Replayed(old) => {
                let mut old = *old;
                if old == nr {
                    old[0] ^= 1;
                }
                (*ns, valid(&t, ns, &old))
            }
            Forge::Junk(m) => (*ns, *m),
        };
        Proof { nonce, mac: m }
    }

    /// What an honest driver does next, if anything.
    fn driver(&self, commit: Status) -> Option<In> {
        if self.open_asked {
            // A resumable session: the lookup's answer (if it found a partial) before the ring.
            let (size, slot_size, _) = self.watch.open?;
            match &self.offer.held {
                Some(held) if self.r.resume_key().is_some() && !self.looked_up => {
                    Some(In::Resumed(held.of(size, slot_size)))
                }
                _ => Some(In::Ready { addr: RING_ADDR, rkey: RKEY }),
            }
        } else if let Some(&seq) = self.stores_asked.front() {
            Some(In::Stored(seq))
        } else {
            self.finalize_asked.then_some(In::Finalized(commit))
        }
    }

    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let next = self.watch.stores;
        let input = match op {
            Op::Sender => self.sender(),
            Op::Driver(commit) => self.driver(*commit),
            Op::Hello(sid, h, muts) => Some(In::Message(self.bytes(*sid, &Message::Hello(h.clone()), muts))),
            Op::Fin { sid, chunks_by, size_by, digest_len, muts } => {
                Some(In::Message(self.bytes(*sid, &self.fin(*chunks_by, *size_by, *digest_len), muts)))
            }
            Op::Message(sid, m, muts) => Some(In::Message(self.bytes(*sid, m, muts))),
            Op::Bytes(b) => Some(In::Message(b.clone())),
            Op::Write { imm_by, len_by } => Some(In::Write {
                imm: (next as u32).wrapping_add_signed(i32::from(*imm_by)),
                len: self.chunk_len(next).wrapping_add_signed(i32::from(*len_by)),
            }),
            Op::RawWrite { imm, len } => Some(In::Write { imm: *imm, len: *len }),
            Op::Ready { addr, rkey } => Some(In::Ready { addr: *addr, rkey: *rkey }),
            Op::OpenFailed(s) => Some(In::OpenFailed(*s)),
            Op::Stored(seq) => Some(In::Stored(match *seq {
                Seq::Oldest => self.stores_asked.front().copied().unwrap_or(next),
                Seq::Next => next,
                Seq::By(by) => self.watch.stored_prefix().wrapping_add_signed(i64::from(by)),
                Seq::Any(s) => s,
            })),
            Op::StoreFailed(s) => Some(In::StoreFailed(*s)),
            Op::Finalized(s) => Some(In::Finalized(*s)),
            Op::Proof { sid, forge, nonce, muts } => {
                Some(In::Message(self.bytes(*sid, &Message::Proof(self.forge(forge, nonce)), muts)))
            }
            Op::Resumed(lookup) => {
                let (size, slot_size) = self.watch.open.map_or((self.offer.size, self.offer.chunk), |(s, z, _)| (s, z));
                Some(In::Resumed(match lookup {
                    Lookup::Held(h) => h.of(size, slot_size),
                    Lookup::Any(from) => *from,
                }))
            }
            Op::Time(t) => return self.tick(t),
        };
        match input {
            Some(input) => self.give(&input),
            // The honest side waits: time passes.
            None => self.tick(&Tick::By(Duration::from_millis(1))),
        }
    }

    fn give(&mut self, input: &In) -> Result<(), TestCaseError> {
        let want = self.spec.handle(&input.input(), self.now);
        self.watch.input(&input.input());
        match input {
            In::Ready { .. } | In::OpenFailed(_) => self.open_asked = false,
            In::Resumed(_) => self.looked_up = true,
            In::Stored(seq) => self.stores_asked.retain(|s| s != seq),
            In::Finalized(_) => self.finalize_asked = false,
            _ => {}
        }
        self.r.handle(input.input(), self.now);
        let got = self.actions()?;
        self.check(Some(&input.input()), want, got)
    }

    fn tick(&mut self, t: &Tick) -> Result<(), TestCaseError> {
        let deadline = self.r.poll_timeout();
        match t {
            Tick::By(d) => self.now = self.now.checked_add(*d).unwrap_or(self.now),
            Tick::JustBefore => {
                if let Some(d) = deadline.and_then(|d| d.checked_sub(Duration::from_nanos(1))) {
                    self.now = self.now.max(d);
                }
            }
            Tick::AtDeadline => self.now = self.now.max(deadline.unwrap_or(self.now)),
            Tick::Past(d) => {
                let later = self.now.checked_add(*d).or_else(|| self.now.checked_add(Duration::from_secs(1 << 32)));
                self.now = later.unwrap_or(self.now);
            }
        }
        let want = self.spec.timeout(self.now);
        self.r.handle_timeout(self.now);
        let got = self.actions()?;
        if deadline.map_or(true, |d| self.now < d) {
            ensure!(got.is_empty(), "a timeout before the deadline {deadline:?} gave {got:?}");
        }
        self.check(None, want, got)
    }

    /// The machine's actions, each message sent decoded.
    fn actions(&mut self) -> Result<Vec<Step>, TestCaseError> {
        let mut steps = Vec::new();
        let mut buf = Vec::new();
        while let Some(a) = self.r.poll_action() {
            steps.push(match a {
                Action::Open { name, size, slot_size, slot_count } => {
                    self.open_asked = true;
                    Step::Open { name, size, slot_size, slot_count }
                }
                Action::Send => {
                    ensure!(self.r.transmit(&mut buf), "a Send without its message");
                    let decoded = self.spec.sent(&buf);
                    match decoded {
                        Ok((h, Message::Challenge(Challenge { nonce, prefix: Some(claim) }))) => {
                            Step::PrefixChallenge { session: h.session, nonce, claim }
                        }
                        Ok((h, Message::Challenge(c))) => Step::Challenge { session: h.session, nonce: c.nonce },
                        Ok((h, Message::Proof(p))) => Step::Proof { session: h.session, nonce: p.nonce, mac: p.mac },
                        Ok((h, Message::Grant(grant))) => Step::Grant { session: h.session, grant },
                        Ok((h, Message::Credit(c))) => Step::Credit { session: h.session, consumed: c.consumed },
                        Ok((h, Message::Ack(a))) => {
                            Step::Ack { session: h.session, status: a.status, received: a.received }
                        }
                        other => return Err(TestCaseError::fail(format!("the receiver sent {other:?}"))),
                    }
                }
                Action::StoreChunk { seq, slot, offset, len } => {
                    self.stores_asked.push_back(seq);
                    Step::Store { seq, slot, offset, len }
                }
                Action::Finalize { digest } => {
                    self.finalize_asked = true;
                    Step::Finalize(digest)
                }
                Action::Discard => Step::Discard,
                Action::StartOver => {
                    // The driver opens a new temporary and answers with the ring again.
                    self.open_asked = true;
                    Step::StartOver
                }
                a @ (Action::Reserve { .. } | Action::OpenEntry(_) | Action::EntryDone { .. }) => {
                    return Err(TestCaseError::fail(format!("{a:?} with batches off")))
                }
                Action::Finish(o) => {
                    (self.open_asked, self.finalize_asked) = (false, false);
                    self.stores_asked.clear();
                    Step::Finish(End::of(&o))
                }
            });
        }
        ensure!(!self.r.transmit(&mut buf), "a message without its Send");
        Ok(steps)
    }

    fn check(&mut self, input: Option<&Input<'_>>, want: Vec<Step>, got: Vec<Step>) -> Result<(), TestCaseError> {
        self.watch.step(&self.cfg, input, &got)?;
        ensure!(got == want, "after {input:?} the machine did\n  {got:?}\nthe protocol says\n  {want:?}");
        let w = &self.watch;
        ensure!(self.r.is_done() == w.finish.is_some(), "is_done {} after a Finish {:?}", self.r.is_done(), w.finish);
        ensure!(
            self.r.auth_failed() == w.auth_failed,
            "auth_failed() {} after {} wrong proof",
            self.r.auth_failed(),
            if w.auth_failed { "a" } else { "no" }
        );
        // A peer counts as served once its HELLO was taken and, with a secret, its proof verified:
        // what a driver's transfer count counts.
        let authorized = w.hello.is_some() && (w.key.is_none() || w.proved);
        ensure!(self.r.authorized() == authorized, "authorized() {}, the watch says {authorized}", self.r.authorized());
        if w.challenge.is_some() || w.open.is_some() {
            ensure!(self.r.resume_key() == w.resume_key(), "resume_key() {:?} for {:?}", self.r.resume_key(), w.hello);
        }
        if let Some(g) = w.grant {
            ensure!(self.r.resumed_from() == g.resume_from, "resumed_from() {} after {g:?}", self.r.resumed_from());
        }
        let deadline = self.r.poll_timeout();
        ensure!(
            deadline == self.spec.deadline(),
            "deadline {deadline:?}, the protocol says {:?}",
            self.spec.deadline()
        );
        if w.finish.is_some() || (w.finalize.is_some() && w.committed.is_none()) {
            ensure!(deadline.is_none(), "a deadline while the session is over or committing");
        }
        // Progress moves the deadline to a timeout from now: the HELLO timeout while the peer
        // proves the secret (after a CHALLENGE), the phase timeout once it is admitted.
        if got.iter().any(|s| matches!(s, Step::Challenge { .. })) {
            ensure!(
                deadline == self.now.checked_add(self.cfg.hello_timeout),
                "deadline {deadline:?} after a CHALLENGE"
            );
        } else if got.iter().any(|s| {
            matches!(
                s,
                Step::Open { .. }
                    | Step::Grant { .. }
                    | Step::Store { .. }
                    | Step::PrefixChallenge { .. }
                    | Step::StartOver
            )
        }) {
            // ... unless the window the sender's pace is judged in ends sooner.
            let phase = self.now.checked_add(self.cfg.timeout);
            let want = match (phase, self.spec.pace_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            ensure!(deadline == want, "deadline {deadline:?} after progress");
        }
        // Nothing stalls: a drained ring is credited, and a FIN with every chunk stored commits.
        if w.grant.is_some() && w.finish.is_none() && w.finalize.is_none() {
            let stored = w.stored_prefix();
            if w.stores == stored {
                ensure!(w.credit == stored, "the ring is drained ({stored} chunks) and credited to {}", w.credit);
            }
            let chunks = w.chunks();
            ensure!(!(w.fins.len() == 1 && stored == chunks), "a FIN, every chunk stored, and no commit asked for");
        }
        Ok(())
    }
}

/// Outcomes over a run, to show that the cases reach every part of the machine.
#[derive(Debug, Default)]
struct Tally {
    ok: Cell<u64>,
    refused: Cell<u64>,
    commit_failed: Cell<u64>,
    peer: Cell<u64>,
    timeout: Cell<u64>,
    /// Sessions ended for a pace below the floor.
    slow: Cell<u64>,
    local: Cell<u64>,
    running: Cell<u64>,
    /// Sessions that reached the GRANT after the proofs of the secret.
    authorized: Cell<u64>,
    /// Of those, sessions stored whole (every message after the proof sealed).
    authorized_ok: Cell<u64>,
    /// Sessions refused for a wrong proof.
    auth_failed: Cell<u64>,
    /// Sessions granted from a held prefix, and those of them stored whole.
    resumed: Cell<u64>,
    resumed_ok: Cell<u64>,
    /// Sessions whose sender did not prove the held prefix: the file started over.
    started_over: Cell<u64>,
}

fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}

#[test]
fn fuzz_the_receiver_machine() {
    let tally = Tally::default();
    // Calm cases, mostly an honest transfer with a few hostile inputs, and stormy ones.
    let ops = prop_oneof![prop::collection::vec(op(150), 0..400), prop::collection::vec(op(20), 0..200)];
    let cases = (receiver_config(), offer(), ops);
    let n = fuzz("receiver machine", 0.7, 128, cases, |(conf, offer, ops)| {
        let mut case = Case::new(conf, offer);
        for op in &ops {
            case.run(op)?;
        }
        let w = &case.watch;
        if w.proved && w.grant.is_some() {
            bump(&tally.authorized);
            if w.finish == Some(End::Acked(Status::Ok)) {
                bump(&tally.authorized_ok);
            }
        }
        if w.auth_failed {
            bump(&tally.auth_failed);
        }
        if w.started_over {
            bump(&tally.started_over);
        }
        if w.grant.is_some_and(|g| g.resume_from > 0) {
            bump(&tally.resumed);
            if w.finish == Some(End::Acked(Status::Ok)) {
                bump(&tally.resumed_ok);
            }
        }
        match w.finish {
            Some(End::Acked(Status::Ok)) => bump(&tally.ok),
            Some(End::Acked(_)) if w.finalize.is_some() => bump(&tally.commit_failed),
            Some(End::Acked(_)) => bump(&tally.refused),
            Some(End::Peer | End::Wire | End::Twice | End::Unsealed | End::Cancelled) => bump(&tally.peer),
            Some(End::Timeout) => bump(&tally.timeout),
            Some(End::TooSlow) => bump(&tally.slow),
            Some(End::Local) => bump(&tally.local),
            None => bump(&tally.running),
        }
        Ok(())
    });
    eprintln!("receiver outcomes: {tally:?}");
    // Every way out is reached (shares measured over 100,000 cases; the floors are far below).
    if n >= 2_000 {
        let share = |c: &Cell<u64>| c.get() * 1000 / n;
        assert!(share(&tally.ok) >= 20 && share(&tally.commit_failed) >= 2 && share(&tally.refused) >= 20, "{tally:?}");
        assert!(share(&tally.peer) >= 20 && share(&tally.timeout) >= 20 && share(&tally.local) >= 20, "{tally:?}");
        assert!(share(&tally.authorized) >= 10 && share(&tally.auth_failed) >= 10, "{tally:?}");
        assert!(share(&tally.authorized_ok) >= 2 && share(&tally.slow) >= 5, "{tally:?}");
        assert!(share(&tally.resumed) >= 10 && share(&tally.resumed_ok) >= 2, "{tally:?}");
        assert!(share(&tally.started_over) >= 2, "{tally:?}");
    }
}
