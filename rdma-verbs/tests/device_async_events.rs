//! Device test: asynchronous port events, by taking rxe1's network interface down and up.

use std::process::Command;
use std::time::{Duration, Instant};

use rdma_verbs::*;

fn link(netdev: &str, state: &str) {
    let st = Command::new("ip").args(["link", "set", netdev, state]).status().expect("running ip");
    assert!(st.success(), "ip link set {netdev} {state}");
}

/// Brings the link back up and waits for the port to be active again, whatever the test did.
struct Restore<'a>(&'a Context, &'a str, u8);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        link(self.1, "up");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.0.query_port(self.2).map(|p| p.state == PortState::Active).unwrap_or(false) {
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
    assert!(matches!(ctx.next_async_event(Duration::from_millis(200)), Err(Error::Timeout { .. })));
    assert!(ctx.async_events(Duration::from_millis(100)).next().is_none());

    let _restore = Restore(&ctx, netdev, topo.port);
    link(netdev, "down");
    // No deadline: `Duration::MAX` waits until the event comes (it used to overflow and panic).
    assert_eq!(ctx.next_async_event(Duration::MAX).unwrap(), AsyncEvent::PortError { port: topo.port });
    assert_ne!(ctx.query_port(topo.port).unwrap().state, PortState::Active);
    link(netdev, "up");
    let mut seen = Vec::new();
    for ev in ctx.async_events(Duration::from_secs(5)) {
        let ev = ev.unwrap();
        seen.push(ev);
        if ev == (AsyncEvent::PortActive { port: topo.port }) {
            break;
        }
    }
    assert_eq!(seen.last(), Some(&AsyncEvent::PortActive { port: topo.port }), "events after link up: {seen:?}");
}
