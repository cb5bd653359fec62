//! Device tests: a connection error names the addresses involved and the side at fault. A
//! resolution whose source port is in use blames the source, not the destination; a listener
//! bound to an address of another host names that address.

mod common;

use std::net::SocketAddr;

use common::*;
use rdma_cm::{CmId, Listener};

#[test]
fn a_source_port_in_use_is_the_source_s_fault_and_both_addresses_are_named() {
    let topo = testkit::require_topology!();
    // The client's address and a port a listener holds there.
    let held = Listener::bind(client_src(&topo), 1).unwrap();
    let src = held.local_addr();
    let dst = SocketAddr::new(topo.server.addr.into(), 7471);
    let err = CmId::new().unwrap().resolve_addr(Some(src), dst).wait(T).unwrap_err();
    let text = err.to_string();
    eprintln!("{err:?}: {text}");
    assert_eq!(err.errno(), Some(libc::EADDRINUSE), "{err:?}");
    assert!(text.contains(&src.to_string()) && text.contains(&dst.to_string()), "{text}");
    assert!(text.contains("source"), "the source is at fault, not the destination: {text}");
}

#[test]
fn a_listener_on_another_host_s_address_names_it() {
    let _topo = testkit::require_topology!();
    // TEST-NET-1 (RFC 5737): no address of this host.
    let foreign: SocketAddr = "192.0.2.1:7471".parse().unwrap();
    let err = Listener::bind(foreign, 1).unwrap_err();
    let text = err.to_string();
    eprintln!("{err:?}: {text}");
    assert_eq!(err.errno(), Some(libc::EADDRNOTAVAIL), "{err:?}");
    assert!(text.contains("192.0.2.1:7471"), "the address is named: {text}");
    assert!(text.contains("not an address of this host"), "{text}");
}
