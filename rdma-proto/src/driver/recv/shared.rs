//! What a receiver's server and its sessions share: the routes of extra lanes, the count of
//! wrong proofs by address ([`crate::policy::proofs`]), the tally of one `serve` call, and what each session is handed.

use super::ReceiveOptions;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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
pub(super) type Attempts = crate::policy::proofs::WrongProofs;

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
