//! What a receiver's server and its sessions share: the routes of extra lanes, the count of
//! wrong proofs by address, the tally of one `serve` call, and what each session is handed.

use super::ReceiveOptions;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_cm::ConnectRequest;

use crate::driver::files::DirFd;
use crate::driver::flag::{Bell, Flag};
use crate::driver::partials::Ledger;
use crate::policy::places::{self, AddressPlace};
use crate::policy::{seats, Signal};
use crate::wire::{self};

/// The sessions waiting for (or served by) extra lanes, by their token.
#[derive(Default)]
pub(super) struct Routes(std::sync::Mutex<std::collections::HashMap<[u8; wire::LANE_TOKEN_LEN], Route>>);

/// Where a session's extra lanes go.
struct Route {
    session: u64,
    /// Lanes granted.
    lanes: u16,
    /// Lanes handed over so far, by number (bit `n`): each at most once.
    taken: u32,
    /// The session's side of the hand-over.
    to: std::sync::mpsc::Sender<(u16, ConnectRequest)>,
    /// Rung with each lane handed over: the session's idle wait wakes for it.
    pub(super) handed: Arc<Bell>,
}

/// Where a lane's request is handed to its session.
pub(super) type HandOver = std::sync::mpsc::Sender<(u16, ConnectRequest)>;

/// A session's registration in [`Routes`]: removed when dropped (the session ended), so that
/// a lane arriving later names no live session.
pub(super) struct RouteGuard {
    routes: Arc<Routes>,
    token: [u8; wire::LANE_TOKEN_LEN],
    /// The route's bell ([`Route::handed`]).
    pub(super) handed: Arc<Bell>,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        self.routes.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.token);
    }
}

impl Routes {
    /// Registers a session that granted `lanes` lanes with `token`; its lanes' requests come
    /// out of the returned receiver.
    pub(super) fn register(
        self: &Arc<Self>,
        session: u64,
        lanes: u16,
        token: [u8; wire::LANE_TOKEN_LEN],
    ) -> (RouteGuard, std::sync::mpsc::Receiver<(u16, ConnectRequest)>) {
        let (to, from) = std::sync::mpsc::channel();
        let handed = Arc::new(Bell::new());
        let route = Route { session, lanes, taken: 1, to, handed: handed.clone() };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(token, route);
        (RouteGuard { routes: self.clone(), token, handed }, from)
    }

    /// Where a lane's request goes (its session's side of the hand-over), the lane marked as
    /// taken: `Err` with why when its token names no live session, the session is another, or
    /// the lane is not one granted or came already.
    pub(super) fn take(&self, lane: wire::Lane, session: u64) -> Result<(HandOver, Arc<Bell>), String> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(route) = map.get_mut(&lane.token).filter(|r| r.session == session) else {
            return Err("a lane whose token names no live session".into());
        };
        let bit = 1u32.checked_shl(u32::from(lane.lane)).unwrap_or(0);
        if lane.lane == 0 || lane.lane >= route.lanes || route.taken & bit != 0 {
            return Err(format!("lane {} of {} granted, or one that came already", lane.lane, route.lanes));
        }
        route.taken |= bit;
        Ok((route.to.clone(), route.handed.clone()))
    }
}

/// Wrong proofs of the secret by address, for [`ReceiveOptions::auth_attempts`].
#[derive(Debug, Default)]
pub(super) struct Attempts(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (Instant, u32)>>);

impl Attempts {
    /// Addresses remembered at most: past it, the one with the fewest wrong proofs is forgotten.
    /// Entries are pruned only then, not on every call (review L2: wrong proofs or LANE tokens
    /// from many addresses grew the map without bound, and every call, in the accept loop for
    /// LANEs, scanned all of it).
    const MOST: usize = 4096;

    /// Counts a wrong proof from `ip`; how long its answer is held back: nothing for the first
    /// `auth_attempts` within `auth_window`, then 1 s doubling, up to the time the bucket
    /// takes to refill one (`auth_window / auth_attempts`).
    pub(super) fn wrong_proof(&self, ip: std::net::IpAddr, opts: &ReceiveOptions) -> Duration {
        let now = Instant::now();
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MOST && !map.contains_key(&ip) {
            map.retain(|_, (since, _)| now.saturating_duration_since(*since) < opts.auth_window);
            // The address with the fewest wrong proofs goes (the oldest of them), never one that
            // is held back while others have fewer.
            let least = map.iter().min_by_key(|(_, (since, n))| (*n, *since)).map(|(ip, _)| *ip);
            if let (Some(least), true) = (least, map.len() >= Self::MOST) {
                map.remove(&least);
            }
        }
        let e = map.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(e.0) >= opts.auth_window {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
        let past = e.1.saturating_sub(opts.auth_attempts);
        if past == 0 {
            return Duration::ZERO;
        }
        let most = opts.auth_window / opts.auth_attempts.max(1);
        Duration::from_secs(1u64 << (past - 1).min(16)).min(most)
    }
}

/// A connection's places: among all connections, and among its address's.
pub(super) type Places = (Place, AddressPlace);

/// What the sessions of one `serve` call tell its accept loop.
#[derive(Debug)]
pub(super) struct Tally {
    /// Transfers asked for: connections whose HELLO arrived.
    pub(super) asked: AtomicUsize,
    /// Set once the loop takes no more transfers: connections still without a HELLO end.
    pub(super) closing: Flag,
    /// Rung when a transfer is asked for: the accept loop, asleep until a request comes,
    /// looks at the count.
    pub(super) changed: Bell,
}

impl Default for Tally {
    fn default() -> Self {
        Tally { asked: AtomicUsize::new(0), closing: Flag::new(), changed: Bell::new() }
    }
}

impl Tally {
    /// Whether `sessions` transfers were asked for (never, with `None`).
    pub(super) fn enough(&self, sessions: Option<usize>) -> bool {
        sessions.is_some_and(|n| self.asked.load(Ordering::Acquire) >= n)
    }
}

/// A bell is how a decision of the core wakes a session: its idle wait sleeps on the bell's
/// eventfd.
impl Signal for Bell {
    fn new() -> Self {
        Bell::new()
    }
    fn ring(&self) {
        Bell::ring(self)
    }
}

/// The receiver's session seats, a displaced session and a newcomer woken by their bells.
pub(super) type Seats = seats::Seats<Bell>;
/// The receiver's connection places, a displaced connection and the accept loop woken by
/// their bells.
pub(super) type ConnectionPlaces = places::ConnectionPlaces<Bell>;
/// A connection's place.
pub(super) type Place = places::Place<Bell>;
/// A session's seat.
pub(super) type Seat = seats::Seat<Bell>;
/// A newcomer's claim on a displaced session's seat.
pub(super) type Ticket = seats::Ticket<Bell>;
/// What a session asking for a seat gets.
pub(super) type Taken = seats::Taken<Bell>;

/// What a server's sessions share with it: the options, the count of sessions past their
/// HELLO, the accept loop's tally, and the routes of extra lanes.
pub(super) struct Shared {
    pub(super) opts: Arc<ReceiveOptions>,
    pub(super) active: Arc<Seats>,
    pub(super) tally: Arc<Tally>,
    pub(super) routes: Arc<Routes>,
    /// The destination directory, open (`opts.dir`): every file is made relative to it.
    pub(super) dest: Option<DirFd>,
    /// Wrong proofs of the secret, by address.
    pub(super) attempts: Arc<Attempts>,
    /// The partials kept for resumes.
    pub(super) partials: Arc<Ledger>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review L2: the wrong proofs of many addresses are remembered up to a bound, while each
    /// address's own count still holds its answers back.
    #[test]
    fn wrong_proofs_from_many_addresses_are_remembered_up_to_a_bound() {
        use std::net::{IpAddr, Ipv6Addr};
        use std::time::Duration;
        let (attempts, opts) = (Attempts::default(), crate::driver::ReceiveOptions::default());
        let ip = |n: u32| IpAddr::V6(Ipv6Addr::from(u128::from(n)));
        for n in 0..Attempts::MOST as u32 + 100 {
            assert_eq!(attempts.wrong_proof(ip(n), &opts), Duration::ZERO);
        }
        assert_eq!(attempts.0.lock().unwrap().len(), Attempts::MOST);
        let me = ip(u32::MAX);
        let holds: Vec<_> = (0..opts.auth_attempts + 2).map(|_| attempts.wrong_proof(me, &opts)).collect();
        let allowed = opts.auth_attempts as usize;
        assert!(holds[..allowed].iter().all(|h| h.is_zero()), "{holds:?}");
        assert_eq!(holds[allowed..], [Duration::from_secs(1), Duration::from_secs(2)]);
        assert!(attempts.0.lock().unwrap().len() <= Attempts::MOST);
        // A flood from as many new addresses does not make it forget the one held back.
        for n in 0..Attempts::MOST as u32 {
            attempts.wrong_proof(ip(1 << 20 | n), &opts);
        }
        assert_eq!(attempts.wrong_proof(me, &opts), Duration::from_secs(4));
    }
}
