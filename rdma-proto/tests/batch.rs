//! Batches (capability `BATCH`): the sender and receiver machines of one
//! session move several files and directories over one grant, with a verdict per entry and
//! one summary; a bad entry is refused alone; the session's byte limit holds. A pump without
//! RDMA plays both drivers: messages are delivered in order, a WRITE copies the chunk into the
//! receiver's ring, a store copies the slot into the entry's file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdma_proto::auth::Secret;
use rdma_proto::receiver::{self, Receiver, ReceiverConfig};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{Entry, EntryKind};
use rdma_proto::{Digest, Outcome, ProtocolError, Status};

const SESSION: u64 = 0xba7c;

/// One local entry: a path and its bytes (`None`: a directory).
type Local = (&'static str, Option<Vec<u8>>);

/// What the pump saw: the receiver's files and directories, its per-entry verdicts, the
/// sender's, and both outcomes.
#[derive(Debug, Default)]
struct Run {
    files: BTreeMap<String, Vec<u8>>,
    dirs: Vec<String>,
    received: Vec<(String, Status)>,
    sent: Vec<(u32, Status)>,
    sender: Option<Outcome>,
    receiver: Option<Outcome>,
    /// The size of each digest the receiver was asked to compare.
    digest_sizes: Vec<usize>,
}

fn pump(entries: Vec<Local>, cfg: ReceiverConfig, chunk: u32) -> Run {
    pump_on_path(entries, cfg, chunk, None, None, |_, _| {})
}

/// Which way a control message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    ToReceiver,
    ToSender,
}

/// As [`pump`], with `secret` on both sides (if any), the receiver's digest of the file at
/// `bad_digest_of` made to differ, and every control message passed through `on_path` on its
/// way, as it is on the wire: someone on the path may rewrite it.
fn pump_on_path(
    entries: Vec<Local>,
    mut cfg: ReceiverConfig,
    chunk: u32,
    secret: Option<&str>,
    bad_digest_of: Option<&str>,
    mut on_path: impl FnMut(Way, &mut Vec<u8>),
) -> Run {
    let now = Instant::now();
    let total = entries.iter().filter_map(|(_, d)| d.as_ref()).map(|d| d.len() as u64).sum();
    let mut scfg = SenderConfig::new(chunk, 4, Duration::from_secs(5));
    scfg.secret = secret.map(|s| Secret::new(s.as_bytes()).unwrap());
    cfg.secret = scfg.secret.clone();
    let mut s = Sender::batch(SESSION, total, scfg, now).unwrap();
    let mut r = Receiver::new(cfg, now);
    let mut run = Run::default();
    let mut queue = entries.into_iter();
    let (mut ring, mut slot_size) = (Vec::<u8>::new(), 0usize);
    let mut current: Option<(Entry, Vec<u8>)> = None;
    let mut local: Option<Vec<u8>> = None;
    let mut hasher = Vec::<u8>::new();
    let mut rhash = Vec::<u8>::new();
    let mut out = Vec::new();
    for _ in 0..100_000 {
        let mut moved = false;
        while let Some(a) = s.poll_action() {
            moved = true;
            match a {
                sender::Action::Send => {
                    assert!(s.transmit(&mut out));
                    on_path(Way::ToReceiver, &mut out);
                    r.handle(receiver::Input::Message(&out), now);
                }
                sender::Action::ReadChunk { seq, offset, len } => {
                    hasher.extend_from_slice(&local.as_ref().unwrap()[offset as usize..offset as usize + len as usize]);
                    s.handle(sender::Input::ChunkRead { seq }, now);
                }
                sender::Action::WriteChunk { seq, len, remote_addr, imm, .. } => {
                    let g = *s.grant().unwrap();
                    let at = (remote_addr - g.addr) as usize;
                    let off = (s.resumed_from() + seq * u64::from(g.slot_size)) as usize;
                    ring[at..at + len as usize].copy_from_slice(&local.as_ref().unwrap()[off..off + len as usize]);
                    r.handle(receiver::Input::WriteArrived { imm, len }, now);
                    s.handle(sender::Input::WriteDone { seq }, now);
                }
                sender::Action::NeedDigest => {
                    let d = digest(&hasher)[..s.digest().size()].to_vec();
                    s.handle(sender::Input::Digest(d), now);
                }
                sender::Action::NextEntry => match queue.next() {
                    Some((path, data)) => {
                        let kind = if data.is_some() { EntryKind::File } else { EntryKind::Directory };
                        let size = data.as_ref().map_or(0, |d| d.len() as u64);
                        hasher.clear();
                        local = data;
                        let e = Entry {
                            index: 0,
                            kind,
                            flags: 0,
                            mode: 0o644,
                            mtime_sec: 0,
                            mtime_nsec: 0,
                            size,
                            resume: 0,
                            path: path.into(),
                        };
                        s.start_entry(e, now);
                    }
                    None => s.end_batch(now),
                },
                sender::Action::EntryDone { index, status, .. } => run.sent.push((index, status)),
                sender::Action::Finish(o) => run.sender = Some(o),
                sender::Action::ProvePrefix { .. } => panic!("nothing is resumed in this batch"),
            }
        }
        while let Some(a) = r.poll_action() {
            moved = true;
            match a {
                receiver::Action::Send => {
                    assert!(r.transmit(&mut out));
                    on_path(Way::ToSender, &mut out);
                    s.handle(sender::Input::Message(&out), now);
                }
                receiver::Action::Reserve { slot_size: size, slot_count } => {
                    slot_size = size as usize;
                    ring = vec![0; slot_size * slot_count as usize];
                    r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, now);
                }
                receiver::Action::OpenEntry(e) => {
                    rhash.clear();
                    if e.kind == EntryKind::Directory {
                        run.dirs.push(e.path.clone());
                    }
                    current = Some((e, Vec::new()));
                    r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, now);
                }
                receiver::Action::StoreChunk { seq, slot, offset, len } => {
                    let bytes = &ring[slot as usize * slot_size..slot as usize * slot_size + len as usize];
                    rhash.extend_from_slice(bytes);
                    let file = &mut current.as_mut().unwrap().1;
                    file.resize(file.len().max(offset as usize + len as usize), 0);
                    file[offset as usize..offset as usize + len as usize].copy_from_slice(bytes);
                    r.handle(receiver::Input::ChunkStored { seq }, now);
                }
                receiver::Action::Finalize { digest } => {
                    run.digest_sizes.push(digest.len());
                    let (e, data) = current.take().unwrap();
                    let ok = self::digest(&rhash)[..r.digest().size()] == digest[..] && bad_digest_of != Some(&e.path);
                    if ok {
                        run.files.insert(e.path, data);
                        r.handle(receiver::Input::Finalized(Status::Ok, String::new()), now);
                    } else {
                        r.handle(receiver::Input::Finalized(Status::ChecksumMismatch, "digest".into()), now);
                    }
                }
                receiver::Action::EntryDone { path, status, .. } => run.received.push((path, status)),
                receiver::Action::Discard => {}
                receiver::Action::Open { .. } => panic!("a batch opens entries, not a file"),
                receiver::Action::Finish(o) => run.receiver = Some(o),
                receiver::Action::StartOver => panic!("nothing is resumed in this batch"),
            }
        }
        if !moved {
            break;
        }
    }
    run
}

/// The test's digest: FNV-1a on 128 bits (the core does not hash), twice over (32 bytes, the
/// keyed digest's size), cut to the granted digest's size where it is used.
fn digest(data: &[u8]) -> Vec<u8> {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for &b in data {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    [h.to_be_bytes(), h.to_be_bytes()].concat()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn status(o: &Option<Outcome>) -> Option<Status> {
    match o {
        Some(Outcome::Acked { status, .. }) => Some(*status),
        _ => None,
    }
}

#[test]
fn files_empty_files_and_directories_arrive_over_one_grant_with_a_verdict_each() {
    let a = bytes(10_000, 1);
    let b = bytes(4096, 2);
    let entries = vec![
        ("d/a", Some(a.clone())),
        ("d/sub/b", Some(b.clone())),
        ("d/empty", Some(Vec::new())),
        ("d/sub/void", None),
        ("d/sub", None),
        ("d", None),
    ];
    let run = pump(entries, ReceiverConfig::default(), 4096);
    assert_eq!(status(&run.sender), Some(Status::Ok), "{run:?}");
    assert_eq!(status(&run.receiver), Some(Status::Ok), "{run:?}");
    assert_eq!(run.files.get("d/a"), Some(&a));
    assert_eq!(run.files.get("d/sub/b"), Some(&b));
    assert_eq!(run.files.get("d/empty"), Some(&Vec::new()));
    assert_eq!(run.dirs, ["d/sub/void", "d/sub", "d"]);
    assert_eq!(run.sent.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    assert!(run.sent.iter().chain(run.received.iter().map(|_| &(0, Status::Ok))).all(|s| s.1 == Status::Ok));
}

#[test]
fn a_batch_uses_the_digest_the_receiver_granted_for_every_entry() {
    let a = bytes(9_000, 3);
    let entries = vec![("x/a", Some(a.clone())), ("x/empty", Some(Vec::new())), ("x", None)];
    let mut cfg = ReceiverConfig::default();
    cfg.digest = Digest::Xxh64;
    let run = pump(entries, cfg, 4096);
    assert_eq!(status(&run.sender), Some(Status::Ok), "{run:?}");
    assert_eq!(status(&run.receiver), Some(Status::Ok), "{run:?}");
    assert_eq!(run.files.get("x/a"), Some(&a));
    assert_eq!(run.files.get("x/empty"), Some(&Vec::new()));
    assert!(run.sent.iter().all(|s| s.1 == Status::Ok), "{run:?}");
    assert_eq!(run.digest_sizes, [8, 8], "each file's FIN carries XXH64's 8 bytes");
}

#[test]
fn a_bad_path_is_refused_alone_and_the_summary_names_it() {
    let good = bytes(5000, 3);
    for bad in ["../escape", "/etc/passwd", "a//b", "a/./b", "x/.1.rdcp-tmp", "a/..", ""] {
        let entries = vec![(bad, Some(bytes(100, 4))), ("ok", Some(good.clone()))];
        let run = pump(entries, ReceiverConfig::default(), 1024);
        assert_eq!(run.received[0].1, Status::BadName, "{bad:?}: {run:?}");
        assert_eq!(run.sent[0].1, Status::BadName, "{bad:?}");
        assert_eq!(run.sent[1].1, Status::Ok, "{bad:?}: the batch goes on");
        assert_eq!(run.files.keys().collect::<Vec<_>>(), ["ok"], "{bad:?}: only the good file");
        assert_eq!(status(&run.sender), Some(Status::BadName), "{bad:?}: the summary is the first failure");
        assert_eq!(status(&run.receiver), Some(Status::BadName));
    }
}

#[test]
fn the_session_byte_limit_refuses_a_batch_that_announces_more_and_entries_that_would_pass_it() {
    let mut cfg = ReceiverConfig::default();
    cfg.max_session_bytes = 10_000;
    // Announced over the limit: refused whole, nothing offered.
    let run = pump(vec![("a", Some(bytes(6000, 1))), ("b", Some(bytes(6000, 2)))], cfg.clone(), 4096);
    assert_eq!(status(&run.sender), Some(Status::TooLarge), "{run:?}");
    assert!(run.files.is_empty() && run.received.is_empty());
    // Within it: each file also within `max_size`.
    cfg.max_size = 3000;
    let run = pump(vec![("big", Some(bytes(4000, 1))), ("small", Some(bytes(2000, 2)))], cfg, 4096);
    assert_eq!(run.received, [("big".into(), Status::TooLarge), ("small".into(), Status::Ok)], "{run:?}");
    assert_eq!(run.files.keys().collect::<Vec<_>>(), ["small"]);
}

#[test]
fn a_batch_past_max_entries_ends_the_session() {
    let mut cfg = ReceiverConfig::default();
    cfg.max_entries = 2;
    let entries = vec![("a", Some(bytes(10, 1))), ("b", None), ("c", Some(bytes(10, 2)))];
    let run = pump(entries, cfg, 1024);
    assert_eq!(run.received.len(), 2, "{run:?}");
    assert_eq!(status(&run.sender), Some(Status::ProtocolMismatch), "{run:?}");
    assert!(matches!(run.receiver, Some(Outcome::Failed(_))), "{run:?}");
}

#[test]
fn a_receiver_without_batches_refuses_the_batch_by_its_name() {
    // A receiver that knows no BATCH reads the HELLO as one file named ".": refused, nothing
    // stored. Simulated by a HELLO whose BATCH bit is cleared on the way.
    let now = Instant::now();
    let mut s = Sender::batch(SESSION, 10, SenderConfig::new(1024, 4, Duration::from_secs(5)), now).unwrap();
    let mut r = Receiver::new(ReceiverConfig::default(), now);
    let mut out = Vec::new();
    assert_eq!(s.poll_action(), Some(sender::Action::Send));
    assert!(s.transmit(&mut out));
    let (_, m) = rdma_proto::wire::decode(&out).unwrap();
    let rdma_proto::wire::Message::Hello(mut h) = m else { panic!("not a HELLO") };
    h.caps &= !rdma_proto::wire::caps::BATCH;
    rdma_proto::wire::encode(SESSION, &rdma_proto::wire::Message::Hello(h), &mut out).unwrap();
    r.handle(receiver::Input::Message(&out), now);
    assert_eq!(r.poll_action(), Some(receiver::Action::Send));
    assert!(r.transmit(&mut out));
    s.handle(sender::Input::Message(&out), now);
    assert!(matches!(s.poll_action(), Some(sender::Action::Finish(Outcome::Acked { status: Status::BadName, .. }))));
}

// ---- A hostile sender, played by hand: the receiver machine fed encoded messages. ----

use rdma_proto::wire::{self, caps, Ack, End, Fin, Hello, Message, Ready};

/// A receiver driven by hand: every driver action is answered at once (opens succeed, chunks
/// store, digests match), and everything it did is recorded.
struct Hostile {
    r: Receiver,
    now: Instant,
    /// Messages the receiver sent, decoded.
    sent: Vec<Message>,
    /// Entries it asked the driver to open.
    opened: Vec<Entry>,
    /// Its per-entry verdicts.
    done: Vec<(u32, String, Status, u64)>,
    finished: Option<Outcome>,
    discards: usize,
    /// Bytes of each file the driver's partial holds (resuming), and the proof it computes.
    held: u64,
    /// Files started over after a wrong proof of their prefix.
    started_over: usize,
    /// Every file is in place already (the driver answers `Present` with [`PREFIX`]).
    in_place: bool,
}

/// The proof of a held prefix the [`Hostile`] driver expects.
const PREFIX: [u8; 32] = [0x5a; 32];

impl Hostile {
    /// A batch session granted (`total` bytes announced, the sender offering `offer` too).
    fn granted(cfg: ReceiverConfig, total: u64, offer: u32) -> Self {
        let now = Instant::now();
        let mut h = Hostile {
            r: Receiver::new(cfg, now),
            now,
            sent: Vec::new(),
            opened: Vec::new(),
            done: Vec::new(),
            finished: None,
            discards: 0,
            held: 0,
            started_over: 0,
            in_place: false,
        };
        h.msg(Message::Hello(Hello {
            version_min: 1,
            version_max: 1,
            resume: (offer & caps::RESUME != 0).then_some(0),
            caps: caps::DIGEST_XXH3_128 | caps::BATCH | offer,
            size: total,
            chunk: 1024,
            depth: 4,
            name: wire::BATCH_NAME.into(),
            lanes: 1,
        }));
        assert!(matches!(h.sent.last(), Some(Message::Grant(_))), "{:?}", h.sent);
        h
    }

    fn msg(&mut self, m: Message) {
        let mut out = Vec::new();
        wire::encode(SESSION, &m, &mut out).unwrap();
        self.r.handle(receiver::Input::Message(&out), self.now);
        self.drain();
    }

    fn write(&mut self, imm: u32, len: u32) {
        self.r.handle(receiver::Input::WriteArrived { imm, len }, self.now);
        self.drain();
    }

    fn drain(&mut self) {
        let mut out = Vec::new();
        while let Some(a) = self.r.poll_action() {
            match a {
                receiver::Action::Send => {
                    assert!(self.r.transmit(&mut out));
                    self.sent.push(wire::decode(&out).unwrap().1);
                }
                receiver::Action::Reserve { .. } => {
                    self.r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, self.now)
                }
                receiver::Action::OpenEntry(e) => {
                    self.opened.push(e.clone());
                    if self.in_place && self.r.resume_key().is_some() && e.kind == EntryKind::File {
                        self.r.handle(receiver::Input::Present { proof: PREFIX }, self.now);
                        continue;
                    }
                    if self.r.resume_key().is_some() {
                        let from = self.held.min(e.size);
                        self.r.handle(receiver::Input::Resumed { from, proof: PREFIX }, self.now);
                    }
                    self.r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, self.now);
                }
                receiver::Action::StoreChunk { seq, .. } => {
                    self.r.handle(receiver::Input::ChunkStored { seq }, self.now)
                }
                receiver::Action::Finalize { .. } => {
                    self.r.handle(receiver::Input::Finalized(Status::Ok, String::new()), self.now)
                }
                receiver::Action::EntryDone { index, path, status, bytes, .. } => {
                    self.done.push((index, path, status, bytes))
                }
                receiver::Action::Discard => self.discards += 1,
                receiver::Action::Open { .. } => panic!("a batch opens entries, not a file"),
                receiver::Action::Finish(o) => self.finished = Some(o),
                receiver::Action::StartOver => {
                    self.started_over += 1;
                    self.r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, self.now);
                }
            }
        }
    }

    fn entry(&mut self, index: u32, kind: EntryKind, size: u64, path: &str) {
        self.msg(Message::Entry(entry(index, kind, size, path)));
    }

    /// The ACKs the receiver sent, in order.
    fn acks(&self) -> Vec<&Ack> {
        self.sent.iter().filter_map(|m| if let Message::Ack(a) = m { Some(a) } else { None }).collect()
    }

    fn last_ack(&self) -> &Ack {
        self.acks().last().copied().expect("an ACK")
    }

    /// The session failed as for a message out of place: ProtocolMismatch to the sender,
    /// `Failed` here.
    fn violated(&self) -> bool {
        matches!(self.finished, Some(Outcome::Failed(_))) && self.last_ack().status == Status::ProtocolMismatch
    }

    /// A file entry of `size` bytes sent whole (chunks of 1024 bytes), then its FIN.
    fn send_file(&mut self, index: u32, size: u64, path: &str) {
        self.entry(index, EntryKind::File, size, path);
        assert!(matches!(self.sent.last(), Some(Message::Ready(Ready { index: i, .. })) if *i == index));
        let chunks = size.div_ceil(1024);
        for n in 0..chunks {
            self.write(n as u32, (size - n * 1024).min(1024) as u32);
        }
        self.msg(Message::Fin(Fin { chunks, size, digest: vec![0; 16] }));
    }
}

fn entry(index: u32, kind: EntryKind, size: u64, path: &str) -> Entry {
    Entry { index, kind, flags: 0, mode: 0o644, mtime_sec: 0, mtime_nsec: 0, size, resume: 0, path: path.into() }
}

/// The invariants every hostile run must keep: no bad path was opened, no entry that was
/// not committed got an ACK `Ok`, and a summary matches the per-entry verdicts.
fn check_invariants(h: &Hostile) {
    for e in &h.opened {
        assert!(rdma_proto::name::check_path(&e.path).is_ok(), "opened a bad path {:?}", e.path);
    }
    let committed = h.done.iter().filter(|d| d.2 == Status::Ok).count();
    let entry_acks_ok =
        h.acks().iter().filter(|a| a.status == Status::Ok && !a.detail.contains("entries stored")).count();
    assert_eq!(entry_acks_ok, committed, "ACK Ok only for committed entries: {:?} / {:?}", h.acks(), h.done);
    if let Some(Outcome::Acked { status, detail }) = &h.finished {
        let first = h.done.iter().find(|d| d.2 != Status::Ok).map_or(Status::Ok, |d| d.2);
        assert_eq!(*status, first, "the summary is the first failure's: {detail}");
        let held: u64 = h.done.iter().filter(|d| d.2 == Status::Ok).map(|d| d.3).sum();
        assert_eq!(h.last_ack().received, held, "the summary's received");
        assert_eq!(h.last_ack().status, *status);
    }
}

#[test]
fn hostile_out_of_place_messages_end_the_session() {
    // ENTRY before the GRANT: the HELLO not yet answered (a secret holds it in Authenticating).
    {
        let now = Instant::now();
        let mut cfg = ReceiverConfig::default();
        cfg.secret = Some(rdma_proto::auth::Secret::new(b"0123456789abcdef0123456789abcdef").unwrap());
        let mut h = Hostile {
            r: Receiver::new(cfg, now),
            now,
            sent: Vec::new(),
            opened: Vec::new(),
            done: Vec::new(),
            finished: None,
            discards: 0,
            held: 0,
            started_over: 0,
            in_place: false,
        };
        h.msg(Message::Hello(Hello {
            version_min: 1,
            version_max: 1,
            resume: None,
            caps: caps::DIGEST_XXH3_128 | caps::DIGEST_BLAKE3 | caps::BATCH | caps::AUTH | caps::SEALED,
            size: 10,
            chunk: 1024,
            depth: 4,
            name: wire::BATCH_NAME.into(),
            lanes: 1,
        }));
        h.entry(0, EntryKind::File, 10, "a");
        assert!(h.violated() && h.opened.is_empty(), "ENTRY before GRANT: {:?}", h.sent);
    }
    // ENTRY as the very first message.
    {
        let now = Instant::now();
        let mut r = Receiver::new(ReceiverConfig::default(), now);
        let mut out = Vec::new();
        wire::encode(SESSION, &Message::Entry(entry(0, EntryKind::File, 1, "a")), &mut out).unwrap();
        r.handle(receiver::Input::Message(&out), now);
        let mut opened = false;
        while let Some(a) = r.poll_action() {
            opened |= matches!(a, receiver::Action::OpenEntry(_) | receiver::Action::Open { .. });
        }
        assert!(r.is_done() && !opened);
    }
    type Case = (&'static str, fn(&mut Hostile));
    let cases: [Case; 9] = [
        ("ENTRY in a file's data phase", |h| {
            h.entry(0, EntryKind::File, 5000, "a");
            h.write(0, 1024);
            h.entry(1, EntryKind::File, 10, "b");
        }),
        ("a WRITE for the previous entry after its ACK", |h| {
            h.send_file(0, 2048, "a");
            h.write(2, 1024);
        }),
        ("a WRITE for the previous entry in the next one's data phase", |h| {
            h.send_file(0, 2048, "a");
            h.entry(1, EntryKind::File, 2048, "b");
            h.write(2, 1024);
        }),
        ("a FIN for a directory", |h| {
            h.entry(0, EntryKind::Directory, 0, "d");
            h.msg(Message::Fin(Fin { chunks: 0, size: 0, digest: vec![0; 16] }));
        }),
        ("READY from the sender", |h| h.msg(Message::Ready(Ready { index: 0, resume_from: 0 }))),
        ("END with a wrong count", |h| {
            h.send_file(0, 10, "a");
            h.msg(Message::End(End { entries: 2 }));
        }),
        ("END mid-file", |h| {
            h.entry(0, EntryKind::File, 5000, "a");
            h.write(0, 1024);
            h.msg(Message::End(End { entries: 1 }));
        }),
        ("an ENTRY index gap", |h| {
            h.send_file(0, 10, "a");
            h.entry(2, EntryKind::File, 10, "b");
        }),
        ("an ENTRY index repeated", |h| {
            h.send_file(0, 10, "a");
            h.entry(0, EntryKind::File, 10, "b");
        }),
    ];
    for (what, play) in cases {
        let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
        play(&mut h);
        assert!(h.violated(), "{what}: {:?} / {:?}", h.sent, h.finished);
        check_invariants(&h);
        assert!(h.opened.iter().all(|e| ["a", "b", "d"].contains(&e.path.as_str())), "{what}: nothing else opened");
    }
    // A directory with a size, or an ENTRY of kind 2 (refused by the codec).
    let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
    h.entry(0, EntryKind::Directory, 10, "d");
    assert!(h.violated() && h.opened.is_empty(), "a directory with a size");
    let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
    let mut out = Vec::new();
    wire::encode(SESSION, &Message::Entry(entry(0, EntryKind::File, 1, "a")), &mut out).unwrap();
    out[24] = 2;
    h.r.handle(receiver::Input::Message(&out), h.now);
    h.drain();
    assert!(h.violated() && h.opened.is_empty(), "kind 2");
}

#[test]
fn hostile_paths_are_refused_alone_and_never_opened() {
    let long = format!("{}/x", "d".repeat(200)).repeat(5); // over 960 bytes
    let bad = ["a\0b", "a\\b", "a/", "a/.", "./a", ".", "..", "a/../b", "/a", "", "d/.KEY.part.rdcp-tmp", "a\nb"];
    let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
    let mut i = 0;
    for p in bad {
        h.entry(i, EntryKind::File, 10, p);
        i += 1;
        h.entry(i, EntryKind::Directory, 0, p);
        i += 1;
    }
    // 960 bytes is the limit (decode refuses more: the session ends).
    let edge = format!("{}/{}", "e".repeat(255), "f".repeat(255)).repeat(2);
    let edge = &edge[..959];
    h.entry(i, EntryKind::Directory, 0, edge.trim_end_matches('/'));
    i += 1;
    assert!(h.done.iter().take(2 * bad.len()).all(|d| d.2 == Status::BadName), "{:?}", h.done);
    assert_eq!(h.done.len() as u32, i, "every entry answered, the batch goes on");
    h.msg(Message::End(End { entries: i }));
    check_invariants(&h);
    // Over 960 bytes: the codec refuses it (the session ends), nothing opened.
    let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
    let mut e = entry(0, EntryKind::File, 1, "a");
    e.path = long.clone();
    let mut out = Vec::new();
    assert!(wire::encode(SESSION, &Message::Entry(e), &mut out).is_err());
    wire::encode(SESSION, &Message::Entry(entry(0, EntryKind::File, 1, &"a".repeat(960))), &mut out).unwrap();
    // Patch the length to 961 with one more byte.
    out.push(b'a');
    let len = out.len() as u32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    out[58..60].copy_from_slice(&961u16.to_be_bytes());
    h.r.handle(receiver::Input::Message(&out), h.now);
    h.drain();
    assert!(h.violated() && h.opened.is_empty());
}

#[test]
fn hostile_sizes_are_refused_alone() {
    // Entries whose sizes pass the announced total (and overflow u64 added up).
    let mut h = Hostile::granted(ReceiverConfig::default(), 3000, 0);
    h.send_file(0, 2000, "a");
    h.entry(1, EntryKind::File, u64::MAX, "huge");
    h.entry(2, EntryKind::File, u64::MAX - 1000, "huge2");
    h.entry(3, EntryKind::File, 2000, "over");
    assert_eq!(
        h.done.iter().map(|d| d.2).collect::<Vec<_>>(),
        [Status::Ok, Status::TooLarge, Status::TooLarge, Status::TooLarge]
    );
    // A refused entry brought no bytes: what is left of the total still takes a file, and
    // a directory is never too large.
    h.send_file(4, 1000, "fits");
    h.entry(5, EntryKind::Directory, 0, "d");
    assert_eq!(h.done[4].2, Status::Ok, "{:?}", h.done);
    assert_eq!(h.done[5].2, Status::Ok, "{:?}", h.done);
    h.msg(Message::End(End { entries: 6 }));
    assert_eq!(status(&h.finished), Some(Status::TooLarge));
    check_invariants(&h);
    assert_eq!(h.opened.iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), ["a", "fits", "d"]);
}

#[test]
fn a_resume_key_is_ignored_unless_resume_was_granted() {
    let mut h = Hostile::granted(ReceiverConfig::default(), 100, caps::RESUME);
    let mut e = entry(0, EntryKind::File, 10, "a");
    e.resume = 77;
    h.msg(Message::Entry(e));
    assert_eq!(h.r.resume_key(), None, "the receiver does not resume");
    assert!(matches!(h.sent.last(), Some(Message::Ready(Ready { resume_from: 0, .. }))));
    // Resuming on: the key is used for a file of a sender that offers to prove the prefix; a
    // directory's is not, nor the key of a sender that does not offer the proof.
    let mut cfg = ReceiverConfig::default();
    cfg.resume = true;
    let mut h = Hostile::granted(cfg.clone(), 100, caps::RESUME | caps::RESUME_PROOF);
    let mut e = entry(0, EntryKind::File, 10, "a");
    e.resume = 77;
    h.msg(Message::Entry(e.clone()));
    assert_eq!(h.r.resume_key(), Some(77));
    let mut h = Hostile::granted(cfg, 100, caps::RESUME);
    h.msg(Message::Entry(e));
    assert_eq!(h.r.resume_key(), None, "a key without the offer to prove the prefix");
}

#[test]
fn the_summary_and_bytes_match_the_entries() {
    let mut h = Hostile::granted(ReceiverConfig::default(), 1 << 20, 0);
    h.send_file(0, 3000, "a");
    h.entry(1, EntryKind::File, 10, "../x");
    h.send_file(2, 5000, "b");
    assert_eq!(h.done.iter().map(|d| d.3).collect::<Vec<_>>(), [3000, 0, 5000]);
    h.msg(Message::End(End { entries: 3 }));
    check_invariants(&h);
    assert_eq!(status(&h.finished), Some(Status::BadName));
    assert_eq!(h.last_ack().received, 8000);
    // Between entries and after the END, no entry is in progress: nothing is counted twice
    // by a driver that adds the machine's bytes to its entries' (a session that broke off
    // mid-file adds that file's).
    assert_eq!(h.r.bytes_stored(), 0, "the last entry's bytes are its report's, not in progress");
}

#[test]
fn a_store_that_fails_after_the_fin_ends_the_senders_batch() {
    // The receiver stores a file's last chunks after its FIN arrived; a store that fails then
    // ends its session (ACK DiskIo with fewer bytes than the file). The sender must not take
    // that for the entry's verdict and offer the next entry to a receiver that is gone.
    let now = Instant::now();
    let mut s = Sender::batch(SESSION, 4096, SenderConfig::new(1024, 4, Duration::from_secs(5)), now).unwrap();
    let mut out = Vec::new();
    let grant = wire::Grant {
        version: 1,
        caps: caps::DIGEST_XXH3_128 | caps::BATCH,
        addr: 0x1000,
        rkey: 7,
        slot_size: 1024,
        slot_count: 4,
        resume_from: 0,
        lanes: None,
    };
    let to_sender = |s: &mut Sender, m: Message| {
        let mut buf = Vec::new();
        wire::encode(SESSION, &m, &mut buf).unwrap();
        s.handle(sender::Input::Message(&buf), now);
    };
    to_sender(&mut s, Message::Grant(grant));
    let mut finished = None;
    let mut offered = 0;
    for round in 0..100 {
        let Some(a) = s.poll_action() else { break };
        match a {
            sender::Action::Send => {
                s.transmit(&mut out);
                let (_, m) = wire::decode(&out).unwrap();
                match m {
                    Message::Entry(e) => {
                        offered += 1;
                        to_sender(&mut s, Message::Ready(Ready { index: e.index, resume_from: 0 }));
                    }
                    Message::Fin(_) => {
                        let ack = Ack {
                            status: Status::DiskIo,
                            received: 1024,
                            detail: "writing: EIO".into(),
                            retry_after_ms: 0,
                        };
                        to_sender(&mut s, Message::Ack(ack));
                    }
                    _ => {}
                }
            }
            sender::Action::NextEntry => s.start_entry(entry(0, EntryKind::File, 2048, "a"), now),
            sender::Action::ReadChunk { seq, .. } => s.handle(sender::Input::ChunkRead { seq }, now),
            sender::Action::WriteChunk { seq, .. } => s.handle(sender::Input::WriteDone { seq }, now),
            sender::Action::NeedDigest => s.handle(sender::Input::Digest(vec![0; 16]), now),
            sender::Action::EntryDone { .. } => {}
            sender::Action::Finish(o) => finished = Some(o),
            sender::Action::ProvePrefix { .. } => panic!("nothing is resumed here"),
        }
        assert!(round < 99);
    }
    assert_eq!(offered, 1, "no entry offered after the receiver ended the session");
    assert_eq!(status(&finished), Some(Status::DiskIo), "{finished:?}");
}

const SECRET: &str = "correct horse battery staple";

/// The offset of an ENTRY's path in its message (after the header and the fixed fields).
const ENTRY_PATH_AT: usize = rdma_proto::wire::HEADER_LEN + 4 + 1 + 1 + 4 + 8 + 4 + 8 + 8 + 2;

/// Two files of the same path length, and a private key.
fn two_configs() -> Vec<Local> {
    vec![("conf/prod", Some(bytes(3000, 1))), ("conf/test", Some(bytes(2000, 2))), ("conf/key", Some(bytes(100, 3)))]
}

#[test]
fn with_a_secret_a_batch_arrives_whole() {
    let run = pump_on_path(two_configs(), ReceiverConfig::default(), 1024, Some(SECRET), None, |_, _| {});
    assert_eq!(status(&run.sender), Some(Status::Ok), "{run:?}");
    assert_eq!(status(&run.receiver), Some(Status::Ok), "{run:?}");
    assert_eq!(run.files.len(), 3);
    assert_eq!(run.files.get("conf/prod"), Some(&bytes(3000, 1)));
    assert!(run.digest_sizes.iter().all(|&n| n == 32), "the keyed digest: {:?}", run.digest_sizes);
}

/// With a secret, nobody on the path may choose where an authentic file goes or
/// with what mode. Here the ENTRYs' paths are swapped in place (same length) and a mode is
/// opened up to 0666: the receiver stores nothing under a rewritten name, and no verdict is Ok
/// for a rewritten entry.
#[test]
fn with_a_secret_entries_changed_on_the_path_store_nothing_under_the_attackers_names() {
    for attack in ["swap the paths", "open up the mode"] {
        let run = pump_on_path(two_configs(), ReceiverConfig::default(), 1024, Some(SECRET), None, |way, m| {
            if way != Way::ToReceiver || m[5] != rdma_proto::wire::Kind::Entry as u8 {
                return;
            }
            let len = usize::from(u16::from_be_bytes([m[ENTRY_PATH_AT - 2], m[ENTRY_PATH_AT - 1]]));
            let path = &mut m[ENTRY_PATH_AT..ENTRY_PATH_AT + len];
            match attack {
                "swap the paths" if path == b"conf/prod" => path.copy_from_slice(b"conf/test"),
                "swap the paths" if path == b"conf/test" => path.copy_from_slice(b"conf/prod"),
                "open up the mode" => {
                    let at = rdma_proto::wire::HEADER_LEN + 4 + 1;
                    m[at] |= rdma_proto::wire::entry_flags::MODE;
                    m[at + 1..at + 5].copy_from_slice(&0o666u32.to_be_bytes());
                }
                _ => {}
            }
        });
        for (path, data) in &run.files {
            let sent = two_configs().into_iter().find(|(p, _)| p == path).and_then(|(_, d)| d);
            assert!(Some(data) == sent.as_ref(), "{attack}: {path} holds another file's bytes ({} bytes)", data.len());
        }
        assert!(run.files.is_empty(), "{attack}: stored {:?} from rewritten entries", run.files.keys());
        assert!(run.received.iter().all(|(_, s)| *s != Status::Ok), "{attack}: {:?}", run.received);
        assert!(run.sent.iter().all(|(_, s)| *s != Status::Ok), "{attack}: {:?}", run.sent);
        assert_ne!(status(&run.sender), Some(Status::Ok), "{attack}: {:?}", run.sender);
    }
}

/// With a secret, nobody on the path may turn a failure into a success. The
/// receiver's verdict on `conf/test` is a checksum mismatch (its digest is made to differ);
/// on its way back its status is rewritten to Ok, or it is replaced by a plain ACK Ok. The
/// sender must not report that file stored.
#[test]
fn with_a_secret_a_verdict_changed_on_the_path_is_never_taken_for_ok() {
    for attack in ["rewrite the status", "forge a plain ACK"] {
        let bad = Some("conf/test");
        let run = pump_on_path(two_configs(), ReceiverConfig::default(), 1024, Some(SECRET), bad, |way, m| {
            let kind = m[5];
            let failed_ack = way == Way::ToSender
                && kind == rdma_proto::wire::Kind::Ack as u8
                && m[20..22] == Status::ChecksumMismatch.code().to_be_bytes();
            if !failed_ack {
                return;
            }
            match attack {
                "rewrite the status" => m[20..22].copy_from_slice(&Status::Ok.code().to_be_bytes()),
                _ => {
                    let ack = rdma_proto::wire::Ack {
                        status: Status::Ok,
                        received: 2000,
                        detail: String::new(),
                        retry_after_ms: 0,
                    };
                    rdma_proto::wire::encode(SESSION, &rdma_proto::wire::Message::Ack(ack), m).unwrap();
                }
            }
        });
        let test_ok = run.sent.get(1).is_some_and(|(_, s)| *s == Status::Ok);
        assert!(!test_ok, "{attack}: the sender was told conf/test is stored: {:?}", run.sent);
        assert!(!run.files.contains_key("conf/test"));
        assert_ne!(status(&run.sender), Some(Status::Ok), "{attack}: {:?}", run.sender);
    }
}

/// Each ENTRY counts `OFFER_CREDIT` (1 KiB) towards the pace floor, whatever its verdict, so
/// that a peer holding its place with one entry a second (a bad name, a size over the limit, a
/// directory that exists already, an empty file), about 100 bytes/s, cannot pass a floor of
/// 16 KiB/s for the whole of `max_entries`, a million seconds (as it would if an entry counted
/// 16 KiB, or if only entries stored counted). Here each is ended at the first judgement
/// and told `Busy`, while a batch that offers its entries at a round trip's pace keeps its place.
#[test]
fn entries_trickled_to_hold_a_place_do_not_keep_the_pace() {
    let s = Duration::from_secs;
    let (timeout, floor) = (s(10), receiver::DEFAULT_MIN_RATE);
    let session = |entries_per_second: u32, what: &str| {
        let mut cfg = ReceiverConfig::default();
        (cfg.timeout, cfg.min_rate, cfg.max_size) = (timeout, floor, 1 << 20);
        let mut h = Hostile::granted(cfg, 1 << 30, 0);
        let t0 = h.now;
        for i in 0..10 * entries_per_second {
            h.now = t0 + Duration::from_millis(u64::from(i) * 1000 / u64::from(entries_per_second));
            match what {
                "a bad name" => h.entry(i, EntryKind::File, 1, "../etc/passwd"),
                "too large" => h.entry(i, EntryKind::File, 1 << 21, &format!("big{i}")),
                "an existing directory" => h.entry(i, EntryKind::Directory, 0, "d"),
                _ => h.send_file(i, 0, &format!("empty{i}")),
            }
            assert!(h.finished.is_none(), "{what}: {:?}", h.sent.last());
        }
        h.now = t0 + timeout;
        h.r.handle_timeout(h.now);
        h.drain();
        h
    };
    for what in ["a bad name", "too large", "an existing directory", "an empty file"] {
        let h = session(1, what);
        assert!(
            matches!(h.finished, Some(Outcome::Failed(ProtocolError::TooSlow { bytes, .. })) if bytes == 10 * receiver::OFFER_CREDIT),
            "{what}: ten entries in 10 s must not pass a floor of {floor} bytes/s: {:?}",
            h.finished
        );
        assert_eq!(h.last_ack().status, Status::Busy, "{what}");
        let ok = h.acks().iter().filter(|a| a.status == Status::Ok).count();
        assert_eq!(ok, if what.starts_with("an ") { 10 } else { 0 }, "{what}: the entries' own verdicts");
    }
    // Twenty entries a second, refused or stored (the VM's honest sender did 120): kept.
    for what in ["a bad name", "an empty file"] {
        let h = session(20, what);
        assert!(h.finished.is_none() && !h.r.is_done(), "{what}, 20 a second: {:?}", h.finished);
    }
}

/// A sender that keeps its place by trickling (an entry or a byte just within each timeout)
/// is ended once a window of `timeout` of its own time brought less than `min_rate` allows: it
/// is told `Busy` and why. The driver's own steps (here, an open that takes 8 s) are not the
/// peer's time, and a batch of small files keeps its pace by its entries.
#[test]
fn a_sender_below_the_pace_floor_is_ended_and_the_drivers_time_is_not_its() {
    let s = Duration::from_secs;
    let mut cfg = ReceiverConfig::default();
    (cfg.timeout, cfg.min_rate) = (s(10), 2048);
    let mut h = Hostile::granted(cfg, 1 << 20, 0);
    let t0 = h.now;
    assert_eq!(h.r.poll_timeout(), Some(t0 + s(10)), "the first window ends with the phase's timeout");

    // Window 1: one entry and 24 KiB, 25 KiB against a floor of 20 KiB: it passes.
    h.now = t0 + s(1);
    h.send_file(0, 24 << 10, "a");
    assert_eq!(h.last_ack().status, Status::Ok);
    h.now = t0 + s(10);
    h.r.handle_timeout(h.now);
    assert!(h.finished.is_none() && !h.r.is_done(), "a pace above the floor goes on");

    // Window 2: the next entry takes the driver 8 s to open. Its ENTRY and 1 KiB make 2 KiB,
    // short of 20 KiB, but the peer had only 2 s of the 10 so far: no judgement at 20 s.
    h.now = t0 + s(11);
    let mut out = Vec::new();
    wire::encode(SESSION, &Message::Entry(entry(1, EntryKind::File, 1024, "b")), &mut out).unwrap();
    h.r.handle(receiver::Input::Message(&out), h.now);
    while let Some(a) = h.r.poll_action() {
        assert!(matches!(a, receiver::Action::OpenEntry(_)), "{a:?}");
    }
    h.now = t0 + s(19);
    h.r.handle(receiver::Input::Ready { addr: 0x1000, rkey: 7 }, h.now);
    h.drain();
    h.write(0, 1024);
    h.msg(Message::Fin(Fin { chunks: 1, size: 1024, digest: vec![0; 16] }));
    assert_eq!(h.last_ack().status, Status::Ok);
    assert_eq!(h.r.poll_timeout(), Some(t0 + s(28)), "the window ends 10 s of the peer's time after it began");
    h.now = t0 + s(20);
    h.r.handle_timeout(h.now);
    h.drain();
    assert!(h.finished.is_none(), "judged on the driver's time: {:?}", h.finished);

    // At 28 s the peer has had its 10 s and brought 17 KiB: ended, and told why.
    h.now = t0 + s(28);
    h.r.handle_timeout(h.now);
    h.drain();
    let over = s(10);
    assert!(
        matches!(
            h.finished,
            Some(Outcome::Failed(ProtocolError::TooSlow { bytes, over: o, min_rate: 2048 }))
                if bytes == receiver::OFFER_CREDIT + 1024 && o == over
        ),
        "{:?}",
        h.finished
    );
    let ack = h.last_ack();
    assert_eq!(ack.status, Status::Busy);
    assert!(ack.detail.contains("below this receiver's floor of 2048 bytes/s"), "{}", ack.detail);
    assert_eq!(h.acks().len(), 3, "two entries stored, then the refusal");

    // A floor of 0 judges nothing: only the phase's own timeout remains.
    let mut cfg = ReceiverConfig::default();
    (cfg.timeout, cfg.min_rate) = (s(10), 0);
    let mut h = Hostile::granted(cfg, 1 << 20, 0);
    let t0 = h.now;
    h.now = t0 + s(9);
    h.send_file(0, 1, "a");
    assert_eq!(h.r.poll_timeout(), Some(t0 + s(19)));
    h.r.handle_timeout(t0 + s(18));
    assert!(!h.r.is_done());
}

/// Resuming in a batch: an entry whose file the receiver holds a prefix of is asked to prove
/// that prefix (a CHALLENGE naming the entry and `from`) before its READY; the right proof gets
/// READY from there, a wrong one READY from 0, the file taken into a new temporary.
#[test]
fn a_batch_entry_resumes_only_after_its_sender_proves_the_held_prefix() {
    let mut cfg = ReceiverConfig::default();
    cfg.resume = true;
    let mut h = Hostile::granted(cfg, 1 << 20, caps::RESUME | caps::RESUME_PROOF);
    h.held = 2048;
    let nonce = [0; 16]; // the machine's, as the driver gave none
    for (index, mac, from) in [(0u32, PREFIX, 2048u64), (1, [1; 32], 0)] {
        let mut e = entry(index, EntryKind::File, 4096, &format!("f{index}"));
        e.resume = 0x77;
        h.msg(Message::Entry(e));
        let Some(Message::Challenge(c)) = h.sent.last() else { panic!("no CHALLENGE: {:?}", h.sent) };
        assert_eq!(c.prefix, Some(wire::PrefixClaim { index, from: 2048 }), "entry {index}");
        h.msg(Message::Proof(wire::Proof { nonce, mac }));
        let Some(Message::Ready(r)) = h.sent.last() else { panic!("no READY: {:?}", h.sent) };
        assert_eq!((r.index, r.resume_from), (index, from), "entry {index}");
        let chunks = (4096 - from).div_ceil(1024);
        for n in 0..chunks {
            h.write(n as u32, 1024);
        }
        h.msg(Message::Fin(Fin { chunks, size: 4096, digest: vec![0; 16] }));
        assert_eq!(h.last_ack().status, Status::Ok, "entry {index}");
    }
    assert_eq!((h.started_over, h.r.prefix_refused()), (1, 1));
}

/// A batch sent again: each file in place already and identical is proved (a CHALLENGE for all
/// of it) and counted as stored, nothing sent; one with other bytes is `Exists`.
#[test]
fn a_batch_sent_again_counts_identical_files_as_stored() {
    let mut cfg = ReceiverConfig::default();
    cfg.resume = true;
    let mut h = Hostile::granted(cfg, 1 << 20, caps::RESUME | caps::RESUME_PROOF);
    h.in_place = true;
    let nonce = [0; 16];
    for (index, mac, want) in [(0u32, PREFIX, Status::Ok), (1, [1; 32], Status::Exists), (2, PREFIX, Status::Ok)] {
        let mut e = entry(index, EntryKind::File, 4096, &format!("f{index}"));
        e.resume = 0x77;
        h.msg(Message::Entry(e));
        let Some(Message::Challenge(c)) = h.sent.last() else { panic!("no CHALLENGE: {:?}", h.sent) };
        assert_eq!(c.prefix, Some(wire::PrefixClaim { index, from: 4096 }), "all of entry {index}");
        h.msg(Message::Proof(wire::Proof { nonce, mac }));
        assert_eq!(h.last_ack().status, want, "entry {index}: {:?}", h.last_ack());
    }
    h.msg(Message::End(End { entries: 3 }));
    assert_eq!(
        h.done.iter().map(|d| (d.2, d.3)).collect::<Vec<_>>(),
        [(Status::Ok, 4096), (Status::Exists, 0), (Status::Ok, 4096)]
    );
    assert!(h.last_ack().detail.starts_with("2 of 3 entries stored"), "{:?}", h.last_ack());
    assert_eq!(h.discards, 0, "nothing was opened");
}
