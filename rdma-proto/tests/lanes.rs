//! Striping (capability `LANES`): the sender and receiver machines of one session spread its
//! chunks over several lanes (connections). A pump without RDMA plays both drivers and the
//! network: each lane is a FIFO (RC keeps one connection's order, nothing orders two), lane 0
//! also carries the control messages, and a random schedule interleaves the lanes' deliveries
//! and their WRITE completions. Files arrive identical whatever the interleaving; a WRITE on
//! the wrong lane, out of its lane's order or beyond the credit is refused; a peer that does
//! not stripe (an old one, or one configured so) falls back to one lane; a resume with lanes
//! continues where the partial ends.

mod sim;

use std::collections::VecDeque;
use std::time::Instant;

use rdma_proto::receiver::{self, Receiver, ReceiverConfig};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{self, caps, Hello, Message};
use rdma_proto::{Outcome, ProtocolError, Status};
use sim::{digest, file_of, receiver_cfg, sender_cfg, Rng};

/// What travels on a lane, sender to receiver.
enum Item {
    Message(Vec<u8>),
    /// A WRITE with immediate: the chunk, its bytes, and the ring offset it lands at.
    Write {
        seq: u64,
        imm: u32,
        at: usize,
        bytes: Vec<u8>,
    },
}

/// One striped session run to its end.
struct Run {
    sender: Sender,
    receiver: Receiver,
    sender_outcome: Option<Outcome>,
    receiver_outcome: Option<Outcome>,
    stored: Vec<u8>,
}

const RING_ADDR: u64 = 1 << 20;

/// Runs `file` from a sender to a receiver, the receiver holding its first `held` bytes
/// already (a partial, when both resume), on a schedule drawn from `seed`.
fn run(file: &[u8], s_cfg: SenderConfig, r_cfg: ReceiverConfig, held: u64, seed: u64) -> Run {
    let now = Instant::now();
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut sender = Sender::new(0x5e55, "f", file.len() as u64, s_cfg, now).unwrap();
    let mut receiver = Receiver::new(r_cfg, now).with_lane_token([0xab; 16]);
    let mut lanes: Vec<VecDeque<Item>> = (0..wire::MAX_LANES).map(|_| VecDeque::new()).collect();
    let mut to_sender: VecDeque<Vec<u8>> = VecDeque::new();
    // Per lane, the chunks whose WRITE landed and whose completion is not yet reported.
    let mut completions: Vec<VecDeque<u64>> = (0..wire::MAX_LANES).map(|_| VecDeque::new()).collect();
    let mut local: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut ring = Vec::new();
    let mut stored = file[..held as usize].to_vec();
    stored.resize(file.len(), 0);
    let (mut sender_outcome, mut receiver_outcome) = (None, None);
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        // The sender's actions.
        while let Some(a) = sender.poll_action() {
            match a {
                sender::Action::Send => {
                    sender.transmit(&mut out);
                    lanes[0].push_back(Item::Message(out.clone()));
                }
                sender::Action::ReadChunk { seq, offset, len } => {
                    local.push((seq, file[offset as usize..][..len as usize].to_vec()));
                    sender.handle(sender::Input::ChunkRead { seq }, now);
                }
                sender::Action::WriteChunk { seq, len, remote_addr, imm, .. } => {
                    let pos = local.iter().position(|(s, _)| *s == seq).expect("read before written");
                    let (_, bytes) = local.remove(pos);
                    assert_eq!(bytes.len(), len as usize);
                    let at = (remote_addr - RING_ADDR) as usize;
                    lanes[usize::from(sender.lane_of(seq))].push_back(Item::Write { seq, imm, at, bytes });
                }
                sender::Action::NeedDigest => sender.handle(sender::Input::Digest(digest(file)), now),
                sender::Action::ProvePrefix { from, key } => {
                    let mac = sim::prefix_proof(&key, &file[..from as usize]);
                    sender.handle(sender::Input::PrefixProof { mac }, now);
                }
                sender::Action::Finish(o) => sender_outcome = Some(o),
                a => panic!("a single file's sender asked for {a:?}"),
            }
        }
        // The receiver's actions.
        while let Some(a) = receiver.poll_action() {
            match a {
                receiver::Action::Send => {
                    receiver.transmit(&mut out);
                    to_sender.push_back(out.clone());
                }
                receiver::Action::Open { slot_size, slot_count, .. } => {
                    ring = vec![0; slot_size as usize * slot_count as usize];
                    if receiver.resume_key().is_some() {
                        let proof = sim::prefix_proof(&receiver.prefix_key(), &stored[..held as usize]);
                        receiver.handle(receiver::Input::Resumed { from: held, proof }, now);
                    }
                    receiver.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: 7 }, now);
                }
                receiver::Action::StoreChunk { seq, slot, offset, len } => {
                    let from = slot as usize * receiver_slot(&sender);
                    stored[offset as usize..][..len as usize].copy_from_slice(&ring[from..][..len as usize]);
                    receiver.handle(receiver::Input::ChunkStored { seq }, now);
                }
                receiver::Action::Finalize { digest: theirs } => {
                    let status = if theirs == digest(&stored) { Status::Ok } else { Status::ChecksumMismatch };
                    receiver.handle(receiver::Input::Finalized(status, String::new()), now);
                }
                receiver::Action::Discard => {}
                receiver::Action::Finish(o) => receiver_outcome = Some(o),
                a => panic!("a single file's receiver asked for {a:?}"),
            }
        }
        if sender_outcome.is_some() && receiver_outcome.is_some() {
            break;
        }
        // One delivery, chosen at random among those possible.
        let mut choices: Vec<usize> = Vec::new();
        for (l, q) in lanes.iter().enumerate() {
            if !q.is_empty() {
                choices.push(l);
            }
        }
        for (l, q) in completions.iter().enumerate() {
            if !q.is_empty() {
                choices.push(100 + l);
            }
        }
        if !to_sender.is_empty() {
            choices.push(200);
        }
        if choices.is_empty() {
            break;
        }
        let pick = choices[(rng.next() % choices.len() as u64) as usize];
        match pick {
            200 => {
                let m = to_sender.pop_front().unwrap();
                sender.handle(sender::Input::Message(&m), now);
            }
            c if c >= 100 => {
                let seq = completions[c - 100].pop_front().unwrap();
                sender.handle(sender::Input::WriteDone { seq }, now);
            }
            l => match lanes[l].pop_front().unwrap() {
                Item::Message(m) => receiver.handle(receiver::Input::Message(&m), now),
                Item::Write { seq, imm, at, bytes } => {
                    ring[at..at + bytes.len()].copy_from_slice(&bytes);
                    let len = bytes.len() as u32;
                    let input = match l {
                        0 => receiver::Input::WriteArrived { imm, len },
                        l => receiver::Input::LaneWrite { lane: l as u16, imm, len },
                    };
                    receiver.handle(input, now);
                    completions[l].push_back(seq);
                }
            },
        }
    }
    Run { sender, receiver, sender_outcome, receiver_outcome, stored }
}

/// The slot size the sender was granted.
fn receiver_slot(sender: &Sender) -> usize {
    sender.grant().map_or(1, |g| g.slot_size as usize)
}

fn striping(lanes: u16) -> SenderConfig {
    let mut cfg = sender_cfg(16, 6);
    cfg.lanes = lanes;
    cfg
}

fn max_lanes(max_slots: u32, lanes: u16) -> ReceiverConfig {
    let mut cfg = receiver_cfg(max_slots);
    cfg.max_lanes = lanes;
    cfg
}

fn assert_stored(r: &Run, file: &[u8]) {
    assert!(
        matches!(r.sender_outcome, Some(Outcome::Acked { status: Status::Ok, .. })),
        "sender: {:?}",
        r.sender_outcome
    );
    assert!(
        matches!(r.receiver_outcome, Some(Outcome::Acked { status: Status::Ok, .. })),
        "receiver: {:?}",
        r.receiver_outcome
    );
    assert!(r.stored == file, "the stored bytes differ from the file");
}

#[test]
fn striped_files_arrive_identical_whatever_the_lanes_interleaving() {
    for lanes in [2u16, 3, 4] {
        for size in [0usize, 1, 15, 16, 17, 32, 16 * 6, 16 * 40 + 5] {
            for seed in 0..24 {
                let file = file_of(size, seed);
                let r = run(&file, striping(lanes), max_lanes(6, 4), 0, seed);
                assert_stored(&r, &file);
                assert_eq!(r.sender.lanes(), lanes, "lanes {lanes}, size {size}, seed {seed}");
                assert_eq!(r.receiver.lanes(), lanes);
                assert_eq!(r.sender.grant().and_then(|g| g.lanes).map(|l| l.token), Some([0xab; 16]));
            }
        }
    }
}

#[test]
fn more_lanes_than_slots_still_go_through() {
    for seed in 0..16 {
        let file = file_of(16 * 30 + 3, seed);
        let r = run(&file, striping(4), max_lanes(2, 4), 0, seed);
        assert_stored(&r, &file);
        assert_eq!(r.sender.grant().map(|g| g.slot_count), Some(2));
    }
}

#[test]
fn the_receiver_grants_at_most_its_max_lanes() {
    for seed in 0..8 {
        let file = file_of(16 * 20, seed);
        let r = run(&file, striping(4), max_lanes(6, 2), 0, seed);
        assert_stored(&r, &file);
        assert_eq!((r.sender.lanes(), r.receiver.lanes()), (2, 2));
    }
}

#[test]
fn a_peer_that_does_not_stripe_falls_back_to_one_lane() {
    for seed in 0..8 {
        let file = file_of(16 * 20 + 1, seed);
        // A new sender, a receiver that grants no lanes (as one without LANES: no bit, no block).
        let r = run(&file, striping(4), max_lanes(6, 1), 0, seed);
        assert_stored(&r, &file);
        assert_eq!((r.sender.lanes(), r.receiver.lanes()), (1, 1));
        let g = r.sender.grant().unwrap();
        assert_eq!((g.caps & caps::LANES, g.lanes), (0, None));
        // An old sender (one lane, no LANES offered), a receiver that would stripe.
        let r = run(&file, striping(1), max_lanes(6, 4), 0, seed);
        assert_stored(&r, &file);
        assert_eq!((r.sender.lanes(), r.receiver.lanes()), (1, 1));
        assert_eq!(r.sender.grant().unwrap().lanes, None);
    }
}

#[test]
fn an_old_receiver_reads_a_striping_hello_as_before() {
    // A receiver that does not know bit 11 decodes the HELLO without it: the resume key is in
    // its old place, and the lanes after it are appended bytes it ignores.
    for (resume, offered) in [(Some(0xfeed_u64), caps::RESUME), (None, 0)] {
        let hello = Hello {
            version_min: 1,
            version_max: 1,
            caps: caps::DIGEST_XXH3_128 | caps::LANES | offered,
            size: 99,
            chunk: 16,
            depth: 4,
            name: "f".into(),
            resume,
            lanes: 4,
        };
        let mut buf = Vec::new();
        wire::encode(1, &Message::Hello(hello.clone()), &mut buf).unwrap();
        buf[24..28].copy_from_slice(&(hello.caps & !caps::LANES).to_be_bytes());
        let Ok((_, Message::Hello(old))) = wire::decode(&buf) else { panic!("does not decode") };
        assert_eq!(old.resume, Some(resume.unwrap_or(0)));
        assert_eq!((old.lanes, old.size, old.name.as_str()), (1, 99, "f"));
    }
}

#[test]
fn a_resume_with_lanes_sends_only_the_rest() {
    for lanes in [2u16, 4] {
        for held in [0u64, 1, 16, 16 * 7 + 3, 16 * 20] {
            for seed in 0..8 {
                let file = file_of(16 * 20, seed);
                let mut s = striping(lanes);
                s.resume_key = Some(0x4e5);
                let mut r_cfg = max_lanes(6, 4);
                r_cfg.resume = true;
                let r = run(&file, s, r_cfg, held, seed);
                assert_stored(&r, &file);
                assert_eq!(r.sender.resumed_from(), held);
                assert_eq!(r.sender.chunks(), (16 * 20 - held).div_ceil(16));
                assert_eq!(r.sender.lanes(), lanes);
            }
        }
    }
}

// ---- The receiver alone: what it refuses on a lane. ----

/// A receiver granted `lanes` lanes of 2 slots of 4 bytes for a file of `size` bytes, in its
/// data phase, with the GRANT taken out.
fn granted_for(size: u64, lanes: u16) -> Receiver {
    let now = Instant::now();
    let mut cfg = max_lanes(2, 4);
    cfg.max_chunk = 4;
    let mut r = Receiver::new(cfg, now).with_lane_token([1; 16]);
    let hello = Hello {
        version_min: 1,
        version_max: 1,
        caps: caps::DIGEST_XXH3_128 | caps::LANES,
        size,
        chunk: 4,
        depth: 2,
        name: "f".into(),
        resume: None,
        lanes,
    };
    let mut buf = Vec::new();
    wire::encode(9, &Message::Hello(hello), &mut buf).unwrap();
    r.handle(receiver::Input::Message(&buf), now);
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: 7 }, now);
    let mut stores = Vec::new();
    drain(&mut r, &mut stores);
    r
}

/// [`granted_for`] a 40-byte file (10 chunks).
fn granted(lanes: u16) -> Receiver {
    granted_for(40, lanes)
}

/// Takes the receiver's actions; the chunks it asks to store go to `stores`; its outcome.
fn drain(r: &mut Receiver, stores: &mut Vec<u64>) -> Option<Outcome> {
    let mut outcome = None;
    let mut out = Vec::new();
    while let Some(a) = r.poll_action() {
        match a {
            receiver::Action::Send => {
                r.transmit(&mut out);
            }
            receiver::Action::StoreChunk { seq, .. } => stores.push(seq),
            receiver::Action::Finish(o) => outcome = Some(o),
            _ => {}
        }
    }
    outcome
}

fn refused(o: Option<Outcome>) -> bool {
    matches!(o, Some(Outcome::Failed(ProtocolError::Peer(_))))
}

#[test]
fn chunks_are_stored_in_order_whatever_lane_brings_them_first() {
    let now = Instant::now();
    let mut r = granted(2);
    let mut stores = Vec::new();
    // Chunk 1 (lane 1) before chunk 0 (lane 0): taken, but stored only once chunk 0 came.
    r.handle(receiver::Input::LaneWrite { lane: 1, imm: 1, len: 4 }, now);
    assert_eq!(drain(&mut r, &mut stores), None);
    assert!(stores.is_empty());
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 4 }, now);
    assert_eq!(drain(&mut r, &mut stores), None);
    assert_eq!(stores, [0, 1]);
}

#[test]
fn a_write_on_the_wrong_lane_or_out_of_its_order_is_refused() {
    let now = Instant::now();
    let cases: [&[receiver::Input<'_>]; 7] = [
        // Chunk 0 belongs to lane 0.
        &[receiver::Input::LaneWrite { lane: 1, imm: 0, len: 4 }],
        // Chunk 1 belongs to lane 1.
        &[receiver::Input::WriteArrived { imm: 1, len: 4 }],
        // Lane 1's chunks in order: 3 before 1.
        &[receiver::Input::LaneWrite { lane: 1, imm: 3, len: 4 }],
        // A lane not granted.
        &[receiver::Input::LaneWrite { lane: 2, imm: 2, len: 4 }],
        // A control message on an extra lane.
        &[receiver::Input::LaneMessage { lane: 1 }],
        // Beyond the credit: 2 slots, so chunk 3 before chunks 0 and 1 were stored and credited.
        &[
            receiver::Input::LaneWrite { lane: 1, imm: 1, len: 4 },
            receiver::Input::LaneWrite { lane: 1, imm: 3, len: 4 },
        ],
        // A chunk of the wrong length.
        &[receiver::Input::LaneWrite { lane: 1, imm: 1, len: 3 }],
    ];
    for (i, inputs) in cases.into_iter().enumerate() {
        let mut r = granted(2);
        let mut stores = Vec::new();
        let mut outcome = None;
        for input in inputs {
            let input = match input {
                receiver::Input::LaneWrite { lane, imm, len } => {
                    receiver::Input::LaneWrite { lane: *lane, imm: *imm, len: *len }
                }
                receiver::Input::WriteArrived { imm, len } => receiver::Input::WriteArrived { imm: *imm, len: *len },
                receiver::Input::LaneMessage { lane } => receiver::Input::LaneMessage { lane: *lane },
                _ => unreachable!(),
            };
            r.handle(input, now);
            outcome = outcome.or(drain(&mut r, &mut stores));
        }
        assert!(refused(outcome.clone()), "case {i}: {outcome:?}");
        assert!(r.is_done(), "case {i}");
    }
}

#[test]
fn a_fin_may_overtake_the_other_lanes_last_writes_but_not_lane_0s() {
    let now = Instant::now();
    let fin = |chunks: u64| {
        let mut buf = Vec::new();
        let m = Message::Fin(wire::Fin { chunks, size: 8, digest: digest(&[0; 8]) });
        wire::encode(9, &m, &mut buf).unwrap();
        buf
    };
    // An 8-byte file: chunk 0 on lane 0, chunk 1 on lane 1.
    let small = || granted_for(8, 2);
    let mut r = small();
    let mut stores = Vec::new();
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 4 }, now);
    r.handle(receiver::Input::ChunkStored { seq: 0 }, now);
    r.handle(receiver::Input::Message(&fin(2)), now);
    assert_eq!(drain(&mut r, &mut stores), None, "lane 1's WRITE is still on its way");
    r.handle(receiver::Input::LaneWrite { lane: 1, imm: 1, len: 4 }, now);
    r.handle(receiver::Input::ChunkStored { seq: 1 }, now);
    let mut finalized = false;
    while let Some(a) = r.poll_action() {
        finalized |= matches!(a, receiver::Action::Finalize { .. });
    }
    assert!(finalized, "every chunk stored after the FIN: finalized");

    // Lane 0's own chunk missing at its FIN: refused (RC keeps lane 0 in order).
    let mut r = small();
    r.handle(receiver::Input::LaneWrite { lane: 1, imm: 1, len: 4 }, now);
    r.handle(receiver::Input::Message(&fin(2)), now);
    assert!(refused(drain(&mut r, &mut Vec::new())));
}

// ---- The sender alone: its clock while the lanes connect. ----

#[test]
fn the_data_phase_timeout_counts_from_when_the_lanes_are_connected() {
    let t0 = Instant::now();
    let timeout = std::time::Duration::from_secs(10);
    let mut s = Sender::new(0x5e55, "f", 64, striping(2), t0).unwrap();
    while s.poll_action().is_some() {} // the HELLO
    let grant = wire::Grant {
        version: 1,
        caps: caps::DIGEST_XXH3_128 | caps::LANES,
        addr: RING_ADDR,
        rkey: 7,
        slot_size: 16,
        slot_count: 2,
        resume_from: 0,
        lanes: Some(wire::Lanes { count: 2, token: [3; 16] }),
    };
    let mut buf = Vec::new();
    wire::encode(0x5e55, &Message::Grant(grant), &mut buf).unwrap();
    s.handle(sender::Input::Message(&buf), t0);
    assert_eq!(s.lanes(), 2);
    assert_eq!(s.poll_timeout(), Some(t0 + timeout), "the GRANT starts the data phase's clock");
    // Connecting the extra lane took most of the timeout (within the driver's own connect
    // timeout): the first WRITEs get the whole timeout from when it is up.
    let up = t0 + timeout - std::time::Duration::from_secs(1);
    s.handle(sender::Input::LanesConnected, up);
    assert_eq!(s.poll_timeout(), Some(up + timeout));
    s.handle_timeout(t0 + timeout);
    assert!(!s.is_done(), "timed out while the lanes were connecting");
    s.handle_timeout(up + timeout);
    assert!(s.is_done(), "no progress for the timeout after the lanes are up");
}
