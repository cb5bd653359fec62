//! Resuming, machine against machine in memory: a receiver that holds the first
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

/// A sender whose first bytes differ from what the receiver holds (another file under a key
/// read from `ls -a`, or a sniffed HELLO) cannot continue that partial: its proof of the prefix
/// fails, the file is taken from byte 0 into a new temporary and arrives whole, and the partial
/// is left as it was for its owner.
#[test]
fn a_sender_that_cannot_prove_the_held_prefix_starts_from_zero_and_leaves_the_partial_alone() {
    for seed in 0..12 {
        let (s, r) = resuming(64, 4);
        let hooks = Hooks { resume_from: Some(500), corrupt_prefix: true, ..Hooks::default() };
        let file = file_of(3000, seed);
        let sim = transfer(file.clone(), s, r, hooks, seed);
        assert_ok(&sim);
        assert_eq!(sim.started_over, 1, "seed {seed}");
        assert_eq!(sim.receiver.prefix_refused(), 1, "seed {seed}");
        assert_eq!((sim.receiver.resumed_from(), sim.sender.resumed_from()), (0, 0), "seed {seed}");
        assert_eq!(sim.sender.chunks(), 3000u64.div_ceil(64), "seed {seed}: every chunk sent");
        // The partial the sender could not prove: the held 500 bytes (one of them not the
        // file's), untouched by this session.
        let mut held = file[..500].to_vec();
        held[250] ^= 0x40;
        let partial = sim.partial.as_ref().expect("the partial left alone");
        assert!(partial[..500] == held[..] && partial[500..].iter().all(|&b| b == 0), "seed {seed}");
    }
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
    assert_eq!(h.caps & (caps::RESUME | caps::RESUME_PROOF), caps::RESUME | caps::RESUME_PROOF);
    let plain = rdma_proto::sender::Sender::new(SESSION, "f", 10, sender_cfg(64, 4), std::time::Instant::now());
    let mut plain = plain.unwrap();
    let _ = plain.poll_action();
    assert!(plain.transmit(&mut out));
    let Ok((_, Message::Hello(h))) = wire::decode(&out) else { panic!("a HELLO") };
    assert_eq!((h.resume, h.caps & caps::RESUME), (None, 0));
}

/// What the receiver sends, and how it ends, for `inputs` given after a HELLO with `caps`
/// (offering the resume key 0x77) and the driver's open holding `from` bytes with `proof`.
fn resume_with(caps: u32, nonce: [u8; 16], from: u64, proof: [u8; 32], answer: Option<[u8; 32]>) -> Vec<Message> {
    use rdma_proto::receiver::{Action, Input, Receiver};
    let now = std::time::Instant::now();
    let (_, mut cfg) = resuming(64, 4);
    cfg.resume = true;
    let mut r = Receiver::new(cfg, now).with_nonce(nonce);
    let hello = wire::Hello { caps, resume: Some(0x77), ..raw_hello(1000) };
    let mut out = Vec::new();
    wire::encode(SESSION, &Message::Hello(hello), &mut out).unwrap();
    r.handle(Input::Message(&out), now);
    let mut sent = Vec::new();
    let drain = |r: &mut Receiver, sent: &mut Vec<Message>| {
        while let Some(a) = r.poll_action() {
            match a {
                Action::Send => {
                    let mut b = Vec::new();
                    r.transmit(&mut b);
                    sent.push(wire::decode(&b).unwrap().1);
                }
                Action::Open { .. } => {
                    if r.resume_key().is_some() {
                        r.handle(Input::Resumed { from, proof }, now);
                    }
                    r.handle(Input::Ready { addr: 1 << 20, rkey: 5 }, now);
                }
                Action::StartOver => r.handle(Input::Ready { addr: 1 << 20, rkey: 5 }, now),
                _ => {}
            }
        }
    };
    drain(&mut r, &mut sent);
    if let Some(mac) = answer {
        let p = wire::Proof { nonce, mac };
        wire::encode(SESSION, &Message::Proof(p), &mut out).unwrap();
        r.handle(Input::Message(&out), now);
        drain(&mut r, &mut sent);
    }
    sent
}

fn raw_hello(size: u64) -> wire::Hello {
    wire::Hello {
        version_min: 1,
        version_max: 1,
        caps: caps::DIGEST_XXH3_128,
        size,
        chunk: 64,
        depth: 4,
        name: "f".into(),
        resume: None,
        lanes: 1,
    }
}

const PROVING: u32 = caps::DIGEST_XXH3_128 | caps::RESUME | caps::RESUME_PROOF;

/// The receiver asks for the proof before its GRANT, which resumes only from a proof that
/// matches: a proof of the same bytes made for another nonce (recorded from an earlier session)
/// or a wrong one gets a GRANT from 0.
#[test]
fn a_partial_is_resumed_only_after_a_proof_made_for_this_challenge() {
    let proof = rdma_proto::auth::prefix_key(&[9; 16], SESSION, 0);
    let expected = prefix_proof(&proof, b"the held bytes");
    let sent = resume_with(PROVING, [9; 16], 500, expected, None);
    let [Message::Challenge(c)] = &sent[..] else { panic!("a CHALLENGE first, no GRANT: {sent:?}") };
    assert_eq!((c.nonce, c.prefix), ([9; 16], Some(wire::PrefixClaim { index: 0, from: 500 })));
    let grant = |sent: &[Message]| match sent.last() {
        Some(Message::Grant(g)) => g.resume_from,
        m => panic!("no GRANT: {m:?}"),
    };
    assert_eq!(grant(&resume_with(PROVING, [9; 16], 500, expected, Some(expected))), 500, "the right proof");
    // Replayed: the proof of the same bytes under another nonce's key.
    let old = prefix_proof(&rdma_proto::auth::prefix_key(&[8; 16], SESSION, 0), b"the held bytes");
    assert_eq!(grant(&resume_with(PROVING, [9; 16], 500, expected, Some(old))), 0, "a replayed proof");
    assert_eq!(grant(&resume_with(PROVING, [9; 16], 500, expected, Some([0; 32]))), 0, "a wrong proof");
}

/// A sender that offers RESUME without RESUME_PROOF (a resume key alone, as an older sender or
/// anyone who read the key in `ls -a` sends it) is not resumed: the receiver does not look the
/// partial up, and grants from 0.
#[test]
fn a_resume_key_without_the_offer_to_prove_the_prefix_resumes_nothing() {
    let sent = resume_with(caps::DIGEST_XXH3_128 | caps::RESUME, [9; 16], 500, [0; 32], None);
    let [Message::Grant(g)] = &sent[..] else { panic!("a GRANT at once: {sent:?}") };
    assert_eq!((g.resume_from, g.caps & caps::RESUME), (0, 0));
}

/// Sends `file` from a sender to a receiver whose destination holds `in_place` under its name
/// already (the receiver answers the Open with `Present`), machine to machine; the two
/// outcomes, and the WRITEs asked for.
fn send_over(file: &[u8], in_place: &[u8]) -> (Option<rdma_proto::Outcome>, Option<rdma_proto::Outcome>, u64) {
    use rdma_proto::receiver::{Action as R, Input as RIn, Receiver};
    use rdma_proto::sender::{Action as S, Input as SIn, Sender};
    let now = std::time::Instant::now();
    let (s_cfg, r_cfg) = resuming(64, 4);
    let mut s = Sender::new(SESSION, "f", file.len() as u64, s_cfg, now).unwrap().with_nonce([1; 16]);
    let mut r = Receiver::new(r_cfg, now).with_nonce([2; 16]);
    let (mut sent, mut received, mut writes) = (None, None, 0);
    let mut out = Vec::new();
    for _ in 0..1000 {
        let mut moved = false;
        while let Some(a) = s.poll_action() {
            moved = true;
            match a {
                S::Send => {
                    s.transmit(&mut out);
                    r.handle(RIn::Message(&out), now);
                }
                S::ProvePrefix { from, key } => {
                    let mac = prefix_proof(&key, &file[..from as usize]);
                    s.handle(SIn::PrefixProof { mac }, now);
                }
                S::WriteChunk { .. } => writes += 1,
                S::Finish(o) => sent = Some(o),
                a => panic!("{a:?}: nothing is read or sent for a file in place"),
            }
        }
        while let Some(a) = r.poll_action() {
            moved = true;
            match a {
                R::Send => {
                    r.transmit(&mut out);
                    s.handle(SIn::Message(&out), now);
                }
                R::Open { size, .. } => {
                    assert_eq!(size, in_place.len() as u64);
                    let proof = prefix_proof(&r.prefix_key(), in_place);
                    r.handle(RIn::Present { proof }, now);
                }
                R::Finish(o) => received = Some(o),
                a => panic!("{a:?}: nothing is opened or stored for a file in place"),
            }
        }
        if !moved {
            break;
        }
    }
    (sent, received, writes)
}

/// Sending a file the receiver holds already, identical, is a success with nothing sent
/// ("already stored"), as rsync counts it; the same name and size with other bytes is still
/// `Exists`.
#[test]
fn a_file_in_place_and_identical_is_already_stored_and_another_exists() {
    let file = file_of(3000, 11);
    let (sent, received, writes) = send_over(&file, &file);
    assert_eq!((acked(&sent), acked(&received), writes), (Some(Status::Ok), Some(Status::Ok), 0));
    let Some(rdma_proto::Outcome::Acked { detail, .. }) = &received else { unreachable!() };
    assert!(detail.contains("already stored"), "{detail}");
    let mut other = file.clone();
    other[1500] ^= 1;
    let (sent, received, writes) = send_over(&file, &other);
    assert_eq!((acked(&sent), acked(&received), writes), (Some(Status::Exists), Some(Status::Exists), 0));
}

/// A sender with retries whose link goes silent at a seeded point, again and again, run
/// through the receiver's and the sender's decisions (`rdma_proto::policy`) as a driver runs
/// them: each connection takes a place among other senders' young connections (a full
/// receiver answers `Busy`, asked again after its hint), a session displaces a trickler from
/// the only seat, the bytes a cut session stored are kept as a partial within the caps
/// (other senders' partials compete for them, and partials expire), each failure is sent
/// again after the retry rule's backoff, and the next attempt resumes from what was kept. The
/// file arrives whole within the retries, and no rule's bound is passed.
#[test]
fn a_sender_cut_off_again_and_again_resumes_within_its_retries_and_the_receivers_bounds() {
    use rdma_proto::policy::partials::{self, Caps, Kept, Owner};
    use rdma_proto::policy::retry::{self, Failure, Next, Stage};
    use rdma_proto::policy::{places, seats};
    use std::collections::{HashMap, VecDeque};
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const KEY: u64 = 0x0123_4567_89ab_cdef;
    const TTL: Duration = Duration::from_secs(20);
    let me = IpAddr::from([10, 0, 0, 1]);
    let other = |n: u64| IpAddr::from([10, 0, 1, n as u8]);
    // Retries, busy answers, seats given way, resumes and partials expired, over all seeds.
    let mut totals = [0u32; 5];
    for seed in 0..24u64 {
        let mut rng = Rng::new(seed ^ 0x5eed);
        let file = file_of(3000 + seed as usize * 97, seed);
        let chunks = file.len() as u64 / 64 + 1;
        let mut rule = retry::Retries::new(6, Duration::from_secs(60));
        let caps = Caps { count: 3, bytes: 6000, per_address: 4500 };
        let mut kept: VecDeque<Kept<()>> = VecDeque::new();
        let mut written: HashMap<u64, Instant> = HashMap::new();
        let places = Arc::new(places::ConnectionPlaces::<()>::new(places::limit(0), Duration::from_secs(1)));
        let seats = Arc::new(seats::Seats::<()>::new(1, 1 << 20));
        let mut now = Instant::now();
        let (mut last_retry, mut busy, mut displaced, mut resumed, mut expired) = (Duration::ZERO, 0, 0, 0, 0u32);
        let label = |attempt: u32| format!("seed {seed}, attempt {attempt}");
        let mut attempt = 0u32;
        let outcome = 'send: loop {
            attempt += 1;
            // Partials past their time to live go, ours too.
            let before = kept.len();
            kept.retain(|k| !partials::expired(now.saturating_duration_since(written[&k.key]), TTL));
            expired += (before - kept.len()) as u32;
            // Another sender's partial, competing for the caps.
            if rng.chance(400) {
                let (key, bytes) = (1 + rng.below(1000), 300 + rng.below(3000));
                let owner = Owner { peer: Some(other(rng.below(3))), authenticated: false };
                if caps.fits_alone(bytes) && caps.fits_address(owner, bytes) {
                    kept.retain(|k| k.key != key);
                    caps.make_room(&mut kept, bytes);
                    caps.make_room_of(&mut kept, owner, bytes);
                    kept.push_back(Kept { dir: (), at: (1, 1), key, bytes, owner });
                    written.insert(key, now);
                }
            }
            // Other senders' young connections: a receiver they fill says Busy.
            let young: Vec<_> = (0..rng.below(6)).filter_map(|n| places.take(now, other(n), false)).collect();
            let Some(place) = places.take(now, me, false) else {
                let hint = Failure::Busy { retry_after: Some(seats::BUSY_HINT) };
                match rule.after(Stage::Connect, hint, false, rng.next() as u32) {
                    Next::AskAgain(wait) => {
                        assert!(wait <= seats::BUSY_HINT.mul_f64(1.5), "{}: {wait:?}", label(attempt));
                        (busy, now) = (busy + 1, now + wait);
                        continue 'send;
                    }
                    next => panic!("{}: a busy receiver within busy_wait: {next:?}", label(attempt)),
                }
            };
            assert!(place.prove(), "{}: a place taken young is proved at its HELLO", label(attempt));
            drop(young);
            // The only seat, held by a trickler half the time: it gives way to this session.
            let trickler = rng.chance(500).then(|| {
                let seats::Taken::Seat(s) = seats.take(now, false) else { panic!("a free seat") };
                s.started(now - Duration::from_secs(5));
                s.progress(1000, now - Duration::from_secs(2));
                s
            });
            let seat = match seats.take(now, false) {
                seats::Taken::Seat(s) => s,
                seats::Taken::Wait(mut ticket) => {
                    let t = trickler.expect("a session to displace");
                    assert!(t.displaced() && ticket.claim(false).is_none(), "{}", label(attempt));
                    drop(t);
                    displaced += 1;
                    ticket.claim(false).expect("the displaced trickler's seat")
                }
                seats::Taken::Busy => panic!("{}: a trickler below the floor keeps its seat", label(attempt)),
            };
            // The session, resuming from our partial if the receiver kept it; its link goes
            // silent at a seeded point while retries are left.
            let held = kept.iter().find(|k| k.key == KEY).map(|k| k.bytes);
            kept.retain(|k| k.key != KEY);
            let cut = (rule.left() > 0 && rng.chance(700)).then(|| rng.below(chunks + 4));
            let (s, r) = resuming(64, 4);
            let hooks = Hooks { resume_from: held, blackout_after: cut, ..Hooks::default() };
            let mut sim = Sim::new(
                label(attempt),
                seed + 100 * u64::from(attempt),
                file.clone(),
                "file.bin",
                s,
                r,
                Faults::default(),
                hooks,
            );
            let began = sim.now;
            sim.run(64 * (chunks + 8));
            now += sim.now.saturating_duration_since(began);
            drop((seat, place));
            if acked(&sim.sender_outcome) == Some(Status::Ok) {
                assert_ok(&sim);
                assert_eq!(sim.receiver.resumed_from(), held.unwrap_or(0), "{}", label(attempt));
                resumed += u32::from(held.is_some());
                break 'send attempt;
            }
            assert!(cut.is_some(), "{}: only a cut session fails: {:?}", label(attempt), sim.sender_outcome);
            // The receiver keeps what it stored, within the caps; the sender sees the
            // connection lost, and sends again after the backoff.
            let stored = sim.receiver.bytes_stored();
            let owner = Owner { peer: Some(me), authenticated: false };
            if stored > 0 && caps.fits_alone(stored) && caps.fits_address(owner, stored) {
                caps.make_room(&mut kept, stored);
                caps.make_room_of(&mut kept, owner, stored);
                kept.push_back(Kept { dir: (), at: (1, 1), key: KEY, bytes: stored, owner });
                written.insert(KEY, now);
            }
            match rule.after(Stage::Session, Failure::Transient, false, rng.next() as u32) {
                Next::Retry(wait) => {
                    assert!(wait >= last_retry && wait <= retry::MOST_BACKOFF, "{}: {wait:?}", label(attempt));
                    (last_retry, now) = (wait, now + wait);
                }
                next => panic!("{}: retries left, yet {next:?}", label(attempt)),
            }
            // No cap is passed.
            let total: u64 = kept.iter().map(|k| k.bytes).sum();
            let mine: u64 = kept.iter().filter(|k| k.owner.peer == Some(me)).map(|k| k.bytes).sum();
            assert!(kept.len() <= caps.count && total <= caps.bytes && mine <= caps.per_address, "{}", label(attempt));
        };
        assert!(rule.made() <= 6 && outcome >= rule.made(), "seed {seed}");
        assert_eq!(places.alive(), 0, "seed {seed}: every place given back");
        let seen = [rule.made(), busy, displaced, resumed, expired];
        totals = std::array::from_fn(|i| totals[i] + seen[i]);
    }
    assert!(totals.iter().all(|&n| n > 0), "every rule took part: {totals:?}");
}
