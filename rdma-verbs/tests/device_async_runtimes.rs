//! Device tests of the async front's waits across runtimes and beside blocking waits: an async
//! wait wakes when a blocking wait read its event, a queue waits on whichever runtime awaits it
//! and outlives the first one, an async wait outside a runtime is refused with a typed error, and
//! a queue dropped by a thread-local destructor drains without aborting the process.
#![cfg(feature = "tokio")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rdma_verbs::*;

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The client takes `n` messages on a thread (so the server's sends complete).
fn receive(mut client: Link, n: u32) -> std::thread::JoinHandle<Link> {
    std::thread::spawn(move || {
        for _ in 0..n {
            let m = client.ring.recv(Duration::from_secs(60)).unwrap();
            client.ring.release(m).unwrap();
        }
        client
    })
}

/// A thread asleep in `RecvRing::recv`, on the channel the send queue's CQ shares, may read the
/// send's completion event before the reactor sees the fd readable; epoll then reports nothing,
/// and the task in `wait_async` must still wake. 100 sends, so that the race is hit: a wait that
/// relied on epoll alone slept for good in about one run of five.
#[test]
fn an_async_wait_wakes_when_a_blocking_wait_read_its_event() {
    let topo = testkit::require_topology!();
    let (client, server) = echo_links(&topo, 1, true).pop().unwrap();
    let Link { mut sq, ring: mut server_ring, pool } = server;
    server_ring.set_wait_policy(WaitPolicy::sleep_at_once());
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let sleeper = std::thread::spawn(move || {
        while !stopping.load(Ordering::Relaxed) {
            let r = server_ring.recv(Duration::from_millis(200));
            assert!(matches!(r, Err(Error::Timeout { .. })), "{:?}", r.map(|_| ()));
        }
        server_ring
    });
    const N: u32 = 300;
    let peer = receive(client, N);
    sq.set_wait_policy(WaitPolicy::sleep_at_once());
    let stuck = current_thread().block_on(async {
        let mut stuck = Vec::new();
        for i in 0..N {
            // The task sleeps between sends, so the reactor is idle when the completion comes.
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut slot = pool.try_take().unwrap();
            slot.write_at(0, &i.to_le_bytes()).unwrap();
            sq.post(SlotRequest::send(slot, 4)).map_err(Error::from).unwrap();
            match tokio::time::timeout(Duration::from_secs(1), sq.wait_async(drop)).await {
                Ok(done) => assert!(done.unwrap() > 0),
                Err(_) => {
                    let late = sq.wait(Duration::from_millis(1), drop);
                    stuck.push(format!("send {i}: asleep for 1 s; a blocking wait then took {late:?}"));
                }
            }
        }
        stuck
    });
    assert!(stuck.is_empty(), "{} of {N} async waits slept past their completion:\n{}", stuck.len(), stuck.join("\n"));
    stop.store(true, Ordering::Relaxed);
    drop(sleeper.join().unwrap());
    drop(peer.join().unwrap());
}

/// A ring of 8 receives on an SRQ (its CQ on a channel: no re-flush timer wakes its waits),
/// and a client QP connected to the SRQ's one QP (the third value: keep it).
fn srq_ring_with_a_channel(
    topo: &testkit::Topology,
) -> (RecvRing<'static>, QueuePair<'static, Rc, ReadyToSend>, QueuePair<'static, Rc, ReadyToSend>) {
    let (ctx_c, pd_c) = open_shared(&topo.client.device);
    let (ctx_r, pd_r) = open_shared(&topo.server.device);
    let channel = Arc::new(CompletionChannel::new(ctx_r.clone()).unwrap());
    let srq = Arc::new(SharedReceiveQueue::new(pd_r.clone(), 16, 1).unwrap());
    let recv_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 64, Some(channel.into())).unwrap());
    let pool = SlotPool::new(pd_r.clone(), 64, 16, AccessFlags::LOCAL_WRITE).unwrap();
    let ring = RecvRing::with_srq(srq.clone(), recv_cq.clone(), pool, 8, T).unwrap();
    let send_cq = Arc::new(CompletionQueue::new(ctx_r.clone(), 16, None).unwrap());
    let attr = QpCreateAttr::new(send_cq, recv_cq).srq(srq).caps(caps(16, 0));
    let server = QueuePair::<Rc, Reset>::create(pd_r, attr)
        .unwrap()
        .init(InitAttr::new(topo.port).access(AccessFlags::LOCAL_WRITE))
        .unwrap();
    let client = owned_qp(topo, &ctx_c, &pd_c, caps(16, 1), 16, AccessFlags::LOCAL_WRITE);
    let (client, server) = connect_pair(topo, client, server);
    (ring, client, server)
}

/// One message from `client`, 20 ms from now, on a thread, awaited with `recv_async` in `rt`;
/// panics if it is not there within a second.
fn a_late_message_in(
    rt: &tokio::runtime::Runtime,
    ring: &mut RecvRing<'static>,
    client: &QueuePair<'static, Rc, ReadyToSend>,
    what: &str,
) {
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            send_messages(client, 1);
        });
        let r = rt.block_on(async { tokio::time::timeout(Duration::from_secs(1), ring.recv_async()).await });
        let msg = r.unwrap_or_else(|_| panic!("{what}: the message is not there after 1 s")).unwrap();
        ring.release(msg).unwrap();
    });
}

/// A channel is registered with the runtime that awaits it, not kept in the first one: awaited
/// in a second runtime while the first sits idle, the task wakes (a registration kept in the
/// first runtime would leave a ring on an SRQ asleep for ever).
#[test]
fn a_queue_waits_on_the_runtime_it_is_awaited_in() {
    let topo = testkit::require_topology!();
    let (mut ring, client, _server) = srq_ring_with_a_channel(&topo);
    ring.set_wait_policy(WaitPolicy::sleep_at_once());
    let first = current_thread();
    a_late_message_in(&first, &mut ring, &client, "in the first runtime");
    a_late_message_in(&multi_thread(), &mut ring, &client, "in a multi-thread runtime, the first idle");
    a_late_message_in(&current_thread(), &mut ring, &client, "in a third runtime, the first idle");
    drop(first);
}

/// After the runtime of the first async wait is dropped, async waits on the channel in new
/// runtimes still work (not `Verb { errno: EIO }`, tokio's "runtime shut down").
#[test]
fn a_queue_outlives_the_runtime_of_its_first_wait() {
    let topo = testkit::require_topology!();
    let (mut ring, client, _server) = srq_ring_with_a_channel(&topo);
    ring.set_wait_policy(WaitPolicy::sleep_at_once());
    a_late_message_in(&current_thread(), &mut ring, &client, "in the first runtime");
    a_late_message_in(&current_thread(), &mut ring, &client, "after the first runtime was dropped");
    a_late_message_in(&multi_thread(), &mut ring, &client, "in a multi-thread runtime, after both");
}

/// Once a runtime has registered the channel, `recv_async` polled outside any runtime is
/// refused with `NoRuntime`, not a panic in tokio's timer ("there is no reactor running").
#[test]
fn an_async_wait_outside_a_runtime_is_refused_even_after_one_used_the_queue() {
    let topo = testkit::require_topology!();
    let (_client, mut server) = echo_links(&topo, 1, true).pop().unwrap();
    server.ring.set_wait_policy(WaitPolicy::sleep_at_once());
    let rt = current_thread();
    let r = rt.block_on(async { tokio::time::timeout(Duration::from_millis(20), server.ring.recv_async()).await });
    assert!(r.is_err(), "a message came on an idle link");
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll_outside_a_runtime(server.ring.recv_async()).map(|r| r.map(drop))
    }));
    assert!(matches!(r, Ok(Some(Err(Error::NoRuntime { .. })))), "not NoRuntime: {:?}", r.map_err(|_| "a panic"));
    drop(rt);
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Link>> = const { std::cell::RefCell::new(None) };
}

/// The child of the next test: a send queue with sends in flight held in a thread-local, on a thread whose
/// eventfd was made after that thread-local; the thread ends, and the queue's drop waits during
/// the thread-locals' destruction.
#[test]
fn child_queue_in_a_thread_local() {
    if std::env::var_os("RDMA_TEST_CHILD").is_none() {
        return;
    }
    let topo = testkit::require_topology!();
    // The drop waits out its drain timeout (any will do: 1 s, not `T`'s 5), then flushes.
    let (client, server) = echo_links_draining(&topo, 1, true, false, Duration::from_secs(1)).pop().unwrap();
    // No receives on the server: the client's sends wait for the peer (receiver not ready).
    let Link { sq, ring, pool } = server;
    drop(ring);
    std::thread::spawn(move || {
        HELD.with(|h| *h.borrow_mut() = Some(client));
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let link = h.as_mut().unwrap();
            link.ring.set_wait_policy(WaitPolicy::sleep_at_once());
            let _ = link.ring.recv(Duration::from_millis(20));
            for i in 0..4u32 {
                send_bytes(link, &i.to_le_bytes());
            }
        });
    })
    .join()
    .unwrap();
    drop((sq, pool));
}

/// A queue dropped by a thread-local's destructor, with requests in flight, drains without
/// reaching the thread's (already destroyed) eventfd: the child exits cleanly, with no "thread
/// local panicked on drop" and no abort.
#[test]
fn a_queue_dropped_by_a_thread_local_destructor_drains() {
    if std::env::var_os("RDMA_TEST_CHILD").is_some() {
        return;
    }
    let _topo = testkit::require_topology!();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_queue_in_a_thread_local", "--exact", "--test-threads=1"])
        .env("RDMA_TEST_CHILD", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child died ({:?}):\n{err}", out.status);
}
