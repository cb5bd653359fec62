//! Batches (capability `BATCH`, issue 21 §2.2): the sender and receiver machines of one
//! session move several files and directories over one grant, with a verdict per entry and
//! one summary; a bad entry is refused alone; the session's byte limit holds. A pump without
//! RDMA plays both drivers: messages are delivered in order, a WRITE copies the chunk into the
//! receiver's ring, a store copies the slot into the entry's file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdma_proto::receiver::{self, Receiver, ReceiverConfig};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{Entry, EntryKind};
use rdma_proto::{Outcome, Status};

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
}

fn pump(entries: Vec<Local>, cfg: ReceiverConfig, chunk: u32) -> Run {
    let now = Instant::now();
    let total = entries.iter().filter_map(|(_, d)| d.as_ref()).map(|d| d.len() as u64).sum();
    let mut s = Sender::batch(SESSION, total, SenderConfig::new(chunk, 4, Duration::from_secs(5)), now).unwrap();
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
                    let d = digest(&hasher);
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
            }
        }
        while let Some(a) = r.poll_action() {
            moved = true;
            match a {
                receiver::Action::Send => {
                    assert!(r.transmit(&mut out));
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
                    let ok = self::digest(&rhash) == digest;
                    let (e, data) = current.take().unwrap();
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
            }
        }
        if !moved {
            break;
        }
    }
    run
}

/// The test's digest: FNV-1a on 128 bits, cut to the wire's 16 bytes (the core does not hash).
fn digest(data: &[u8]) -> Vec<u8> {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for &b in data {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    h.to_be_bytes().to_vec()
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
