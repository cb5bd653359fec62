//! Device tests of the waits that sleep: a wait spins for its `WaitPolicy`'s budget,
//! then arms its CQ and sleeps on the completion channel, so an idle connection costs no core;
//! it wakes for each completion, including one that comes between the last poll and the arming.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// The CPU time the calling thread spends in `f`, and how long `f` took.
fn cpu_of<R>(f: impl FnOnce() -> R) -> (R, Duration, Duration) {
    let (cpu, wall) = (thread_cpu(), Instant::now());
    let r = f();
    (r, thread_cpu() - cpu, wall.elapsed())
}

/// An idle connection's blocking wait sleeps: 3 s of `RecvRing::recv` on a link nobody sends
/// on costs well under 10% of a core (printed), where the spinning wait of before costs one.
/// The share is what is judged, so a short window judges as a long one does, and more strictly
/// a wait that spins before it sleeps (0.3 s of spinning fails it).
#[test]
fn an_idle_blocking_wait_sleeps() {
    let topo = testkit::require_topology!();
    let mut links = echo_links(&topo, 1, true);
    let (_, server) = &mut links[0];
    assert!(server.ring.can_sleep() && server.sq.can_sleep());
    let (r, cpu, wall) = cpu_of(|| server.ring.recv(Duration::from_secs(3)));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    println!("idle connection, blocking wait: {cpu:?} of CPU in {wall:?} ({:.3}% of a core)", share * 100.0);
    assert!(share < 0.10, "an idle blocking wait used {:.1}% of a core", share * 100.0);

    // The reference: a wait that only spins (the wait of before, and a CQ without a channel).
    server.ring.set_wait_policy(WaitPolicy::spin_then_sleep(Duration::MAX));
    let (r, cpu, wall) = cpu_of(|| server.ring.recv(Duration::from_secs(1)));
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    println!("idle connection, spinning wait: {cpu:?} of CPU in {wall:?} ({:.1}% of a core)", share * 100.0);
    assert!(share > 0.3, "a spinning wait used only {:.1}% of a core: is it sleeping?", share * 100.0);
}

/// Round trips where every wait sleeps at once (no spin: each completion comes after the CQ was
/// armed, or between the poll and the arming): every message and reply arrives, in order.
#[test]
fn sleeping_waits_wake_for_every_completion() {
    let topo = testkit::require_topology!();
    let (mut client, mut server) = echo_links(&topo, 1, true).pop().unwrap();
    for l in [&mut client, &mut server] {
        l.ring.set_wait_policy(WaitPolicy::sleep_at_once());
        l.sq.set_wait_policy(WaitPolicy::sleep_at_once());
    }
    let echo = std::thread::spawn(move || {
        for _ in 0..500u32 {
            let msg = server.ring.recv(T).unwrap();
            let bytes = msg.bytes().to_vec();
            server.ring.release(msg).unwrap();
            send_bytes(&mut server, &bytes);
        }
        server.sq.drain(T, |c| c.ok().unwrap()).unwrap();
        server
    });
    for i in 0..500u32 {
        send_bytes(&mut client, &i.to_le_bytes());
        let reply = client.ring.recv(T).unwrap();
        assert_eq!(reply.bytes(), i.to_le_bytes(), "round trip {i}");
        client.ring.release(reply).unwrap();
    }
    client.sq.drain(T, |c| c.ok().unwrap()).unwrap();
    drop(echo.join().unwrap());
}

/// A ring and a queue whose CQs have no completion channel say they can only spin, and still
/// wait correctly.
#[test]
fn queues_without_a_channel_only_spin_and_still_wait() {
    let topo = testkit::require_topology!();
    let (mut client, mut server) = echo_links(&topo, 1, false).pop().unwrap();
    assert!(!server.ring.can_sleep() && !client.sq.can_sleep());
    for i in 0..50u32 {
        send_bytes(&mut client, &i.to_le_bytes());
        let msg = server.ring.recv(T).unwrap();
        assert_eq!(msg.bytes(), i.to_le_bytes());
        server.ring.release(msg).unwrap();
    }
    client.sq.drain(T, |c| c.ok().unwrap()).unwrap();
    assert!(matches!(server.ring.recv(Duration::from_millis(50)), Err(Error::Timeout { .. })));
}

/// Two threads wait at once on CQs that share one channel (a QP's send and receive CQs): an
/// event one of them reads for the other's CQ must not leave the other asleep past its
/// timeout (the sleep on a shared channel is sliced).
#[test]
fn waits_on_cqs_sharing_a_channel_each_wake() {
    let topo = testkit::require_topology!();
    let (client, server) = echo_links(&topo, 1, true).pop().unwrap();
    let Link { sq: mut server_sq, ring: mut server_ring, pool: server_pool } = server;
    let Link { sq: mut client_sq, ring: mut client_ring, pool: client_pool } = client;
    for r in [&mut server_ring, &mut client_ring] {
        r.set_wait_policy(WaitPolicy::sleep_at_once());
    }
    server_sq.set_wait_policy(WaitPolicy::sleep_at_once());
    const N: u32 = 300;
    // The server receives on one thread and sends on another: both wait on its one channel.
    let receiver = std::thread::spawn(move || {
        for i in 0..N {
            let msg = server_ring.recv(T).unwrap_or_else(|e| panic!("message {i}: {e}"));
            assert_eq!(msg.bytes(), i.to_le_bytes());
            server_ring.release(msg).unwrap();
        }
        server_ring
    });
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            while server_sq.room() == 0 || server_pool.available() == 0 {
                server_sq.wait(T, |c| c.ok().unwrap()).unwrap_or_else(|e| panic!("send {i}: {e}"));
            }
            let mut slot = server_pool.try_take().unwrap();
            slot.write_at(0, &i.to_le_bytes()).unwrap();
            server_sq.post(SlotRequest::send(slot, 4)).map_err(Error::from).unwrap();
            // One completion at a time: the thread sleeps on the channel for each.
            server_sq.wait(T, |c| c.ok().unwrap()).unwrap_or_else(|e| panic!("send {i}: {e}"));
        }
        (server_sq, server_pool)
    });
    for i in 0..N {
        while client_sq.room() == 0 || client_pool.available() == 0 {
            client_sq.wait(T, |c| c.ok().unwrap()).unwrap();
        }
        let mut slot = client_pool.try_take().unwrap();
        slot.write_at(0, &i.to_le_bytes()).unwrap();
        client_sq.post(SlotRequest::send(slot, 4)).map_err(Error::from).unwrap();
        let msg = client_ring.recv(T).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert_eq!(msg.bytes(), i.to_le_bytes());
        client_ring.release(msg).unwrap();
    }
    client_sq.drain(T, |c| c.ok().unwrap()).unwrap();
    drop(receiver.join().unwrap());
    drop(sender.join().unwrap());
}
