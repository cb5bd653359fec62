//! Device test: asynchronous port events, by taking rxe1's network interface down and up.

use std::process::Command;
use std::time::{Duration, Instant};

use rdma_verbs::*;

fn link(netdev: &str, state: &str) {
    let st = Command::new("ip").args(["link", "set", netdev, state]).status().expect("running ip");
    assert!(st.success(), "ip link set {netdev} {state}");
}

/// After the link is up again: `scripts/guest/topology restore` re-adds the policy route that
/// taking veth1 down deleted (else every later test in the VM would run without it) and checks
/// that both ports connect. Reports a failure without panicking (it may run in a drop).
fn restore_topology() -> bool {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/guest/topology");
    match Command::new(&script).arg("restore").output() {
        Ok(out) if out.status.success() => true,
        other => {
            eprintln!("{} restore: {other:?}", script.display());
            false
        }
    }
}

/// Brings the link back up and waits for the port to be active again, whatever the test did.
struct Restore<'a>(&'a Context, &'a str, u8);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        link(self.1, "up");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.query_port(self.2).map(|p| p.state == PortState::Active).unwrap_or(false) {
                assert!(restore_topology() || std::thread::panicking(), "the topology did not come back");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{} port {} did not come back", self.0.name(), self.2);
    }
}

#[test]
fn port_down_and_up_are_typed_async_events() {
    let topo = testkit::require_topology!();
    // Only inside the harness: this changes the host's network interface.
    if !testkit::device_required() {
        return;
    }
    let ctx = Context::open(&topo.client.device).unwrap();
    let netdev = "veth1";
    // Nothing pending: the wait times out, and the iterator ends.
    assert!(matches!(ctx.recv_async_event(Duration::from_millis(200)), Err(Error::Timeout { .. })));
    assert!(ctx.async_events(Duration::from_millis(100)).next().is_none());

    let _restore = Restore(&ctx, netdev, topo.port);
    // Three threads wait for the one event link-down raises: one with no deadline
    // (`Duration::MAX` used to overflow and panic), two with 2 s. One of them gets it; the others
    // must return by their timeout (the async fd was blocking: a thread that saw it readable but
    // lost the event to another blocked in ibv_get_async_event for good).
    let (tx, rx) = std::sync::mpsc::channel();
    let wait = Duration::from_secs(2);
    let mut got: Vec<(Duration, Result<AsyncEvent>)> = Vec::new();
    let mut seen = Vec::new();
    let mut down_state = None;
    // Nothing in the scope may panic while the unbounded waiter waits: it would never be joined.
    // Results are collected here and checked after the scope.
    std::thread::scope(|t| {
        for timeout in [Duration::MAX, wait, wait] {
            let (ctx, tx) = (&ctx, tx.clone());
            t.spawn(move || {
                let r = ctx.recv_async_event(timeout);
                let _ = tx.send((timeout, r));
            });
        }
        std::thread::sleep(Duration::from_millis(200)); // the waiters are in poll(2)
        link(netdev, "down");
        let finite = |got: &[(Duration, Result<AsyncEvent>)]| got.iter().filter(|(t, _)| *t == wait).count();
        while finite(&got) < 2 || !got.iter().any(|(_, r)| r.is_ok()) {
            match rx.recv_timeout(wait + Duration::from_secs(3)) {
                Ok(r) => got.push(r),
                Err(_) => {
                    eprintln!("an async-event waiter blocked past its timeout; returned: {got:?}");
                    std::process::exit(101); // a blocked waiter would keep the scope from ending
                }
            }
        }
        down_state = ctx.query_port(topo.port).ok().map(|p| p.state);
        link(netdev, "up");
        if got.len() < 3 {
            // The unbounded waiter is still waiting: link-up's first event ends it.
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok((_, Ok(ev))) => seen.push(ev),
                other => {
                    eprintln!("the unbounded waiter after link up: {other:?}");
                    std::process::exit(101);
                }
            }
        }
    });
    let events: Vec<_> = got.iter().filter_map(|(_, r)| r.as_ref().ok().copied()).collect();
    assert!(events.contains(&AsyncEvent::PortError { port: topo.port }), "{got:?}");
    assert!(got.iter().all(|(_, r)| r.is_ok() || matches!(r, Err(Error::Timeout { .. }))), "{got:?}");
    assert!(got.iter().any(|(_, r)| r.is_err()), "a waiter that got no event returned by its timeout: {got:?}");
    assert_ne!(down_state, Some(PortState::Active));
    let active = AsyncEvent::PortActive { port: topo.port };
    if !seen.contains(&active) {
        for ev in ctx.async_events(Duration::from_secs(5)) {
            let ev = ev.unwrap();
            seen.push(ev);
            if ev == active {
                break;
            }
        }
    }
    assert_eq!(seen.last(), Some(&AsyncEvent::PortActive { port: topo.port }), "events after link up: {seen:?}");
}

/// The device's async events through the reactor: link down on the client's interface is
/// `PortError`, link up `PortActive`, each awaited by `recv_async_event_async` (the async-event
/// fd registered by the library), while the runtime's thread is otherwise idle.
#[cfg(feature = "tokio")]
#[test]
fn port_events_are_awaited_on_the_reactor() {
    let topo = testkit::require_topology!();
    // Only inside the harness: this changes the interface.
    if !testkit::device_required() {
        return;
    }
    let ctx = Context::open(&topo.client.device).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let next = |want: AsyncEvent| {
        rt.block_on(async {
            loop {
                let ev = tokio::time::timeout(Duration::from_secs(10), ctx.recv_async_event_async()).await;
                let ev = ev.unwrap_or_else(|_| panic!("no {want:?} within 10 s")).unwrap();
                if ev == want {
                    return;
                }
            }
        })
    };
    link("veth1", "down");
    let down =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| next(AsyncEvent::PortError { port: topo.port })));
    link("veth1", "up");
    next(AsyncEvent::PortActive { port: topo.port });
    if let Err(p) = down {
        std::panic::resume_unwind(p);
    }
    // The port is back: wait until it is active for the tests after this one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ctx.query_port(topo.port).map(|p| p.state != PortState::Active).unwrap_or(true) {
        assert!(Instant::now() < deadline, "the port did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(restore_topology(), "the topology did not come back");
}
