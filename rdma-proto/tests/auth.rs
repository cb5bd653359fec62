//! Authorization by a shared secret, machine against machine in memory: the
//! transfer works when both sides hold the secret; a sender without it, or with another one, is
//! refused before anything is opened; a receiver that cannot prove the secret gets no data.

mod sim;

use std::time::Instant;

use rdma_proto::auth::Secret;
use rdma_proto::receiver::{self, Receiver};
use rdma_proto::sender::{self, Sender};
use rdma_proto::wire::{self, caps, Challenge, Message, Proof};
use rdma_proto::{Outcome, ProtocolError, Status};
use sim::*;

fn secret(s: &str) -> Secret {
    Secret::new(s.as_bytes()).unwrap()
}

/// Everything one side sent, as it went on the wire, and its actions.
fn drain_receiver(r: &mut Receiver) -> (Vec<receiver::Action>, Vec<Vec<u8>>) {
    let mut actions = Vec::new();
    let mut sent = Vec::new();
    while let Some(a) = r.poll_action() {
        if a == receiver::Action::Send {
            let mut out = Vec::new();
            assert!(r.transmit(&mut out));
            sent.push(out);
        }
        actions.push(a);
    }
    (actions, sent)
}

fn drain_sender(s: &mut Sender) -> (Vec<sender::Action>, Vec<Vec<u8>>) {
    let mut actions = Vec::new();
    let mut sent = Vec::new();
    while let Some(a) = s.poll_action() {
        if a == sender::Action::Send {
            let mut out = Vec::new();
            assert!(s.transmit(&mut out));
            sent.push(out);
        }
        actions.push(a);
    }
    (actions, sent)
}

fn opened(actions: &[receiver::Action]) -> bool {
    actions.iter().any(|a| matches!(a, receiver::Action::Open { .. }))
}

fn refused(actions: &[receiver::Action]) -> Option<Status> {
    actions.iter().find_map(|a| match a {
        receiver::Action::Finish(Outcome::Acked { status, .. }) => Some(*status),
        _ => None,
    })
}

#[test]
fn both_sides_with_the_secret_transfer_identical_bytes() {
    for seed in 0..8 {
        let mut s = sender_cfg(64, 4);
        s.secret = Some(secret("correct horse battery staple"));
        let mut r = receiver_cfg(4);
        r.secret = Some(secret("correct horse battery staple"));
        let sim = transfer(file_of(1000 + seed as usize * 37, seed), s, r, Hooks::default(), seed);
        assert_ok(&sim);
    }
}

/// One side's machine driven by hand: the sender's messages go to the receiver and back, until
/// neither has anything to say. Returns the receiver's actions and the sender's.
fn exchange(mut s: Sender, mut r: Receiver) -> (Vec<receiver::Action>, Vec<sender::Action>, Receiver) {
    let t = Instant::now();
    let (mut r_actions, mut s_actions) = (Vec::new(), Vec::new());
    for _ in 0..8 {
        let (sa, to_r) = drain_sender(&mut s);
        s_actions.extend(sa);
        for m in &to_r {
            r.handle(receiver::Input::Message(m), t);
        }
        let (ra, to_s) = drain_receiver(&mut r);
        // The receiver's Open is answered as a driver would: registered.
        let open = opened(&ra);
        r_actions.extend(ra);
        if open {
            r.handle(receiver::Input::Ready { addr: 4096, rkey: 7 }, t);
            let (ra, more) = drain_receiver(&mut r);
            r_actions.extend(ra);
            for m in more {
                s.handle(sender::Input::Message(&m), t);
            }
        }
        for m in to_s {
            s.handle(sender::Input::Message(&m), t);
        }
    }
    let (sa, _) = drain_sender(&mut s);
    s_actions.extend(sa);
    (r_actions, s_actions, r)
}

fn deliver(s: &mut Sender, m: &Message, t: Instant) {
    let mut out = Vec::new();
    wire::encode(SESSION, m, &mut out).unwrap();
    s.handle(sender::Input::Message(&out), t);
}

fn machines(sender_secret: Option<&str>, receiver_secret: Option<&str>) -> (Sender, Receiver) {
    let mut s = sender_cfg(64, 4);
    s.secret = sender_secret.map(secret);
    let mut r = receiver_cfg(4);
    r.secret = receiver_secret.map(secret);
    let t = Instant::now();
    let sender = Sender::new(SESSION, "f", 1000, s, t).unwrap().with_nonce([3; 16]);
    (sender, Receiver::new(r, t).with_nonce([4; 16]))
}

fn sender_failure(actions: &[sender::Action]) -> Option<String> {
    actions.iter().find_map(|a| match a {
        sender::Action::Finish(Outcome::Failed(e)) => Some(e.to_string()),
        sender::Action::Finish(Outcome::Acked { status, detail }) => Some(format!("{status}: {detail}")),
        _ => None,
    })
}

fn data_read(actions: &[sender::Action]) -> bool {
    actions.iter().any(|a| matches!(a, sender::Action::ReadChunk { .. } | sender::Action::WriteChunk { .. }))
}

#[test]
fn a_sender_without_the_secret_is_refused_before_anything_is_opened() {
    let (s, r) = machines(None, Some("correct horse battery staple"));
    let (ra, sa, r) = exchange(s, r);
    assert!(!opened(&ra), "{ra:?}");
    assert_eq!(refused(&ra), Some(Status::NotAuthorized));
    assert!(!r.auth_failed(), "no proof was tried: nothing to rate-limit");
    assert!(sender_failure(&sa).unwrap().contains("not authorized"), "{sa:?}");
    assert_eq!(Status::NotAuthorized.exit_code(), 19);
}

#[test]
fn a_sender_with_another_secret_is_refused_before_anything_is_opened() {
    let (s, r) = machines(Some("the wrong secret, long enough"), Some("correct horse battery staple"));
    let (ra, sa, r) = exchange(s, r);
    assert!(!opened(&ra), "{ra:?}");
    assert_eq!(refused(&ra), Some(Status::NotAuthorized));
    assert!(r.auth_failed());
    assert!(!data_read(&sa));
}

#[test]
fn a_receiver_without_the_secret_gets_no_data() {
    // The receiver asks for nothing and grants at once: the sender must not send to it.
    let (s, r) = machines(Some("correct horse battery staple"), None);
    let (_, sa, _) = exchange(s, r);
    assert!(!data_read(&sa), "{sa:?}");
    let why = sender_failure(&sa).expect("the sender ended");
    assert!(why.contains("without proving"), "{why}");
}

#[test]
fn a_receiver_that_reflects_the_senders_proof_or_another_secret_gets_no_data() {
    let t = Instant::now();
    let (mut s, _) = machines(Some("correct horse battery staple"), None);
    let _ = drain_sender(&mut s); // the HELLO
    deliver(&mut s, &Message::Challenge(Challenge { nonce: [9; 16], prefix: None }), t);
    let (_, sent) = drain_sender(&mut s);
    let Message::Proof(theirs) = wire::decode(&sent[0]).unwrap().1 else { panic!("no PROOF") };
    // Reflected: the sender's own MAC, with the receiver's nonce. After its PROOF the sender
    // takes only sealed messages, and a reflector cannot seal.
    deliver(&mut s, &Message::Proof(Proof { nonce: [9; 16], mac: theirs.mac }), t);
    let (sa, _) = drain_sender(&mut s);
    let why = sender_failure(&sa).expect("the sender ended");
    assert!(why.contains("seal is wrong"), "{why}");
    assert!(!data_read(&sa));

    // A receiver with another secret.
    let (s, r) = machines(Some("correct horse battery staple"), Some("another secret, long enough"));
    let (ra, sa, _) = exchange(s, r);
    assert!(!opened(&ra));
    assert!(!data_read(&sa));
}

#[test]
fn proofs_out_of_place_are_protocol_errors() {
    let t = Instant::now();
    // A CHALLENGE to a sender that offered no secret.
    let (mut s, _) = machines(None, None);
    let _ = drain_sender(&mut s);
    deliver(&mut s, &Message::Challenge(Challenge { nonce: [9; 16], prefix: None }), t);
    let (sa, _) = drain_sender(&mut s);
    assert!(matches!(sa.last(), Some(sender::Action::Finish(Outcome::Failed(ProtocolError::Peer(_))))), "{sa:?}");
    // A PROOF to a receiver that asked for none.
    let (_, mut r) = machines(None, None);
    let mut out = Vec::new();
    wire::encode(SESSION, &Message::Proof(Proof { nonce: [1; 16], mac: [2; 32] }), &mut out).unwrap();
    r.handle(receiver::Input::Message(&out), t);
    let (ra, _) = drain_receiver(&mut r);
    assert!(!opened(&ra));
    assert!(r.is_done());
    // HELLOs offer AUTH only with a secret.
    let (mut s, _) = machines(None, None);
    let (_, sent) = drain_sender(&mut s);
    let Message::Hello(h) = wire::decode(&sent[0]).unwrap().1 else { panic!() };
    assert_eq!(h.caps & caps::AUTH, 0);
}

/// Runs both machines by hand until neither has anything to say, each of the receiver's
/// messages passed through `on_path` on its way (as someone on the path could rewrite it); the
/// sender's actions. Both machines stay the caller's, to read their state after.
fn run_through(s: &mut Sender, r: &mut Receiver, mut on_path: impl FnMut(Vec<u8>) -> Vec<u8>) -> Vec<sender::Action> {
    let t = Instant::now();
    let mut actions = Vec::new();
    for _ in 0..6 {
        let (sa, to_r) = drain_sender(s);
        actions.extend(sa);
        for m in &to_r {
            r.handle(receiver::Input::Message(m), t);
        }
        let (ra, mut to_s) = drain_receiver(r);
        if opened(&ra) {
            r.handle(receiver::Input::Ready { addr: 4096, rkey: 7 }, t);
            to_s.extend(drain_receiver(r).1);
        }
        for m in to_s {
            s.handle(sender::Input::Message(&on_path(m)), t);
        }
    }
    actions.extend(drain_sender(s).0);
    actions
}

/// With a secret the session's digest is keyed BLAKE3 on both sides, with the same key, which
/// depends on the session's nonces: a digest computed for one session checks in no other.
#[test]
fn a_session_with_the_secret_uses_the_keyed_digest_with_one_key_per_session() {
    let mut keys = Vec::new();
    for nonce in [4u8, 5] {
        let (mut s, r) = machines(Some("correct horse battery staple"), Some("correct horse battery staple"));
        let mut r = r.with_nonce([nonce; 16]);
        run_through(&mut s, &mut r, |m| m);
        assert_eq!((s.digest(), r.digest()), (rdma_proto::Digest::Blake3Keyed, rdma_proto::Digest::Blake3Keyed));
        let (sk, rk) = (s.digest_key().expect("the sender's key"), r.digest_key().expect("the receiver's key"));
        assert_eq!(sk, rk, "both sides derive the same key");
        // Printing a machine shows no key material.
        for shown in [format!("{s:?}"), format!("{r:?}")] {
            assert!(shown.contains("digest_secret: Some(DigestSecret(..))"), "{shown}");
        }
        keys.push(sk);
    }
    assert_ne!(keys[0], keys[1], "another nonce, another key");
    // Without a secret: an unkeyed digest and no key.
    let (s, r) = machines(None, None);
    let (_, _, r) = exchange(s, r);
    assert!(!r.digest().is_keyed() && r.digest_key().is_none());
}

/// Nobody on the path can strip the keyed digest: a receiver with a secret refuses a HELLO that
/// offers AUTH without it, and a sender with a secret refuses a GRANT that names another digest
/// (here the receiver's own GRANT, rewritten on the way: its seal no longer fits).
#[test]
fn the_keyed_digest_cannot_be_stripped_on_the_path() {
    let (mut s, mut r) = machines(Some("correct horse battery staple"), Some("correct horse battery staple"));
    let (_, hello) = drain_sender(&mut s);
    let (h, Message::Hello(mut stripped)) = wire::decode(&hello[0]).unwrap() else { panic!("a HELLO") };
    assert_ne!(stripped.caps & caps::DIGEST_BLAKE3, 0, "a sender with a secret offers the keyed digest");
    stripped.caps &= !caps::DIGEST_BLAKE3;
    let mut out = Vec::new();
    wire::encode(h.session, &Message::Hello(stripped), &mut out).unwrap();
    r.handle(receiver::Input::Message(&out), Instant::now());
    let (ra, _) = drain_receiver(&mut r);
    assert_eq!(refused(&ra), Some(Status::ProtocolMismatch), "{ra:?}");
    assert!(!opened(&ra));

    let (mut s, mut r) = machines(Some("correct horse battery staple"), Some("correct horse battery staple"));
    let sa = run_through(&mut s, &mut r, |mut m| {
        // The GRANT's caps (after the header and its version), rewritten in place.
        if m[5] == wire::Kind::Grant as u8 {
            let at = wire::HEADER_LEN + 2;
            let caps = u32::from_be_bytes(m[at..at + 4].try_into().unwrap());
            let rewritten = (caps & !caps::DIGEST_BLAKE3) | caps::DIGEST_XXH3_128;
            m[at..at + 4].copy_from_slice(&rewritten.to_be_bytes());
        }
        m
    });
    assert!(!data_read(&sa), "data read under a rewritten GRANT: {sa:?}");
    let failure = sender_failure(&sa).expect("the sender failed");
    assert!(failure.contains("seal is wrong"), "{failure}");
}

/// With a secret, a message changed on the path (here a FIN with no valid seal, during the
/// data) ends the receiver's session with `ProtocolError::Unsealed`, which its driver treats as
/// a resumable end (it keeps the partial), not as the sender's violation (which would throw the
/// partial away). It ends with no verdict, as a lost connection does, so that the sender
/// retries: a sealed ACK `ProtocolMismatch` would be a verdict the sender takes as final, and
/// `--retries` would never resume it.
#[test]
fn a_message_changed_on_the_path_ends_the_receivers_session_as_unsealed() {
    let (s, r) = machines(Some("correct horse battery staple"), Some("correct horse battery staple"));
    let (ra, _, mut r) = exchange(s, r);
    assert!(opened(&ra), "the session reached its data: {ra:?}");
    let mut forged = Vec::new();
    let fin = Message::Fin(rdma_proto::wire::Fin { chunks: 16, size: 1000, digest: vec![0; 32] });
    wire::encode(SESSION, &fin, &mut forged).unwrap();
    forged.extend_from_slice(&[0; 16]);
    r.handle(receiver::Input::Message(&forged), Instant::now());
    let (ra, sent) = drain_receiver(&mut r);
    let failed = ra.iter().find_map(|a| match a {
        receiver::Action::Finish(Outcome::Failed(e)) => Some(e.clone()),
        _ => None,
    });
    assert_eq!(failed, Some(rdma_proto::ProtocolError::Unsealed), "{ra:?}");
    assert!(sent.is_empty(), "no verdict for a message changed on the path: {} sent", sent.len());
}
