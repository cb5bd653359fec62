// Service ID resolution sends to the peer's CM along the route: a UD identifier whose route is
// not resolved has no `resolve_peer`; and the kernel's CM joins groups only from a resolved (not
// route-resolved) address, so a route-resolved identifier has no `join`.
use std::net::SocketAddr;
use std::time::Duration;

use rdma_cm::{AddressResolved, RouteResolved, UdId};
use rdma_verbs::{QueuePair, ReadyToSend, Ud};

fn resolve_early(id: UdId<AddressResolved>) {
    let _peer = id.resolve_peer(b"").wait(Duration::from_secs(1));
}

fn join_late(mut id: UdId<RouteResolved>, group: SocketAddr, qp: &QueuePair<'_, Ud, ReadyToSend>) {
    let _membership = id.join(group, qp).wait(Duration::from_secs(1));
}

fn main() {}
