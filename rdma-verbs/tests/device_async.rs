//! Device tests of the async front (feature `tokio`): `RecvRing::recv_async`,
//! `SendQueue::wait_async`/`ready_async`, on current-thread and multi-thread runtimes; an idle
//! task costs no core; futures dropped mid-wait lose no message and leak nothing.
#![cfg(feature = "tokio")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Sends `bytes` from `link`, awaiting room (and taking completions) when the queue is full.
async fn send_async(link: &mut Link, bytes: &[u8]) {
    while link.pool.available() == 0 {
        link.sq.wait_async(|c| c.ok().unwrap()).await.unwrap();
    }
    link.sq.ready_async(1, |c| c.ok().unwrap()).await.unwrap();
    let mut slot = link.pool.try_take().unwrap();
    slot.write_at(0, bytes).unwrap();
    link.sq.post(SlotRequest::send(slot, bytes.len())).map_err(Error::from).unwrap();
}

/// Serves echo on `link` until `n` messages were answered.
async fn echo(mut link: Link, n: usize) -> Link {
    for _ in 0..n {
        let msg = link.ring.recv_async().await.unwrap();
        let bytes = msg.bytes().to_vec();
        link.ring.release(msg).unwrap();
        send_async(&mut link, &bytes).await;
    }
    link.sq.drain_async(|c| c.ok().unwrap()).await.unwrap();
    link
}

/// `n` round trips from `link`, each reply checked.
async fn client(mut link: Link, id: u32, n: u32) -> Link {
    for i in 0..n {
        let msg = [id.to_le_bytes(), i.to_le_bytes()].concat();
        send_async(&mut link, &msg).await;
        let reply = link.ring.recv_async().await.unwrap();
        assert_eq!(reply.bytes(), msg, "client {id}, round trip {i}");
        link.ring.release(reply).unwrap();
    }
    link.sq.drain_async(|c| c.ok().unwrap()).await.unwrap();
    link
}

/// Round trips per client: each of the 32 clients and echo tasks is in flight the whole time,
/// so that many suffices (1,000 took 50 s per runtime under TCG; the test command's time).
const ROUND_TRIPS: u32 = 250;

/// 32 clients x [`ROUND_TRIPS`] round trips against 32 echo tasks, all on one runtime.
fn serve_32_clients(rt: tokio::runtime::Runtime) {
    let topo = testkit::require_topology!();
    let links = echo_links(&topo, 32, true);
    let start = Instant::now();
    let links = rt.block_on(async {
        let tasks: Vec<_> = links
            .into_iter()
            .enumerate()
            .map(|(id, (c, s))| {
                let server = tokio::spawn(echo(s, ROUND_TRIPS as usize));
                let client = tokio::spawn(client(c, id as u32, ROUND_TRIPS));
                (client, server)
            })
            .collect();
        let mut done = Vec::new();
        for (c, s) in tasks {
            done.push((c.await.unwrap(), s.await.unwrap()));
        }
        done
    });
    println!("32 clients x {ROUND_TRIPS} round trips: {:?}", start.elapsed());
    // Dropped inside the runtime through close_async: no blocking drop on a worker.
    rt.block_on(async {
        for (c, s) in links {
            for l in [c, s] {
                l.sq.close_async().await.unwrap();
                l.ring.close_async().await.unwrap();
            }
        }
    });
}

#[test]
fn a_current_thread_runtime_serves_32_clients() {
    serve_32_clients(current_thread());
}

#[test]
fn a_multi_thread_runtime_serves_32_clients() {
    serve_32_clients(multi_thread());
}

/// An idle task awaiting a message costs no core: 3 s of `recv_async` on a current-thread
/// runtime, measured on the runtime's thread (printed). The share of a core is what is judged,
/// so a short window judges as a long one does.
#[test]
fn an_idle_async_wait_sleeps() {
    let topo = testkit::require_topology!();
    let (_c, mut server) = echo_links(&topo, 1, true).pop().unwrap();
    let rt = current_thread();
    let (cpu, wall) = (thread_cpu(), Instant::now());
    let r = rt.block_on(async { tokio::time::timeout(Duration::from_secs(3), server.ring.recv_async()).await });
    let (cpu, wall) = (thread_cpu() - cpu, wall.elapsed());
    assert!(r.is_err(), "a message came on an idle link");
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    println!("idle connection, async wait: {cpu:?} of CPU in {wall:?} ({:.3}% of a core)", share * 100.0);
    assert!(share < 0.10, "an idle async wait used {:.1}% of a core", share * 100.0);
}

/// Futures of `recv_async` dropped mid-wait (by `tokio::time::timeout`) 1,000 times while
/// messages arrive at random moments: every message is received once, in order; afterwards
/// every slot is back and `rdma resource show` is at its baseline.
#[test]
fn dropped_futures_lose_no_message_and_leak_nothing() {
    let topo = testkit::require_topology!();
    let baseline = testkit::resource_counts(&topo.server.device);
    {
        let (mut client, mut server) = echo_links(&topo, 1, true).pop().unwrap();
        const N: u32 = 300;
        let sender = std::thread::spawn(move || {
            let mut x = 0x2545_f491_u32;
            for i in 0..N {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                std::thread::sleep(Duration::from_micros(u64::from(x % 4000)));
                send_bytes(&mut client, &i.to_le_bytes());
            }
            client.sq.drain(T, |c| c.ok().unwrap()).unwrap();
            client
        });
        let rt = current_thread();
        let (got, dropped) = rt.block_on(async {
            let (mut got, mut dropped) = (0u32, 0u32);
            let deadline = Instant::now() + Duration::from_secs(60);
            while got < N || dropped < 1000 {
                assert!(Instant::now() < deadline, "{got} messages, {dropped} dropped futures after 60 s");
                let wait = Duration::from_micros(u64::from(dropped % 7) * 100 + 50);
                match tokio::time::timeout(wait, server.ring.recv_async()).await {
                    Ok(msg) => {
                        let msg = msg.unwrap();
                        assert_eq!(msg.bytes(), got.to_le_bytes(), "message {got} lost or out of order");
                        server.ring.release(msg).unwrap();
                        got += 1;
                    }
                    Err(_) => dropped += 1,
                }
            }
            (got, dropped)
        });
        println!("{got} messages received across {dropped} dropped futures");
        assert_eq!(server.pool.available(), server.pool.capacity(), "a send slot is missing");
        assert_eq!(server.ring.posted(), server.ring.capacity(), "a receive was not reposted");
        let client = sender.join().unwrap();
        assert_eq!(client.pool.available(), client.pool.capacity());
        drop((client, server, rt));
    }
    assert_eq!(testkit::resource_counts(&topo.server.device), baseline, "resources left behind");
}

/// Awaited outside a tokio runtime, the async waits return a typed error instead of
/// panicking; a CQ without a channel is refused.
#[test]
fn async_waits_outside_a_runtime_or_without_a_channel_are_refused() {
    let topo = testkit::require_topology!();
    let (_c, mut server) = echo_links(&topo, 1, true).pop().unwrap();
    server.ring.set_wait_policy(WaitPolicy::sleep_at_once());
    let r = poll_outside_a_runtime(server.ring.recv_async());
    assert!(matches!(r, Some(Err(Error::NoRuntime { .. }))), "{r:?}");
    let (_c, mut spin_only) = echo_links(&topo, 1, false).pop().unwrap();
    let r = current_thread().block_on(spin_only.ring.recv_async());
    assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
}

/// Two tasks of a multi-thread runtime wait at once on CQs that share one channel (the server's
/// receive ring in one, its send queue in the other): an event one task reads for the other's
/// CQ must not leave the other asleep (such sleeps are sliced), so every wait ends well within
/// its 5 s bound.
#[test]
fn tasks_waiting_on_cqs_of_one_channel_each_wake() {
    let topo = testkit::require_topology!();
    let (client, server) = echo_links(&topo, 1, true).pop().unwrap();
    let Link { sq: mut server_sq, ring: mut server_ring, pool: server_pool } = server;
    server_ring.set_wait_policy(WaitPolicy::sleep_at_once());
    server_sq.set_wait_policy(WaitPolicy::sleep_at_once());
    const N: u32 = 300;
    // The client, on a thread of its own, sends its numbers and receives the server's.
    let peer = std::thread::spawn(move || {
        let mut client = client;
        for i in 0..N {
            send_bytes(&mut client, &i.to_le_bytes());
            let msg = client.ring.recv(T).unwrap();
            assert_eq!(msg.bytes(), i.to_le_bytes());
            client.ring.release(msg).unwrap();
        }
        client.sq.drain(T, |c| c.ok().unwrap()).unwrap();
        client
    });
    let rt = multi_thread();
    rt.block_on(async move {
        let receiver = tokio::spawn(async move {
            for i in 0..N {
                let msg = tokio::time::timeout(T, server_ring.recv_async()).await;
                let msg = msg.unwrap_or_else(|_| panic!("message {i}: still asleep after {T:?}")).unwrap();
                assert_eq!(msg.bytes(), i.to_le_bytes());
                server_ring.release(msg).unwrap();
            }
            server_ring
        });
        let sender = tokio::spawn(async move {
            for i in 0..N {
                let mut slot = loop {
                    if let Some(s) = server_pool.try_take() {
                        break s;
                    }
                    let done = tokio::time::timeout(T, server_sq.wait_async(|c| c.ok().unwrap())).await;
                    done.unwrap_or_else(|_| panic!("send {i}: still asleep after {T:?}")).unwrap();
                };
                slot.write_at(0, &i.to_le_bytes()).unwrap();
                server_sq.post(SlotRequest::send(slot, 4)).map_err(Error::from).unwrap();
                let done = tokio::time::timeout(T, server_sq.wait_async(|c| c.ok().unwrap())).await;
                done.unwrap_or_else(|_| panic!("send {i}: still asleep after {T:?}")).unwrap();
            }
            (server_sq, server_pool)
        });
        let ring = receiver.await.unwrap();
        let (sq, _pool) = sender.await.unwrap();
        sq.close_async().await.unwrap();
        ring.close_async().await.unwrap();
    });
    drop(peer.join().unwrap());
}

/// An RC QP sending on `send` and receiving on `recv`, connected to itself.
fn self_connected_on<'r>(
    pd: &'r ProtectionDomain<'r>,
    send: &'r CompletionQueue<'r>,
    recv: &'r CompletionQueue<'r>,
) -> QueuePair<'r, Rc, ReadyToSend> {
    let topo = testkit::configured();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(send, recv).caps(caps(4, 4))).unwrap();
    let qp = qp.init(InitAttr::new(topo.port).access(ALL)).unwrap();
    let me = qp.endpoint(topo.gid_index, 1).unwrap();
    connect(qp, 1, me, &topo)
}

/// A queue or ring made for async waits on a CQ without a completion channel is refused when it
/// is made, before any receive is posted (not only at its first async wait); `Context::create_cq_with_channel` makes CQs whose ring and queue are awaited, here a
/// message from the QP to itself.
#[test]
fn a_cq_without_a_channel_is_refused_when_made_for_async_and_one_with_its_own_is_awaited() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();

    let (bare_send, bare_recv) = (ctx.create_cq(16, None).unwrap(), ctx.create_cq(16, None).unwrap());
    let qp = self_connected_on(&pd, &bare_send, &bare_recv);
    let refused = |what: &str, r: Result<()>| match r {
        Err(Error::InvalidArgument { reason, .. }) => {
            assert!(reason.contains("no completion channel"), "{what}: {reason}")
        }
        other => panic!("{what}: {other:?} instead of InvalidArgument"),
    };
    let pool = SlotPool::new(&pd, 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    refused("RecvRing::for_async", RecvRing::for_async(&qp, pool, 4, T).map(drop));
    refused("SendQueue::for_async", SendQueue::for_async(&qp, T).map(drop));
    // The blocking constructors take them (their waits spin): nothing was posted or claimed.
    let pool = SlotPool::new(&pd, 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let ring = RecvRing::new(&qp, pool, 4, T).unwrap();
    let sq = SendQueue::new(&qp, T).unwrap();
    assert!(!ring.can_sleep() && !sq.can_sleep());
    drop((sq, ring, qp));

    let (send, recv) = (ctx.create_cq_with_channel(16).unwrap(), ctx.create_cq_with_channel(16).unwrap());
    assert!(send.channel().is_some() && recv.channel().is_some());
    let qp = self_connected_on(&pd, &send, &recv);
    let pool = SlotPool::new(&pd, 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    let mut ring = RecvRing::for_async(&qp, pool, 4, T).unwrap();
    let mut sq = SendQueue::for_async(&qp, T).unwrap();
    assert!(ring.can_sleep() && sq.can_sleep());
    let out = SlotPool::new(&pd, 64, 4, AccessFlags::LOCAL_WRITE).unwrap();
    current_thread().block_on(async {
        let mut slot = out.try_take().unwrap();
        slot.write_at(0, b"awaited").unwrap();
        sq.post(SlotRequest::send(slot, 7)).unwrap();
        let msg = tokio::time::timeout(T, ring.recv_async()).await.unwrap().unwrap();
        assert_eq!(msg.bytes(), b"awaited");
        ring.release(msg).unwrap();
        tokio::time::timeout(T, sq.drain_async(|c| c.ok().unwrap())).await.unwrap().unwrap();
    });
}

/// An async receive bounded by a deadline (`wait::timeout_at`), on a runtime built without
/// tokio's time driver: on an idle link it ends at the deadline, and the message sent next is
/// the one the next bounded receive takes. (A `tokio::time::timeout` panics in such a runtime.)
#[test]
fn a_receive_bounded_by_a_deadline_works_on_a_runtime_without_time() {
    let topo = testkit::require_topology!();
    let (mut client, mut server) = echo_links(&topo, 1, true).pop().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let start = Instant::now();
    let idle = rt.block_on(wait::timeout_at(Deadline::after(Duration::from_millis(100)), server.ring.recv_async()));
    let took = start.elapsed();
    assert!(matches!(idle, Ok(None)), "a message came on an idle link");
    assert!((Duration::from_millis(100)..Duration::from_secs(3)).contains(&took), "ended after {took:?}");
    let got = rt.block_on(async {
        send_async(&mut client, b"after the deadline").await;
        let msg = wait::timeout_at(Deadline::after(Duration::from_secs(10)), server.ring.recv_async()).await;
        let msg = msg.unwrap().expect("the message within 10 s").unwrap();
        let bytes = msg.bytes().to_vec();
        server.ring.release(msg).unwrap();
        client.sq.drain_async(|c| c.ok().unwrap()).await.unwrap();
        bytes
    });
    assert_eq!(got, b"after the deadline");
}
