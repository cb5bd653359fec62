//! The sender and receiver machines driven against each other in memory (the simulation is in
//! `sim/`: a simulated driver for each side and a simulated network): files of every
//! edge size arrive identical through rings as small as two slots, memory stays bounded, refusals
//! and corruption end with the right status at both ends, and a hostile network (reordering,
//! duplicating, dropping, truncating, corrupting) never makes either machine panic, hang, or
//! report success for bytes that differ from the file.

mod sim;

use std::time::{Duration, Instant};

use rdma_proto::digest::DIGEST_CAPS;
use rdma_proto::receiver::{self, Receiver};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{self, caps, Ack, Credit, Fin, Grant, Hello, Message};
use rdma_proto::{Digest, Outcome, ProtocolError, Status};
use sim::*;

#[test]
fn files_of_every_edge_size_arrive_identical() {
    let chunk = 16;
    for size in [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 40 * chunk + 5] {
        for seed in 0..16 {
            let sim =
                transfer(file_of(size, seed), sender_cfg(chunk as u32, 4), receiver_cfg(4), Hooks::default(), seed);
            assert_ok(&sim);
            assert_eq!(sim.sender.chunks(), size.div_ceil(chunk) as u64);
            assert_eq!(sim.sender.chunks_written(), sim.sender.chunks());
        }
    }
}

#[test]
fn many_chunks_go_through_a_ring_of_two_slots() {
    for seed in 0..8 {
        let sim = transfer(file_of(7 * 500 + 3, seed), sender_cfg(7, 2), receiver_cfg(2), Hooks::default(), seed);
        assert_ok(&sim);
        assert_eq!(sim.sender.grant().map(|g| (g.slot_size, g.slot_count)), Some((7, 2)));
        assert_eq!(sim.sender.chunks(), 501);
        // Bounded, and the bounds are reached: the pipeline is used.
        assert!(sim.max_local_slots <= 2 && sim.max_ring_in_use <= 2);
        assert_eq!(sim.max_ring_in_use, 2, "seed {seed}: the ring was never full");
    }
}

#[test]
fn the_receiver_grants_smaller_slots_and_fewer_of_them() {
    let mut receiver = receiver_cfg(64);
    (receiver.max_chunk, receiver.memory_budget) = (5, 15);
    for seed in 0..8 {
        let sim = transfer(file_of(123, seed), sender_cfg(16, 8), receiver.clone(), Hooks::default(), seed);
        assert_ok(&sim);
        assert_eq!(sim.sender.grant().map(|g| (g.slot_size, g.slot_count)), Some((5, 3)));
        assert_eq!(sim.sender.chunks(), 25);
        assert!(sim.max_ring_in_use <= 3 && sim.max_local_slots <= 8);
    }
}

#[test]
fn a_corrupted_chunk_is_a_checksum_mismatch_at_both_ends() {
    for (size, bad) in [(1, 0), (100, 0), (100, 3), (100, 6)] {
        let hooks = Hooks { corrupt_slot_of: Some(bad), ..Hooks::default() };
        let sim = transfer(file_of(size, 1), sender_cfg(16, 4), receiver_cfg(2), hooks, 1);
        assert_eq!(acked(&sim.receiver_outcome), Some(Status::ChecksumMismatch));
        assert_eq!(acked(&sim.sender_outcome), Some(Status::ChecksumMismatch));
        assert_eq!(Status::ChecksumMismatch.exit_code(), 11);
        assert_eq!(sim.temp, Temp::Discarded);
    }
}

#[test]
fn driver_failures_reach_the_sender_as_their_status() {
    for status in [Status::Exists, Status::NoSpace, Status::DiskIo, Status::Busy] {
        let hooks = Hooks { open_fails: Some(status), ..Hooks::default() };
        let sim = transfer(file_of(50, 2), sender_cfg(16, 4), receiver_cfg(4), hooks, 2);
        assert_eq!((acked(&sim.sender_outcome), acked(&sim.receiver_outcome)), (Some(status), Some(status)));
        assert_eq!(sim.temp, Temp::None, "a refused open leaves no temporary");

        let hooks = Hooks { store_fails: Some((2, status)), ..Hooks::default() };
        let sim = transfer(file_of(50, 2), sender_cfg(16, 4), receiver_cfg(4), hooks, 2);
        assert_eq!(acked(&sim.sender_outcome), Some(status));
        assert!(matches!(sim.receiver_outcome, Some(Outcome::Failed(ProtocolError::Local(_)))));
        assert_eq!(sim.temp, Temp::Discarded);
    }
}

#[test]
fn a_link_gone_silent_times_both_sides_out() {
    for after in [0, 1, 3, 6] {
        let hooks = Hooks { blackout_after: Some(after), ..Hooks::default() };
        let sim = transfer(file_of(100, 3), sender_cfg(16, 2), receiver_cfg(2), hooks, 3);
        assert!(
            matches!(sim.sender_outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))),
            "after {after}: {:?}",
            sim.sender_outcome
        );
        assert!(matches!(sim.receiver_outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))));
        assert!(matches!(sim.temp, Temp::None | Temp::Discarded));
        assert!(sim.acks_sent.is_empty(), "a timeout sends no ACK");
    }
}

#[test]
fn a_timeout_too_large_to_represent_waits_without_panicking() {
    // Duration::MAX is "no deadline" elsewhere in the workspace; here it must not overflow.
    let mut cfg = sender_cfg(16, 2);
    cfg.timeout = Duration::MAX;
    let mut rcfg = receiver_cfg(2);
    rcfg.timeout = Duration::MAX;
    let sim = transfer(file_of(100, 4), cfg.clone(), rcfg, Hooks::default(), 4);
    assert_ok(&sim);
    let now = Instant::now();
    let s = Sender::new(1, "f", 10, cfg, now).unwrap();
    assert_eq!(s.poll_timeout(), None, "no deadline, as rdma_verbs::Deadline has it");
}

#[test]
fn repeated_credits_do_not_hold_off_the_senders_timeout() {
    // A receiver that never ACKs but keeps repeating an old CREDIT must not keep the sender
    // waiting: only a credit for new slots is progress.
    let t0 = Instant::now();
    let cfg = sender_cfg(16, 2);
    let timeout = cfg.timeout;
    let mut s = Sender::new(7, "f", 0, cfg, t0).unwrap();
    let _ = actions_of_sender(&mut s);
    let grant = grant_of(16, 2);
    s.handle(sender::Input::Message(&encode(7, &Message::Grant(grant))), t0);
    for a in actions_of_sender(&mut s) {
        if let sender::Action::NeedDigest = a {
            s.handle(sender::Input::Digest(digest(&[])), t0);
        }
    }
    let _ = actions_of_sender(&mut s); // the FIN
    let mut now = t0;
    while now < t0 + timeout * 2 && !s.is_done() {
        now += Duration::from_millis(100);
        s.handle(sender::Input::Message(&encode(7, &Message::Credit(Credit { consumed: 0 }))), now);
        s.handle_timeout(now);
    }
    assert!(s.is_done(), "still waiting after {:?}", now - t0);
    assert!(now <= t0 + timeout + Duration::from_millis(100), "timed out only after {:?}", now - t0);
    let outcome = actions_of_sender(&mut s).into_iter().find_map(|a| match a {
        sender::Action::Finish(o) => Some(o),
        _ => None,
    });
    assert!(matches!(outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))), "{outcome:?}");
}

/// `Sender::waits_for_room` holds exactly while a read chunk waits for a slot at the receiver:
/// then a completion of the sender's WRITEs moves nothing but the read-ahead (the driver need
/// not wake for it), and a CREDIT ends it with the next WRITE. A sender whose WRITEs are all
/// credited, or that has every chunk written, does not wait for room.
#[test]
fn a_sender_waits_for_room_only_while_a_read_chunk_has_no_slot_at_the_receiver() {
    let t0 = Instant::now();
    let mut s = Sender::new(7, "f", 6 * 16, sender_cfg(16, 4), t0).unwrap();
    let _ = actions_of_sender(&mut s);
    assert!(!s.waits_for_room(), "before the GRANT");
    let grant = grant_of(16, 2);
    s.handle(sender::Input::Message(&encode(7, &Message::Grant(grant))), t0);
    let writes = |actions: &[sender::Action]| {
        actions
            .iter()
            .filter_map(|a| match a {
                sender::Action::WriteChunk { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let reads = |actions: &[sender::Action]| {
        actions
            .iter()
            .filter_map(|a| match a {
                sender::Action::ReadChunk { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // Four local slots: chunks 0-3 are read; the ring of two takes 0 and 1.
    let first = reads(&actions_of_sender(&mut s));
    assert_eq!(first, [0, 1, 2, 3]);
    let mut written = Vec::new();
    for seq in first {
        s.handle(sender::Input::ChunkRead { seq }, t0);
        written.extend(writes(&actions_of_sender(&mut s)));
    }
    assert_eq!(written, [0, 1]);
    assert!(s.waits_for_room(), "chunk 2 is read and the ring is full");
    // Their completions free slots to read ahead into, and nothing else.
    s.handle(sender::Input::WriteDone { seq: 1 }, t0);
    let after_done = actions_of_sender(&mut s);
    assert!(writes(&after_done).is_empty(), "{after_done:?}");
    assert_eq!(reads(&after_done), [4, 5]);
    assert!(s.waits_for_room());
    // The CREDIT moves it on.
    s.handle(sender::Input::Message(&encode(7, &Message::Credit(Credit { consumed: 2 }))), t0);
    assert_eq!(writes(&actions_of_sender(&mut s)), [2, 3]);
    assert!(!s.waits_for_room(), "no read chunk waits: 4 and 5 are still being read");
    for seq in [4, 5] {
        s.handle(sender::Input::ChunkRead { seq }, t0);
        assert!(writes(&actions_of_sender(&mut s)).is_empty());
    }
    assert!(s.waits_for_room());
    s.handle(sender::Input::Message(&encode(7, &Message::Credit(Credit { consumed: 4 }))), t0);
    assert_eq!(writes(&actions_of_sender(&mut s)), [4, 5]);
    assert!(!s.waits_for_room(), "every chunk is written: the FIN waits for their completions");
}

/// A GRANT of a ring of `slot_count` slots of `slot_size` bytes at address 4096, rkey 1.
fn grant_of(slot_size: u32, slot_count: u32) -> Grant {
    Grant {
        version: 1,
        caps: caps::DIGEST_XXH3_128,
        addr: 4096,
        rkey: 1,
        slot_size,
        slot_count,
        resume_from: 0,
        lanes: None,
    }
}

// ---- The receiver alone, fed hand-made messages. ----

fn encode(session: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode(session, m, &mut out).expect("encodes");
    out
}

fn hello(name: &str, size: u64) -> Hello {
    Hello {
        version_min: 1,
        version_max: 1,
        caps: caps::DIGEST_XXH3_128,
        size,
        chunk: 16,
        depth: 4,
        name: name.into(),
        resume: None,
        lanes: 1,
    }
}

/// Every action the receiver asks for, and the bytes of each control message it sends (one per
/// `Send`, taken with `transmit`: none left over, none missing).
fn polled(r: &mut Receiver) -> (Vec<receiver::Action>, Vec<Vec<u8>>) {
    let actions: Vec<_> = std::iter::from_fn(|| r.poll_action()).collect();
    let sends = actions.iter().filter(|a| **a == receiver::Action::Send).count();
    let sent: Vec<Vec<u8>> = (0..sends)
        .map(|_| {
            let mut b = Vec::new();
            assert!(r.transmit(&mut b), "a Send without its message");
            b
        })
        .collect();
    assert!(!r.transmit(&mut Vec::new()), "a message without its Send");
    (actions, sent)
}

fn actions_of_receiver(r: &mut Receiver) -> Vec<receiver::Action> {
    polled(r).0
}

fn actions_of_sender(s: &mut Sender) -> Vec<sender::Action> {
    let actions: Vec<_> = std::iter::from_fn(|| s.poll_action()).collect();
    for _ in actions.iter().filter(|a| **a == sender::Action::Send) {
        assert!(s.transmit(&mut Vec::new()), "a Send without its message");
    }
    actions
}

/// The ACK among the messages `sent`, decoded, with the session it echoes.
fn ack_in(sent: &[Vec<u8>]) -> Option<(u64, Ack)> {
    sent.iter().find_map(|b| match wire::decode(b) {
        Ok((h, Message::Ack(ack))) => Some((h.session, ack)),
        _ => None,
    })
}

#[test]
fn bad_hellos_are_refused_with_their_status() {
    let t = Instant::now();
    let mut cfg = receiver_cfg(4);
    cfg.max_size = 1000;
    let cases = [
        (hello("../etc", 1), Status::BadName),
        (hello("", 1), Status::BadName),
        (hello("a/b", 1), Status::BadName),
        (hello("nul\0", 1), Status::BadName),
        (hello("big", 1001), Status::TooLarge),
        (hello("big", u64::MAX), Status::TooLarge),
        (Hello { version_min: 5, version_max: 6, ..hello("v", 1) }, Status::ProtocolMismatch),
        (Hello { version_min: 0, version_max: 0, ..hello("v", 1) }, Status::ProtocolMismatch),
        (Hello { caps: caps::DIGEST_BLAKE3, ..hello("c", 1) }, Status::ProtocolMismatch),
        (Hello { chunk: 0, ..hello("z", 1) }, Status::ProtocolMismatch),
        (Hello { depth: 0, ..hello("z", 1) }, Status::ProtocolMismatch),
    ];
    for (h, status) in cases {
        let what = format!("{h:?}");
        let mut r = Receiver::new(cfg.clone(), t);
        r.handle(receiver::Input::Message(&encode(77, &Message::Hello(h))), t);
        let (actions, sent) = polled(&mut r);
        let (session, ack) = ack_in(&sent).unwrap_or_else(|| panic!("{what}: no ACK"));
        assert_eq!((session, ack.status, ack.received), (77, status, 0), "{what}");
        assert!(!actions.iter().any(|a| matches!(a, receiver::Action::Open { .. })), "{what}: opened");
        assert!(
            matches!(actions.last(), Some(receiver::Action::Finish(Outcome::Acked { status: s, .. })) if *s == status)
        );
        assert!(r.is_done());
        // The driver logs and reports a refused session under its id, and counts it as a
        // transfer asked for (`recv --count`).
        assert_eq!(r.session(), 77, "{what}");
        assert!(r.hello_received(), "{what}");
    }
    assert_eq!([Status::BadName, Status::TooLarge, Status::ProtocolMismatch].map(Status::exit_code), [16, 15, 14]);
}

/// A connection whose first message is no HELLO asked for no transfer: `recv --count` must not
/// count it (a connection that sent nothing must not use up one of the count).
#[test]
fn a_first_message_that_is_no_hello_is_no_transfer() {
    let t = Instant::now();
    for bytes in [vec![0xde, 0xad, 0xbe, 0xef], encode(5, &Message::Credit(Credit { consumed: 1 }))] {
        let mut r = Receiver::new(receiver_cfg(4), t);
        r.handle(receiver::Input::Message(&bytes), t);
        let _ = polled(&mut r);
        assert!(r.is_done());
        assert!(!r.hello_received());
    }
    let mut idle = Receiver::new(receiver_cfg(4), t);
    idle.handle_timeout(t + Duration::from_secs(3600));
    assert!(idle.is_done() && !idle.hello_received());
}

#[test]
fn hellos_within_the_limits_are_granted_the_common_version() {
    let t = Instant::now();
    for (min, max) in [(1, 1), (0, 1), (1, 9), (0, u16::MAX)] {
        let h = Hello { version_min: min, version_max: max, caps: u32::MAX, ..hello("ok", 10) };
        let mut r = Receiver::new(receiver_cfg(4), t);
        r.handle(receiver::Input::Message(&encode(5, &Message::Hello(h))), t);
        assert!(matches!(actions_of_receiver(&mut r)[..], [receiver::Action::Open { .. }]));
        r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
        let (actions, sent) = polled(&mut r);
        assert_eq!(actions, [receiver::Action::Send]);
        let Ok((_, Message::Grant(g))) = wire::decode(&sent[0]) else { panic!("not a GRANT") };
        assert_eq!(g.version, 1, "offered {min}..={max}");
        // Of those offered, the digest and CANCEL (both sides may cancel); nothing this
        // receiver was not configured for.
        assert_eq!(g.caps, caps::DIGEST_XXH3_128 | caps::CANCEL, "only the capabilities both know");
    }
}

/// A receiver probes only a sender that said its connection takes probes (a QP that refuses
/// remote writes would fail on the first): a sender offers `caps::PROBES` when its
/// configuration says its driver's QP takes them, and the receiver reports what the HELLO
/// offered.
#[test]
fn a_receiver_takes_probes_to_be_welcome_only_when_the_hello_offered_them() {
    let t = Instant::now();
    for probes in [false, true] {
        let mut cfg = sender_cfg(16, 4);
        cfg.probes = probes;
        let mut s = Sender::new(7, "f", 10, cfg, t).unwrap();
        assert_eq!(s.poll_action(), Some(sender::Action::Send));
        let mut out = Vec::new();
        assert!(s.transmit(&mut out));
        let Ok((_, Message::Hello(offered))) = wire::decode(&out) else { panic!("not a HELLO") };
        assert_eq!(offered.caps & caps::PROBES != 0, probes, "PROBES offered as configured");
    }
    for (caps, takes) in [(caps::DIGEST_XXH3_128 | caps::PROBES, true), (caps::DIGEST_XXH3_128, false)] {
        let mut r = Receiver::new(receiver_cfg(4), t);
        assert!(!r.takes_probes(), "before any HELLO");
        r.handle(receiver::Input::Message(&encode(5, &Message::Hello(Hello { caps, ..hello("ok", 10) }))), t);
        assert_eq!(r.takes_probes(), takes, "HELLO caps {caps:#x}");
    }
}

#[test]
fn refused_senders_exit_with_the_status_code() {
    let t = Instant::now();
    let run = |sender: Sender, max_size: u64| {
        let mut cfg = receiver_cfg(4);
        cfg.max_size = max_size;
        let mut sim =
            Sim::new("refusal".into(), 0, vec![1; 10], "x", sender_cfg(4, 2), cfg, Faults::default(), Hooks::default());
        sim.sender = sender;
        sim.run(100);
        acked(&sim.sender_outcome).map(Status::exit_code)
    };
    let versions = Sender::offering(SESSION, "x", 10, sender_cfg(4, 2), t, 5..=6).unwrap();
    assert_eq!(run(versions, 100), Some(14));
    let name = Sender::offering(SESSION, "../x", 10, sender_cfg(4, 2), t, 1..=1).unwrap();
    assert_eq!(run(name, 100), Some(16));
    let large = Sender::new(SESSION, "x", 10, sender_cfg(4, 2), t).unwrap();
    assert_eq!(run(large, 9), Some(15));
}

/// A receiver in its data phase: HELLO of `size` bytes in chunks of 16, 2 slots, granted.
fn receiving(size: u64) -> (Receiver, Instant) {
    let t = Instant::now();
    let mut r = Receiver::new(receiver_cfg(2), t);
    let h = Hello { depth: 2, ..hello("f", size) };
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
    actions_of_receiver(&mut r);
    (r, t)
}

/// The ACK status a receiver sent, and whether it discarded its temporary.
fn verdict(r: &mut Receiver) -> (Option<Status>, bool) {
    let (actions, sent) = polled(r);
    let discarded = actions.contains(&receiver::Action::Discard);
    (ack_in(&sent).map(|(_, a)| a.status), discarded)
}

#[test]
fn every_write_arrival_is_checked() {
    let write = |imm, len| receiver::Input::WriteArrived { imm, len };
    let mismatch = (Some(Status::ProtocolMismatch), true);

    // Accepted: chunk 0 then 1 (of 40 bytes: 16, 16, 8), each asking for its store.
    let (mut r, t) = receiving(40);
    r.handle(write(0, 16), t);
    r.handle(write(1, 16), t);
    let stores: Vec<_> = actions_of_receiver(&mut r);
    assert_eq!(
        stores,
        [
            receiver::Action::StoreChunk { seq: 0, slot: 0, offset: 0, len: 16 },
            receiver::Action::StoreChunk { seq: 1, slot: 1, offset: 16, len: 16 },
        ]
    );
    // Chunk 2 goes to slot 0: only once chunk 0 left it and was credited.
    r.handle(write(2, 8), t);
    assert_eq!(verdict(&mut r), mismatch, "a WRITE into a slot not credited");

    let (mut r, t) = receiving(40);
    r.handle(write(1, 16), t);
    assert_eq!(verdict(&mut r), mismatch, "an immediate that is not the next chunk");

    let (mut r, t) = receiving(40);
    r.handle(write(0, 15), t);
    assert_eq!(verdict(&mut r), mismatch, "a length that is not the chunk's");

    // The chunk that arrived last, again (Linux 6.1's rxe executing a retransmitted WRITE a
    // second time): the session ends without a verdict, for the sender to send again. One
    // further back is the peer's violation.
    let (mut r, t) = receiving(40);
    r.handle(write(0, 16), t);
    r.handle(write(0, 16), t);
    let (actions, sent) = polled(&mut r);
    assert_eq!(ack_in(&sent).map(|(_, a)| a.status), None, "no verdict: {sent:?}");
    assert!(
        actions.iter().any(|a| matches!(
            a,
            receiver::Action::Finish(Outcome::Failed(ProtocolError::CompletedTwice { chunk: 0 }))
        )),
        "{actions:?}"
    );
    let (mut r, t) = receiving(40);
    for seq in 0..2 {
        r.handle(write(seq, 16), t);
        r.handle(receiver::Input::ChunkStored { seq: u64::from(seq) }, t);
    }
    r.handle(write(0, 16), t);
    assert_eq!(verdict(&mut r).0, Some(Status::ProtocolMismatch), "a chunk two back");

    let (mut r, t) = receiving(40);
    for seq in 0..3 {
        r.handle(write(seq, if seq == 2 { 8 } else { 16 }), t);
        r.handle(receiver::Input::ChunkStored { seq: u64::from(seq) }, t);
    }
    r.handle(write(3, 16), t);
    assert_eq!(verdict(&mut r).0, Some(Status::ProtocolMismatch), "a WRITE beyond the file");

    let (mut r, t) = receiving(0);
    r.handle(write(0, 0), t);
    assert_eq!(verdict(&mut r).0, Some(Status::ProtocolMismatch), "a WRITE into an empty file");

    let (mut r, t) = receiving(16);
    let fin = Fin { chunks: 0, size: 16, digest: vec![0; wire::DIGEST_LEN] };
    r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
    assert_eq!(verdict(&mut r), mismatch, "a FIN before the chunks");

    let (mut r, t) = receiving(16);
    r.handle(write(0, 16), t);
    let fin = Fin { chunks: 1, size: 16, digest: vec![0; wire::DIGEST_LEN] };
    r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
    r.handle(write(1, 16), t);
    assert_eq!(verdict(&mut r), mismatch, "a WRITE after the FIN");

    // Before the grant: no ring yet.
    let mut r = Receiver::new(receiver_cfg(2), t);
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(hello("f", 16)))), t);
    actions_of_receiver(&mut r);
    r.handle(write(0, 16), t);
    assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), false), "a WRITE before the grant");
}

// ---- The digest: offered by the sender, chosen by the receiver. ----

/// A receiver preferring `prefers`, after a HELLO offering `offered`: the GRANT's digest
/// bits, or the refusal's status.
fn granted_digest(prefers: Digest, offered: u32) -> Result<u32, Option<Status>> {
    let t = Instant::now();
    let mut cfg = receiver_cfg(2);
    cfg.digest = prefers;
    let mut r = Receiver::new(cfg, t);
    let h = Hello { caps: offered, ..hello("f", 16) };
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
    if r.is_done() || !actions_of_receiver(&mut r).iter().any(|a| matches!(a, receiver::Action::Open { .. })) {
        return Err(verdict(&mut r).0);
    }
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
    let (_, sent) = polled(&mut r);
    let Ok((_, Message::Grant(g))) = wire::decode(&sent[0]) else { panic!("not a GRANT") };
    assert_eq!(Digest::granted(g.caps), Some(r.digest()), "the GRANT names the digest the receiver uses");
    Ok(g.caps & DIGEST_CAPS)
}

#[test]
fn the_receiver_grants_one_digest_its_preferred_one_when_offered() {
    use caps::{DIGEST_XXH3_128 as XXH3, DIGEST_XXH64 as XXH64};
    // This crate's senders offer both: the receiver's preference decides.
    assert_eq!(granted_digest(Digest::Xxh64, XXH3 | XXH64), Ok(XXH64));
    assert_eq!(granted_digest(Digest::Xxh3_128, XXH3 | XXH64), Ok(XXH3));
    // A sender from before XXH64 offers XXH3-128 alone, and gets it whatever the preference.
    assert_eq!(granted_digest(Digest::Xxh64, XXH3), Ok(XXH3));
    assert_eq!(granted_digest(Digest::Xxh3_128, XXH64), Ok(XXH64));
    // Bits it does not know change nothing; no digest it knows is a refusal.
    assert_eq!(granted_digest(Digest::Xxh64, u32::MAX), Ok(XXH64));
    for offered in [0, caps::DIGEST_BLAKE3, caps::RESUME | caps::AUTH] {
        assert_eq!(granted_digest(Digest::Xxh64, offered), Err(Some(Status::ProtocolMismatch)), "{offered:#x}");
    }
}

#[test]
fn a_fin_must_carry_the_granted_digests_size() {
    let t = Instant::now();
    for (prefers, size) in [(Digest::Xxh64, 8), (Digest::Xxh3_128, 16)] {
        for len in [0, 8, 16, 32] {
            let mut cfg = receiver_cfg(2);
            cfg.digest = prefers;
            let mut r = Receiver::new(cfg, t);
            let h = Hello { caps: DIGEST_CAPS, ..hello("f", 0) };
            r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
            r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
            actions_of_receiver(&mut r);
            let fin = Fin { chunks: 0, size: 0, digest: vec![7; len] };
            r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
            let actions = actions_of_receiver(&mut r);
            let finalized =
                actions.iter().any(|a| matches!(a, receiver::Action::Finalize { digest } if digest.len() == size));
            assert_eq!(finalized, len == size, "{prefers} with a {len}-byte digest: {actions:?}");
            assert_eq!(r.is_done(), len != size, "{prefers} with a {len}-byte digest: the session ends");
        }
    }
}

#[test]
fn the_sender_takes_the_digest_the_grant_names() {
    let t = Instant::now();
    let mut s = Sender::new(SESSION, "f", 0, sender_cfg(4, 2), t).unwrap();
    let sent = actions_of_sender(&mut s);
    assert!(matches!(sent[..], [sender::Action::Send]), "{sent:?}");
    s.handle(
        sender::Input::Message(&encode(SESSION, &Message::Grant(Grant { caps: caps::DIGEST_XXH64, ..grant_4x2() }))),
        t,
    );
    assert_eq!(s.digest(), Digest::Xxh64);
    assert!(actions_of_sender(&mut s).contains(&sender::Action::NeedDigest));
    s.handle(sender::Input::Digest(vec![1; 8]), t);
    assert!(!s.is_done(), "an 8-byte digest is XXH64's");
}

#[test]
fn a_transfer_verifies_with_either_digest() {
    // The unkeyed ones: the keyed digest comes with a secret (tests/auth.rs).
    for prefers in Digest::ALL.into_iter().filter(|d| !d.is_keyed()) {
        let mut rcfg = receiver_cfg(2);
        rcfg.digest = prefers;
        let sim = transfer(file_of(100, 3), sender_cfg(16, 2), rcfg, Hooks::default(), 11);
        assert_ok(&sim);
        assert_eq!((sim.sender.digest(), sim.receiver.digest()), (prefers, prefers));
    }
}

#[test]
fn digests_are_named_as_the_command_line_spells_them() {
    for d in Digest::ALL {
        assert_eq!(Digest::granted(d.cap()), Some(d));
        if d.is_keyed() {
            // Chosen by the secret, never by name or as a fallback.
            assert!(d.to_string().parse::<Digest>().is_err(), "{d}");
            assert_eq!(Digest::choose(d.cap(), Digest::default(), false), None);
            assert_eq!(Digest::choose(d.cap() | DIGEST_CAPS, d, false), Some(Digest::Xxh64));
            assert_eq!(Digest::choose(d.cap() | DIGEST_CAPS, Digest::default(), true), Some(d));
        } else {
            assert_eq!(d.to_string().parse::<Digest>(), Ok(d));
            assert_eq!(Digest::choose(d.cap(), Digest::default(), false), Some(d));
            assert_eq!(Digest::choose(d.cap(), Digest::default(), true), None, "a secret takes only the keyed");
        }
    }
    assert!("blake3".parse::<Digest>().is_err());
    assert_eq!(Digest::granted(DIGEST_CAPS), None, "two digests at once");
    assert_eq!(Digest::granted(0), None);
}

/// A hostile sender that follows its FIN at once with junk, a WRITE, a second FIN, or lets the
/// clock run, before the driver committed: the commit asked for decides the verdict.
#[test]
fn nothing_after_the_fin_turns_a_commit_into_a_failure() {
    let junk = [0xde, 0xad, 0xbe, 0xef, 1, 2, 3];
    let fin = || Fin { chunks: 1, size: 16, digest: vec![7; wire::DIGEST_LEN] };
    let second_fin = encode(9, &Message::Fin(fin()));
    type Late<'a> = &'a dyn Fn(&mut Receiver, Instant);
    let cases: [(&str, Late<'_>); 5] = [
        ("junk", &|r, t| r.handle(receiver::Input::Message(&junk), t)),
        ("a WRITE", &|r, t| r.handle(receiver::Input::WriteArrived { imm: 1, len: 16 }, t)),
        ("a second FIN", &|r, t| r.handle(receiver::Input::Message(&second_fin), t)),
        ("a chunk stored twice", &|r, t| r.handle(receiver::Input::ChunkStored { seq: 0 }, t)),
        ("the clock past every deadline", &|r, t| r.handle_timeout(t + Duration::from_secs(3600))),
    ];
    for (what, late) in cases {
        for committed in [Status::Ok, Status::DiskIo] {
            let (mut r, t) = receiving(16);
            r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
            r.handle(receiver::Input::ChunkStored { seq: 0 }, t);
            r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin()))), t);
            let asked = actions_of_receiver(&mut r);
            assert!(asked.iter().any(|a| matches!(a, receiver::Action::Finalize { .. })), "{what}: {asked:?}");
            assert_eq!(r.poll_timeout(), None, "the commit is the driver's to time");
            late(&mut r, t);
            assert_eq!(actions_of_receiver(&mut r), [], "{what} while the commit is under way");
            assert!(!r.is_done(), "{what} ended the session before the commit's answer");
            r.handle(receiver::Input::Finalized(committed, String::new()), t);
            assert_eq!(verdict(&mut r), (Some(committed), committed != Status::Ok), "{what}, then {committed}");
            assert!(r.is_done());
        }
    }
}

#[test]
fn credits_go_in_quarter_rings_and_at_once_when_the_ring_is_drained() {
    let t = Instant::now();
    let mut r = Receiver::new(receiver_cfg(8), t);
    let h = Hello { depth: 8, ..hello("f", 16 * 64) };
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
    actions_of_receiver(&mut r);
    let credits = |r: &mut Receiver| -> Vec<u64> {
        let decoded = polled(r).1.into_iter().filter_map(|b| wire::decode(&b).ok());
        decoded.filter_map(|(_, m)| if let Message::Credit(c) = m { Some(c.consumed) } else { None }).collect()
    };
    let arrive = |r: &mut Receiver, seq: u32| r.handle(receiver::Input::WriteArrived { imm: seq, len: 16 }, t);
    let store = |r: &mut Receiver, seq: u64| r.handle(receiver::Input::ChunkStored { seq }, t);
    // 8 slots: a batch is 2 chunks.
    arrive(&mut r, 0);
    store(&mut r, 0);
    assert_eq!(credits(&mut r), [1], "every chunk arrived is stored: credit at once");
    for seq in 1..=3 {
        arrive(&mut r, seq);
    }
    store(&mut r, 1);
    assert_eq!(credits(&mut r), [], "1 chunk pending, 2 still in the ring");
    store(&mut r, 2);
    assert_eq!(credits(&mut r), [3], "a batch");
    store(&mut r, 3);
    assert_eq!(credits(&mut r), [4], "the ring is drained");
    // The ring filled up: chunks 4..12 arrive (credit 4 allows up to chunk 11).
    for seq in 4..12 {
        arrive(&mut r, seq);
    }
    arrive(&mut r, 12);
    assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), true), "chunk 12 before its credit");
}

#[test]
fn the_receiver_refuses_messages_out_of_place() {
    let cases: [(&str, Message, u64); 4] = [
        ("a second HELLO", Message::Hello(hello("f", 16)), 9),
        ("a message of another session", Message::Credit(Credit { consumed: 0 }), 10),
        ("a CREDIT from the sender", Message::Credit(Credit { consumed: 0 }), 9),
        ("a FIN with a short digest", Message::Fin(Fin { chunks: 0, size: 0, digest: vec![1; 4] }), 9),
    ];
    for (what, m, session) in cases {
        let (mut r, t) = receiving(if matches!(m, Message::Fin(_)) { 0 } else { 16 });
        r.handle(receiver::Input::Message(&encode(session, &m)), t);
        assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), true), "{what}");
        assert!(r.is_done());
    }
    // Driver inputs out of order are the receiver's own failure.
    let (mut r, t) = receiving(40);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
    r.handle(receiver::Input::ChunkStored { seq: 1 }, t);
    assert_eq!(verdict(&mut r), (Some(Status::Internal), true));
}

/// A driver that reported a failed open or store with the status `Ok` (its own bug) made the
/// receiver ACK `Ok` for a file it never opened, or had just discarded (found by `tests/fuzz.rs`:
/// `[HELLO, OpenFailed(Ok)]`). A failure's verdict never reads as success: it is `Internal`.
#[test]
fn a_failure_the_driver_calls_ok_is_never_acked_ok() {
    let t = Instant::now();
    let mut r = Receiver::new(receiver_cfg(4), t);
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(hello("f", 0)))), t);
    actions_of_receiver(&mut r);
    r.handle(receiver::Input::OpenFailed(Status::Ok, "no file".into()), t);
    assert_eq!(verdict(&mut r), (Some(Status::Internal), false), "a failed open");
    assert!(r.is_done());

    let (mut r, t) = receiving(40);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
    actions_of_receiver(&mut r);
    r.handle(receiver::Input::StoreFailed(Status::Ok, "no chunk".into()), t);
    assert_eq!(verdict(&mut r), (Some(Status::Internal), true), "a failed store");
    assert!(r.is_done());
}

#[test]
fn timeouts_fire_at_the_deadline_and_not_before() {
    let t = Instant::now();
    let timeout = Duration::from_secs(10);
    let mut s = Sender::new(SESSION, "f", 5, sender_cfg(4, 2), t).unwrap();
    assert_eq!(s.poll_timeout(), Some(t + timeout));
    s.handle_timeout(t + timeout - Duration::from_nanos(1));
    assert!(!s.is_done());
    s.handle_timeout(t + timeout);
    assert!(s.is_done() && s.poll_timeout().is_none());
    let actions = actions_of_sender(&mut s);
    assert!(matches!(
        actions.last(),
        Some(sender::Action::Finish(Outcome::Failed(ProtocolError::Timeout {
            waiting_for: "the receiver's grant",
            ..
        })))
    ));

    let mut r = Receiver::new(receiver_cfg(2), t);
    r.handle_timeout(t + timeout - Duration::from_nanos(1));
    assert!(!r.is_done());
    r.handle_timeout(t + timeout);
    let (actions, sent) = polled(&mut r);
    assert!(ack_in(&sent).is_none(), "no HELLO, nobody to answer");
    assert!(matches!(actions[..], [receiver::Action::Finish(Outcome::Failed(ProtocolError::Timeout { .. }))]));

    // The HELLO has its own, shorter bound (an idle connection is closed sooner); once the
    // HELLO came, the phase timeout counts.
    let mut cfg = receiver_cfg(2);
    cfg.hello_timeout = Duration::from_secs(2);
    let mut r = Receiver::new(cfg.clone(), t);
    assert_eq!(r.poll_timeout(), Some(t + Duration::from_secs(2)));
    r.handle_timeout(t + Duration::from_secs(2));
    let (actions, _) = polled(&mut r);
    assert!(matches!(
        actions[..],
        [receiver::Action::Finish(Outcome::Failed(ProtocolError::Timeout { waiting_for: "the sender's HELLO", after }))]
            if after == Duration::from_secs(2)
    ));
    let mut r = Receiver::new(cfg, t);
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(hello("f", 16)))), t + Duration::from_secs(1));
    assert_eq!(r.poll_timeout(), Some(t + Duration::from_secs(1) + timeout));

    // Progress moves the deadline: a WRITE at 9 s gives the receiver until 19 s.
    let (mut r, t) = receiving(40);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t + Duration::from_secs(9));
    r.handle_timeout(t + Duration::from_secs(18));
    assert!(!r.is_done());
    r.handle_timeout(t + Duration::from_secs(19));
    assert_eq!(verdict(&mut r), (None, true), "a timeout discards the temporary, and sends nothing");
}

/// A grant of 2 slots of 4 bytes at `RING_ADDR`.
fn grant_4x2() -> Grant {
    Grant {
        version: 1,
        caps: caps::DIGEST_XXH3_128,
        addr: RING_ADDR,
        rkey: RKEY,
        slot_size: 4,
        slot_count: 2,
        resume_from: 0,
        lanes: None,
    }
}

/// A sender granted 2 slots of 4 bytes for a file of `size` bytes.
fn granted(size: u64) -> (Sender, Instant) {
    let t = Instant::now();
    let mut s = Sender::new(SESSION, "f", size, sender_cfg(4, 2), t).unwrap();
    s.handle(sender::Input::Message(&encode(SESSION, &Message::Grant(grant_4x2()))), t);
    actions_of_sender(&mut s);
    (s, t)
}

fn failure(s: &mut Sender) -> Option<ProtocolError> {
    match actions_of_sender(s).pop() {
        Some(sender::Action::Finish(Outcome::Failed(e))) if s.is_done() => Some(e),
        _ => None,
    }
}

#[test]
fn the_sender_refuses_bad_grants_and_messages_out_of_place() {
    let t = Instant::now();
    let good = grant_4x2();
    let bad_grants = [
        Grant { version: 2, ..good },
        Grant { caps: 0, ..good },
        Grant { caps: caps::DIGEST_XXH3_128 | caps::RESUME, ..good },
        Grant { caps: caps::DIGEST_XXH3_128 | caps::DIGEST_XXH64, ..good },
        Grant { caps: caps::DIGEST_BLAKE3, ..good },
        Grant { slot_size: 0, ..good },
        Grant { slot_size: 5, ..good },
        Grant { slot_count: 0, ..good },
        Grant { addr: u64::MAX - 7, ..good },
    ];
    for g in bad_grants {
        let mut s = Sender::new(SESSION, "f", 10, sender_cfg(4, 2), t).unwrap();
        actions_of_sender(&mut s);
        s.handle(sender::Input::Message(&encode(SESSION, &Message::Grant(g))), t);
        assert!(matches!(failure(&mut s), Some(ProtocolError::Peer(_))), "{g:?}");
    }
    // A sender that offered to resume: resume_from past the file, or without the capability.
    let resuming = Grant { caps: caps::DIGEST_XXH3_128 | caps::RESUME, ..good };
    for g in [Grant { resume_from: 11, ..resuming }, Grant { resume_from: 4, ..good }] {
        let mut cfg = sender_cfg(4, 2);
        cfg.resume_key = Some(0x4e5);
        let mut s = Sender::new(SESSION, "f", 10, cfg, t).unwrap();
        actions_of_sender(&mut s);
        s.handle(sender::Input::Message(&encode(SESSION, &Message::Grant(g))), t);
        assert!(matches!(failure(&mut s), Some(ProtocolError::Peer(_))), "{g:?}");
    }

    let ok_ack = Message::Ack(Ack { status: Status::Ok, received: 0, detail: String::new(), retry_after_ms: 0 });
    let out_of_place = [
        ("a CREDIT beyond the chunks written", Message::Credit(Credit { consumed: 1 }), SESSION),
        ("an OK before the FIN", ok_ack, SESSION),
        ("a second GRANT", Message::Grant(good), SESSION),
        ("a HELLO", Message::Hello(hello("f", 1)), SESSION),
        ("another session", Message::Credit(Credit { consumed: 0 }), SESSION + 1),
    ];
    for (what, m, session) in out_of_place {
        let (mut s, t) = granted(10);
        s.handle(sender::Input::Message(&encode(session, &m)), t);
        assert!(matches!(failure(&mut s), Some(ProtocolError::Peer(_))), "{what}");
    }
    let (mut s, t) = granted(10);
    s.handle(sender::Input::Message(b"RDCP\x01"), t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Wire(_))), "a message that does not decode");

    // Driver inputs out of order are the sender's own failure.
    let (mut s, t) = granted(10);
    s.handle(sender::Input::ChunkRead { seq: 1 }, t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))), "a read out of order");
    let (mut s, t) = granted(10);
    s.handle(sender::Input::WriteDone { seq: 0 }, t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))), "a completion of nothing written");
}

#[test]
fn a_digest_that_cannot_be_sent_ends_the_sender() {
    let (mut s, t) = granted(0);
    assert_eq!(actions_of_sender(&mut s), []);
    s.handle(sender::Input::Digest(vec![0; wire::MAX_DIGEST_LEN + 1]), t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))));
    assert!(s.is_done() && s.poll_timeout().is_none());
    // A digest of another size than the granted one's is the driver's bug, not sent.
    let (mut s, t) = granted(0);
    assert_eq!(s.digest(), Digest::Xxh3_128);
    s.handle(sender::Input::Digest(vec![0; Digest::Xxh64.size()]), t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))));
}

// ---- A hostile network. ----

/// Outcomes of the random cases, by kind.
#[derive(Debug, Default)]
struct Tally {
    ok: u32,
    faithful_ok: u32,
    checksum_mismatch: u32,
    protocol_mismatch: u32,
    too_large: u32,
    timeout: u32,
    other: u32,
}

/// One random case: sizes, windows, timeouts and the network's faults all drawn from `seed`.
fn hostile_case(seed: u64, tally: &mut Tally) {
    let mut rng = Rng::new(seed);
    let chunk = rng.pick(&[1u32, 2, 3, 7, 16, 64]);
    let size = rng.below(u64::from(chunk) * 24 + 2) as usize;
    let depth = 1 + rng.below(12) as u32;
    let faithful = rng.chance(250);
    // A faithful network makes progress every few steps of a few milliseconds: give it time.
    let timeout = Duration::from_millis(if faithful { 10_000 } else { rng.pick(&[50, 1_000, 10_000]) });
    let receiver = receiver_config(
        if rng.chance(50) { rng.below(size as u64 + 1) } else { 1 << 20 },
        if rng.chance(300) { 1 + rng.below(u64::from(chunk)) as u32 } else { 1 << 20 },
        1 + rng.below(u64::from(chunk) * 8),
        1 + rng.below(12) as u32,
        timeout,
    );
    let mut faults = Faults::default();
    if !faithful {
        faults = Faults {
            reorder: rng.pick(&[0, 0, 10, 100, 400]),
            drop: rng.pick(&[0, 0, 5, 20, 80]),
            duplicate: rng.pick(&[0, 0, 5, 20, 80]),
            truncate: rng.pick(&[0, 0, 5, 20, 80]),
            corrupt: rng.pick(&[0, 0, 5, 20, 80]),
            lose_arrival: rng.pick(&[0, 0, 5, 20]),
            clock_jump: rng.pick(&[0, 0, 0, 2, 10]),
        };
    }
    let too_large = size as u64 > receiver.max_size;
    let label = format!("seed {seed}: {size} bytes, chunk {chunk}, depth {depth}, {receiver:?}, {faults:?}");
    let sender = SenderConfig::new(chunk, depth, timeout);
    let file = file_of(size, seed);
    let chunks = size as u64 / u64::from(chunk.min(receiver.max_chunk)) + 1;
    let mut sim = Sim::new(label, seed.wrapping_add(1), file, "random.bin", sender, receiver, faults, Hooks::default());
    // Every packet is delivered at most twice and every job runs once, per chunk a handful of
    // moves; two clock jumps end both machines.
    sim.run(32 * (chunks + 8));

    let receiver_status = acked(&sim.receiver_outcome);
    if !faults.any() && !too_large {
        assert_ok(&sim);
        tally.faithful_ok += 1;
    }
    match (receiver_status, &sim.receiver_outcome) {
        (Some(Status::Ok), _) => tally.ok += 1,
        (Some(Status::ChecksumMismatch), _) => tally.checksum_mismatch += 1,
        (Some(Status::TooLarge), _) => tally.too_large += 1,
        (_, Some(Outcome::Failed(ProtocolError::Timeout { .. }))) => tally.timeout += 1,
        (_, Some(Outcome::Failed(ProtocolError::Peer(_) | ProtocolError::Wire(_)))) => tally.protocol_mismatch += 1,
        _ => tally.other += 1,
    }
}

/// Seeds 0..10,000 by default (about a second in a debug build); `MACHINES_CASES=N` runs N
/// (a longer soak), `MACHINES_FIRST_SEED=S` starts elsewhere.
#[test]
fn a_hostile_network_never_breaks_either_side() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (first, cases) = (env("MACHINES_FIRST_SEED", 0), env("MACHINES_CASES", 10_000));
    let mut tally = Tally::default();
    for seed in first..first + cases {
        hostile_case(seed, &mut tally);
    }
    eprintln!("{cases} cases: {tally:?}");
    // The faults must reach every path: success, corruption caught, peers refused, timeouts
    // (in proportions measured over 10,000 cases: about 45%, 3%, 28%, 4% and 19%).
    if cases >= 1_000 {
        let per_mille = |n: u32| u64::from(n) * 1000 / cases;
        assert!(per_mille(tally.faithful_ok) > 125 && tally.ok > tally.faithful_ok, "{tally:?}");
        assert!(per_mille(tally.checksum_mismatch) > 1 && per_mille(tally.protocol_mismatch) > 10, "{tally:?}");
        assert!(per_mille(tally.too_large) > 1 && per_mille(tally.timeout) > 10, "{tally:?}");
    }
}

/// A send cancelled midway tells the receiver (a CANCEL, which the receiver granted): the
/// receiver ends the session as cancelled, without a verdict, rather than as a peer that
/// vanished.
#[test]
fn a_cancelled_send_tells_the_receiver_which_ends_it_as_cancelled() {
    use rdma_proto::ProtocolError;
    for seed in 0..8 {
        let file = file_of(5000, seed);
        let label = format!("cancel, seed {seed}");
        let faults = Faults::default();
        let mut sim =
            Sim::new(label, seed, file, "file.bin", sender_cfg(64, 4), receiver_cfg(4), faults, Hooks::default());
        sim.drain_sender();
        sim.drain_receiver();
        while sim.stored < 10 + seed {
            sim.step();
        }
        sim.sender.cancel();
        sim.drain_sender();
        sim.run(10_000);
        let cancelled = |o: &Option<Outcome>| matches!(o, Some(Outcome::Failed(ProtocolError::Cancelled)));
        assert!(cancelled(&sim.sender_outcome), "seed {seed}: the sender {:?}", sim.sender_outcome);
        assert!(cancelled(&sim.receiver_outcome), "seed {seed}: the receiver {:?}", sim.receiver_outcome);
        assert!(sim.acks_sent.is_empty(), "seed {seed}: no verdict for a cancelled send: {:?}", sim.acks_sent);
        // Every chunk that arrived before the CANCEL was stored: a resume continues after them.
        assert_eq!(sim.stored, sim.stores_asked, "seed {seed}: chunks that arrived were dropped");
    }
}

/// A session whose seat a newer sender takes ([`Receiver::give_way`]) ends in its data phase
/// with `Busy`, the hint of when to come back, and a resumable end (its temporary not
/// discarded as a failure's: `Displaced`); the sender keeps the hint. During the commit it
/// is ignored: the commit's answer decides.
#[test]
fn a_displaced_session_ends_with_busy_and_when_to_come_back() {
    let (mut r, t) = receiving(64);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
    r.handle(receiver::Input::ChunkStored { seq: 0 }, t);
    actions_of_receiver(&mut r);
    r.give_way(Duration::from_millis(3000), t);
    let (actions, sent) = polled(&mut r);
    let (_, ack) = ack_in(&sent).expect("an ACK");
    assert_eq!((ack.status, ack.retry_after_ms, ack.received), (Status::Busy, 3000, 16));
    assert!(actions.contains(&receiver::Action::Finish(Outcome::Failed(ProtocolError::Displaced))), "{actions:?}");
    // The sender keeps the hint with the refusal.
    let (mut s, t) = granted(64);
    s.handle(sender::Input::Message(&encode(SESSION, &Message::Ack(ack))), t);
    assert_eq!(s.retry_after(), Some(Duration::from_secs(3)));
    // Any other Busy (every seat held by sessions that may not give way) says 1 s.
    let t = Instant::now();
    let mut full = Receiver::new(receiver_cfg(2), t);
    full.handle(receiver::Input::Message(&encode(9, &Message::Hello(hello("f", 64)))), t);
    full.handle(receiver::Input::OpenFailed(Status::Busy, "full".into()), t);
    let (_, sent) = polled(&mut full);
    assert_eq!(ack_in(&sent).map(|(_, a)| a.retry_after_ms), Some(1000));
    // Once the commit was asked for, giving way is ignored.
    let (mut r, t) = receiving(16);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
    r.handle(receiver::Input::ChunkStored { seq: 0 }, t);
    let fin = Fin { chunks: 1, size: 16, digest: vec![7; wire::DIGEST_LEN] };
    r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
    actions_of_receiver(&mut r);
    r.give_way(Duration::from_secs(3), t);
    assert_eq!(actions_of_receiver(&mut r), []);
    assert!(!r.is_done());
}
