//! Resuming (issue 21, 2.1), machine against machine in memory: a receiver that holds the first
//! bytes of the file asks only for the rest, the chunks land after them, and the whole-file
//! digest still covers every byte (a held prefix that differs from the file is a checksum
//! mismatch, never a success).

mod sim;

use rdma_proto::wire::{self, caps, Message};
use rdma_proto::Status;
use sim::*;

fn resuming(chunk: u32, depth: u32) -> (rdma_proto::sender::SenderConfig, rdma_proto::receiver::ReceiverConfig) {
    let mut s = sender_cfg(chunk, depth);
    s.resume_key = Some(0x0123_4567_89ab_cdef);
    let mut r = receiver_cfg(depth);
    r.resume = true;
    (s, r)
}

#[test]
fn a_receiver_holding_a_prefix_gets_only_the_rest_and_the_file_arrives_whole() {
    for seed in 0..12 {
        let size = 1000 + seed as usize * 131;
        for from in [0, 1, 63, 64, 500, size as u64 - 1, size as u64] {
            let (s, r) = resuming(64, 4);
            let hooks = Hooks { resume_from: Some(from), ..Hooks::default() };
            let sim = transfer(file_of(size, seed), s, r, hooks, seed);
            assert_ok(&sim);
            assert_eq!(sim.receiver.resumed_from(), from, "seed {seed}");
            assert_eq!(sim.sender.resumed_from(), from, "seed {seed}");
            let rest = size as u64 - from;
            assert_eq!(sim.sender.chunks(), rest.div_ceil(64), "seed {seed}, from {from}: chunks sent");
            assert_eq!(sim.receiver.bytes_stored(), size as u64);
        }
    }
}

#[test]
fn a_held_prefix_that_differs_from_the_file_is_a_checksum_mismatch() {
    // One byte of the held prefix differs from the file: the digest, which covers every byte,
    // catches it (a prefix is never trusted on its own).
    let (s, r) = resuming(64, 4);
    let hooks = Hooks { resume_from: Some(500), corrupt_prefix: true, ..Hooks::default() };
    let sim = transfer(file_of(3000, 7), s, r, hooks, 7);
    assert_eq!(acked(&sim.receiver_outcome), Some(Status::ChecksumMismatch));
    assert_eq!(acked(&sim.sender_outcome), Some(Status::ChecksumMismatch));
}

#[test]
fn nothing_is_resumed_unless_both_sides_offer_it() {
    for (sender_offers, receiver_resumes) in [(true, false), (false, true), (false, false)] {
        let (mut s, mut r) = resuming(64, 4);
        if !sender_offers {
            s.resume_key = None;
        }
        r.resume = receiver_resumes;
        let hooks = Hooks { resume_from: Some(500), ..Hooks::default() };
        let sim = transfer(file_of(2000, 3), s, r, hooks, 3);
        assert_ok(&sim);
        assert_eq!(sim.receiver.resumed_from(), 0);
        assert_eq!(sim.sender.chunks(), 2000u64.div_ceil(64));
    }
}

#[test]
fn the_hello_carries_the_key_and_the_grant_the_offset_only_when_resuming() {
    let (s, _) = resuming(64, 4);
    let mut sender = rdma_proto::sender::Sender::new(SESSION, "f", 10, s, std::time::Instant::now()).unwrap();
    let _ = sender.poll_action();
    let mut out = Vec::new();
    assert!(sender.transmit(&mut out));
    let Ok((_, Message::Hello(h))) = wire::decode(&out) else { panic!("a HELLO") };
    assert_eq!(h.resume, Some(0x0123_4567_89ab_cdef));
    assert_ne!(h.caps & caps::RESUME, 0);
    let plain = rdma_proto::sender::Sender::new(SESSION, "f", 10, sender_cfg(64, 4), std::time::Instant::now());
    let mut plain = plain.unwrap();
    let _ = plain.poll_action();
    assert!(plain.transmit(&mut out));
    let Ok((_, Message::Hello(h))) = wire::decode(&out) else { panic!("a HELLO") };
    assert_eq!((h.resume, h.caps & caps::RESUME), (None, 0));
}
