//! Device tests of the async front (feature `tokio`), rxe1 (10.77.0.2) -> rxe0 (10.77.0.1):
//! resolve, connect, accept and disconnect awaited on a current-thread and a multi-thread
//! runtime; the peer leaving seen by every async reader; a request wait dropped again and again
//! losing no request; the typed error outside a runtime.
#![cfg(feature = "tokio")]

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::*;
use rdma_cm::*;
use rdma_verbs::*;
use tokio::time::timeout;

const HELLO: &[u8] = b"hello, async";
const WELCOME: &[u8] = b"welcome, async";

/// One side of a connection, on shared (`'static`) verbs resources, so that a task owns it.
struct Side {
    conn: Connection<'static>,
    pd: Arc<ProtectionDomain<'static>>,
}

/// A PD and an RC QP (its own CQ) on `ctx`, all shared.
fn qp_on(ctx: rdma_verbs::Context) -> (Arc<ProtectionDomain<'static>>, QueuePair<'static, Rc, Reset>) {
    let ctx = Arc::new(ctx);
    let pd = Arc::new(ProtectionDomain::new(ctx.clone()).unwrap());
    let cq = Arc::new(CompletionQueue::new(ctx, 32, None).unwrap());
    let qp = QueuePair::<Rc, Reset>::create(pd.clone(), QpCreateAttr::new(cq.clone(), cq)).unwrap();
    (pd, qp)
}

/// The client: resolves from the client address and connects with `data`, every step awaited.
async fn connect(topo: &testkit::Topology, dst: SocketAddr, data: &[u8]) -> rdma_cm::Result<Side> {
    let id = CmId::new()?.resolve(Some(client_src(topo)), dst).await?;
    assert_eq!(id.device_name(), topo.client.device);
    let (pd, qp) = qp_on(id.open_context()?);
    let qp = id.init_qp(qp, AccessFlags::REMOTE_WRITE)?;
    let conn = id.connect(qp, &ConnParams::new().private_data(data)).await?;
    Ok(Side { conn, pd })
}

/// Accepts `req` with `data`.
async fn accept(req: ConnectRequest, data: &[u8]) -> rdma_cm::Result<Side> {
    let (pd, qp) = qp_on(req.open_context()?);
    let qp = req.init_qp(qp, AccessFlags::REMOTE_WRITE)?;
    let conn = req.accept(qp, &ConnParams::new().private_data(data)).await?;
    Ok(Side { conn, pd })
}

/// The server: the next request, accepted with `data`.
async fn accept_next(listener: &Listener, data: &[u8]) -> rdma_cm::Result<Side> {
    accept(listener.recv_request_async().await?, data).await
}

/// Within `T`, or the test fails naming `what`.
async fn within<F: std::future::IntoFuture>(what: &str, f: F) -> F::Output {
    timeout(T, f).await.unwrap_or_else(|_| panic!("{what}: not within {T:?}"))
}

/// Polls `f` once, outside any runtime.
fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    std::pin::pin!(f).poll(&mut std::task::Context::from_waker(&waker))
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::test(flavor = "current_thread")]
async fn connect_accept_and_disconnect_on_a_current_thread_runtime() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    for client_leaves in [true, false] {
        let start = Instant::now();
        let (server, client) = tokio::join!(
            within("accept", accept_next(&listener, WELCOME)),
            within("connect", connect(&topo, dst, HELLO))
        );
        let (server, client) = (server.unwrap(), client.unwrap());
        let connected = start.elapsed();
        assert_eq!(&server.conn.private_data()[..HELLO.len()], HELLO);
        assert_eq!(&client.conn.private_data()[..WELCOME.len()], WELCOME);
        assert_eq!(server.conn.peer_addr(), client.conn.local_addr());
        assert_eq!(client.conn.peer_addr(), dst);
        let (leaving, staying) = if client_leaves { (client, server) } else { (server, client) };
        let (left, stayed) = tokio::join!(
            within("disconnect", leaving.conn.disconnect()),
            within("peer_disconnect", staying.conn.peer_disconnect()),
        );
        let (left, stayed) = (left.unwrap(), stayed.unwrap());
        assert_eq!(left.qp().state().unwrap(), QpState::Error, "the QP is flushed");
        assert_eq!(stayed.qp().state().unwrap(), QpState::Error, "the QP is flushed");
        eprintln!(
            "current-thread, {} leaves: connected in {connected:?}, disconnected in {:?}",
            if client_leaves { "client" } else { "server" },
            start.elapsed() - connected
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_with_a_ping_each_on_a_multi_thread_runtime() {
    const N: u64 = 4;
    let topo = Arc::new(testkit::require_topology!());
    let listener = Arc::new(Listener::bind(server_any_port(&topo), 8).unwrap());
    let dst = listener.local_addr();
    let start = Instant::now();
    // Every task waits for its request on the one listener: each request goes to one of them.
    let servers: Vec<_> = (0..N)
        .map(|_| {
            let listener = listener.clone();
            tokio::spawn(async move {
                let side = within("accept", accept_next(&listener, b"")).await.unwrap();
                let n = tokio::task::block_in_place(|| ping_server(&side.conn, &side.pd));
                let closed = within("peer_disconnect", side.conn.peer_disconnect()).await.unwrap();
                assert_eq!(closed.qp().state().unwrap(), QpState::Error);
                n
            })
        })
        .collect();
    let clients: Vec<_> = (0..N)
        .map(|i| {
            let topo = topo.clone();
            tokio::spawn(async move {
                let side = within("connect", connect(&topo, dst, b"")).await.unwrap();
                tokio::task::block_in_place(|| ping_client(&side.conn, &side.pd, 100 * i));
                let closed = within("disconnect", side.conn.disconnect()).await.unwrap();
                assert_eq!(closed.qp().state().unwrap(), QpState::Error);
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let mut pings = Vec::new();
    for server in servers {
        pings.push(server.await.unwrap());
    }
    pings.sort_unstable();
    assert_eq!(pings, (0..N).map(|i| 100 * i).collect::<Vec<_>>(), "each ping reached one server task");
    eprintln!("multi-thread: {N} concurrent connections, a ping each, in {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_leaving_is_seen_by_every_async_reader() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();

    // recv_event_async takes the disconnect; disconnected_async and the events see it after.
    let (server, client) = tokio::join!(accept_next(&listener, b""), connect(&topo, dst, b""));
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_send(&server.conn.recv_event_async());
    assert_send(&server.conn.disconnected_async());
    assert!(!server.conn.peer_disconnected());
    let (left, event) =
        tokio::join!(client.conn.disconnect(), within("recv_event_async", server.conn.recv_event_async()));
    left.unwrap();
    assert_eq!(event.unwrap(), Event::Disconnected);
    assert!(server.conn.peer_disconnected());
    within("disconnected_async, after the fact", server.conn.disconnected_async()).await.unwrap();
    assert!(within("events, after the fact", server.conn.events().next()).await.is_none(), "the events have ended");
    server.conn.peer_disconnect().await.unwrap();

    // Two readers at once, the events in a select! loop and disconnected_async; the client drops
    // its connection (no goodbye), and the drop must not block the runtime.
    let (server, client) = tokio::join!(accept_next(&listener, b""), connect(&topo, dst, b""));
    let (server, client) = (server.unwrap(), client.unwrap());
    let watch_events = async {
        let mut events = server.conn.events();
        assert_send(&events.next());
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        let (mut seen, mut ticked) = (Vec::new(), 0u32);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(ev) => seen.push(ev.unwrap()),
                    None => break,
                },
                _ = ticks.tick() => ticked += 1,
            }
        }
        (seen, ticked)
    };
    let drop_client = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        drop(client);
        t0.elapsed()
    };
    let (events, gone, dropped) = tokio::join!(
        within("the events' end", watch_events),
        within("disconnected_async", server.conn.disconnected_async()),
        drop_client,
    );
    let (seen, ticked) = events;
    gone.unwrap();
    assert!(seen.is_empty() || seen == [Event::Disconnected], "at most the disconnect: {seen:?}");
    assert!(ticked > 1, "the select! loop ran its other arm meanwhile");
    assert!(dropped < Duration::from_millis(200), "dropping a connection took {dropped:?}");
    assert!(server.conn.peer_disconnected());
    let closed = server.conn.peer_disconnect().await.unwrap();
    assert_eq!(closed.qp().state().unwrap(), QpState::Error);
    eprintln!("the events {seen:?} after {ticked} ticks; dropping the client's connection took {dropped:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_wait_dropped_again_and_again_loses_no_request() {
    let topo = Arc::new(testkit::require_topology!());
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    // Nothing comes: 100 waits dropped by their timeout.
    for i in 0..100 {
        let waited = timeout(Duration::from_millis(1), listener.recv_request_async()).await;
        assert!(waited.is_err(), "wait {i}: no request yet: {:?}", waited.map(|r| r.map(|_| ())));
    }
    // Then a real connection, accepted.
    let (server, client) =
        tokio::join!(within("accept", accept_next(&listener, WELCOME)), within("connect", connect(&topo, dst, HELLO)));
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_eq!(&client.conn.private_data()[..WELCOME.len()], WELCOME);
    drop((server, client));

    // A client connects from another task (another worker thread, as its verbs calls block it),
    // while the server's waits keep being dropped until one gets the request: a drop that raced
    // its arrival must not lose it.
    for round in 0..3 {
        let client = tokio::spawn({
            let topo = topo.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let side = within("connect", connect(&topo, dst, HELLO)).await.unwrap();
                within("disconnect", side.conn.disconnect()).await.unwrap();
            }
        });
        let (start, mut dropped) = (Instant::now(), 0u32);
        let req = loop {
            match timeout(Duration::from_micros(300), listener.recv_request_async()).await {
                Err(_) => dropped += 1,
                Ok(req) => break req.unwrap(),
            }
            assert!(start.elapsed() < T, "round {round}: no request within {T:?} ({dropped} waits dropped)");
        };
        let side = within("accept", accept(req, WELCOME)).await.unwrap();
        within("peer_disconnect", side.conn.peer_disconnect()).await.unwrap();
        client.await.unwrap();
        assert!(dropped > 0, "round {round}: waits were dropped before the client connected");
        eprintln!("round {round}: {dropped} request waits dropped in {:?}; the request was accepted", start.elapsed());
    }
}

/// Outside a runtime an async call is `NoRuntime`; in any runtime it waits there, also after the
/// runtime of an earlier wait shut down: a channel is never bound to its first runtime.
#[test]
fn async_calls_outside_a_runtime_are_a_typed_error_and_any_runtime_will_do() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 1).unwrap();
    let no_runtime = |what: &str, got: Poll<rdma_cm::Result<()>>| match got {
        Poll::Ready(Err(e @ rdma_cm::Error::NoRuntime { .. })) => {
            assert!(e.to_string().contains("no Tokio runtime"), "{e}")
        }
        Poll::Ready(other) => panic!("{what}: {other:?} instead of Error::NoRuntime"),
        Poll::Pending => panic!("{what}: pending instead of Error::NoRuntime"),
    };
    no_runtime("recv_request_async", poll_once(async { listener.recv_request_async().await.map(drop) }));
    let id = CmId::new().unwrap();
    let resolve = async { id.resolve(Some(client_src(&topo)), listener.local_addr()).await.map(drop) };
    no_runtime("resolve", poll_once(resolve));

    // Used in a runtime that then shut down: outside any runtime the same error; in another
    // runtime the identifier waits there (each wait registers with the runtime it runs on), so
    // with no request coming the wait is still pending when its timeout ends it.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        assert!(timeout(Duration::from_millis(10), listener.recv_request_async()).await.is_err());
    });
    drop(rt);
    no_runtime("after the runtime shut down", poll_once(async { listener.recv_request_async().await.map(drop) }));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let got = rt.block_on(async { timeout(Duration::from_millis(200), listener.recv_request_async()).await });
    assert!(got.is_err(), "in another runtime: {:?} instead of a wait", got.map(|r| r.map(drop)));
    // And a connection is accepted there (the listener's first runtime is gone).
    rt.block_on(async {
        let dst = listener.local_addr();
        let (client, server) =
            tokio::join!(connect(&topo, dst, b"again"), within("accept", accept_next(&listener, WELCOME)));
        let (client, server) = (client.unwrap(), server.unwrap());
        assert!(server.conn.private_data().starts_with(b"again"), "the client's private data");
        drop((client, server));
    });
}

/// `disconnected_async` asleep while another reader takes the disconnect: the reader that took
/// it wakes the waiter, which then resolves at once. The waiter is a task of a runtime that is
/// idle while the other reader takes the event, so its reactor never sees the channel readable
/// (epoll reports an edge only if the event is still there when it looks) and only a wake-up
/// gets the task polled again: without one the waiter slept until the next CM event (the
/// timewait's end, seconds later), or for ever.
#[test]
fn a_disconnect_another_reader_took_wakes_disconnected_async() {
    /// Below what the waiter slept without the wake-up (2.3 s on Linux 6.1, 0.53 s on 6.12), far
    /// above what it takes with it (2-50 ms) and a VM's jitter.
    const BOUND: Duration = Duration::from_millis(300);
    let topo = testkit::require_topology!();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    for reader in ["recv_event", "try_recv_event", "events().next"] {
        let (server, client) =
            rt.block_on(async { tokio::join!(accept_next(&listener, b""), connect(&topo, dst, b"")) });
        let (server, client) = (Arc::new(server.unwrap()), client.unwrap());
        // The waiter, a task polled once: asleep on the channel, its runtime idle from now on.
        let waiter = rt.spawn({
            let server = server.clone();
            async move { server.conn.disconnected_async().await }
        });
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
        assert!(!waiter.is_finished(), "{reader}: the waiter resolved before the peer left");
        // The peer leaves; another reader takes its disconnect.
        let leaving = std::thread::spawn(move || client.conn.disconnect().wait(T).map(drop));
        let took = match reader {
            "recv_event" => server.conn.recv_event(T).unwrap(),
            "try_recv_event" => {
                let start = Instant::now();
                loop {
                    if let Some(ev) = server.conn.try_recv_event().unwrap() {
                        break ev;
                    }
                    assert!(start.elapsed() < T, "{reader}: no event");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            _ => {
                let other = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                other.block_on(async { within("events().next", server.conn.events().next()).await }).unwrap().unwrap()
            }
        };
        let taken = Instant::now();
        assert_eq!(took, Event::Disconnected, "{reader}");
        leaving.join().unwrap().unwrap();
        // The waiter's runtime runs again: only a wake-up gets the task polled.
        let woke = rt.block_on(async { timeout(Duration::from_secs(3), waiter).await });
        let late = taken.elapsed();
        eprintln!("beside {reader}: disconnected_async resolved {late:?} after the other reader took the event");
        let woke =
            woke.unwrap_or_else(|_| panic!("beside {reader}: disconnected_async still asleep 3 s after the event"));
        woke.unwrap().unwrap();
        assert!(late < BOUND, "beside {reader}: disconnected_async resolved {late:?} after the event was taken");
    }
}

/// A pending `connect` polled once in one runtime, then awaited in another while the first
/// lives (idle): it completes there, since each poll of a CM wait registers with the runtime
/// that polls it, not with the first runtime's reactor, which nothing drives.
#[test]
fn a_pending_connect_moved_to_another_live_runtime_completes_there() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 1).unwrap();
    let dst = listener.local_addr();
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let id = CmId::new().unwrap().resolve(Some(client_src(&topo)), dst).wait(T).unwrap();
    let (pd, qp) = qp_on(id.open_context().unwrap());
    let qp = id.init_qp(qp, AccessFlags::REMOTE_WRITE).unwrap();
    // The server accepts a little after the connect's first poll.
    let server = std::thread::spawn(move || {
        let req = listener.recv_request(T).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let pd = req.open_context().unwrap();
        let (spd, sqp) = qp_on(pd);
        let sqp = req.init_qp(sqp, AccessFlags::REMOTE_WRITE).unwrap();
        let conn = req.accept(sqp, &ConnParams::new()).wait(T).unwrap();
        conn.peer_disconnect().wait(T).unwrap();
        drop(spd);
    });
    let mut connecting = std::future::IntoFuture::into_future(id.connect(qp, &ConnParams::new()));
    let pending = first.block_on(std::future::poll_fn(|cx| Poll::Ready(connecting.as_mut().poll(cx).is_pending())));
    assert!(pending, "the connect completed at its first poll");
    let start = Instant::now();
    let conn = second.block_on(async { timeout(Duration::from_secs(3), connecting).await });
    let took = start.elapsed();
    eprintln!("the connect moved to a second runtime completed there in {took:?}");
    let conn = conn.expect("the connect moved to a second runtime never completed there").unwrap();
    conn.disconnect().wait(T).unwrap();
    server.join().unwrap();
    drop((pd, first));
}

/// A connect whose request the server never answers ends at its deadline with the typed
/// `Timeout` that names `rdma_connect` and the bound it was given, blocking and awaited alike;
/// awaited on a runtime built without tokio's time driver (the deadline is a `timerfd` on the
/// reactor). The CM's own response timer (seconds) fires long after.
#[test]
fn a_connect_no_one_answers_times_out_naming_rdma_connect_on_a_runtime_without_time() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let dst = listener.local_addr();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let bound = Duration::from_millis(400);
    for awaited in [true, false] {
        let id = CmId::new().unwrap().resolve(Some(client_src(&topo)), dst).wait(T).unwrap();
        let (_pd, qp) = qp_on(id.open_context().unwrap());
        let qp = id.init_qp(qp, AccessFlags::empty()).unwrap();
        let pending = id.connect(qp, &ConnParams::new());
        let start = Instant::now();
        let until = Deadline::after(bound);
        let ended = match awaited {
            true => rt.block_on(pending.wait_async(until)),
            false => pending.wait(until),
        };
        let took = start.elapsed();
        match ended {
            Err(rdma_cm::Error::Timeout { what: "rdma_connect", after, .. }) => {
                assert_eq!(after, bound, "awaited: {awaited}")
            }
            other => panic!("awaited: {awaited}: {:?}", other.map(|_| ())),
        }
        assert!((bound..bound + Duration::from_secs(2)).contains(&took), "awaited: {awaited}: ended after {took:?}");
        // The request did reach the server, which never answered it.
        drop(listener.recv_request(T).unwrap());
    }
}

/// A receive with a deadline awaited on a runtime without time (`rdma_verbs::wait::timeout_at`
/// around `recv_request_async`) ends at the deadline, and the listener serves on.
#[test]
fn an_async_receive_bounded_by_a_deadline_ends_on_a_runtime_without_time() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 4).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let start = Instant::now();
    let until = Deadline::after(Duration::from_millis(100));
    let got = rt.block_on(rdma_verbs::wait::timeout_at(until, listener.recv_request_async()));
    assert!(matches!(got, Ok(None)), "{:?}", got.map(|r| r.map(|r| r.map(|_| ()))));
    assert!(start.elapsed() >= Duration::from_millis(100));
}
