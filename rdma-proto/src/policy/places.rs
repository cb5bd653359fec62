//! The receiver's connection places: how many connections it serves at once, how many one
//! address may hold, and who gives way when they are all taken. No I/O: the times are given,
//! and a displaced connection is woken through a [`Signal`] its driver chose.
//!
//! The rules.
//! - A connection that has not proved itself (no HELLO yet, or a secret not yet proved) holds
//!   its place only for `preempt_after` (the driver's `ReceiveOptions::preempt_after`) against
//!   newcomers. When every place is taken, a new connection request takes the place of such a
//!   connection past that age instead of hearing `Busy`.
//! - Fair shares: the place given up is one of the address that holds the most unproven
//!   places, never one of an address holding fewer than the newcomer's own; an address holding
//!   two more than the newcomer's gives one up at any age. So peers on a few addresses that
//!   keep every place young by opening new connections do not keep out an address holding
//!   fewer: it takes places from theirs. The price: a host that opens several connections at
//!   once may lose its youngest to a newcomer from an address holding two fewer, before they
//!   sent their HELLOs (the sender sees a lost connection; `--retries` sends again).
//! - A request that proves the secret already ([`super::knock`]) is proved from the start: it
//!   takes the place of any unproven connection, at any age, and is held back only when four
//!   times as many displaced connections as there are places are still leaving (others at
//!   twice as many): connections that prove nothing cannot take its place.
//!
//! A displaced connection ends at once, woken by its claim's signal once established, or
//! within 20 ms in its accept (`Accepting::wait_while`) while its request is not
//! completed yet, with the driver's `Error::Preempted`, and its teardown waits for nothing;
//! until then it holds its thread and queue pair. What these rules do not stop
//! ([`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)):
//! without a secret, peers on about as many addresses as there are places, each holding one,
//! or peers whose connections are sessions (they sent a HELLO: the pace floor ends a
//! trickling one after a `timeout`), or a peer on the sender's own address; with or without
//! one, a flood of connection requests that overflows the listener's backlog before they
//! reach these rules.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Signal;

/// Connections served beyond `max_sessions`: those waiting for their HELLO, or being told
/// `Busy` by ACK. Past that, a connection request takes the place of a connection that proved
/// nothing within `preempt_after`, or is rejected at once.
pub const BUSY_SLACK: usize = 4;

/// The places of a receiver that serves `max_sessions` sessions at once.
pub fn limit(max_sessions: usize) -> usize {
    max_sessions.saturating_add(BUSY_SLACK)
}

/// A claim not yet proved: the connection may be displaced.
const UNPROVEN: u8 = 0;
/// The connection proved itself (its HELLO was taken, and its secret proved): it keeps its
/// place to its end.
const PROVEN: u8 = 1;
/// The connection gave its place to a newer one, and is on its way out.
const DISPLACED: u8 = 2;
/// The connection ended.
const ENDED: u8 = 3;

/// One connection's claim on a place.
#[derive(Debug)]
struct Claim<B> {
    since: Instant,
    /// The address the request came from (for fair shares).
    from: IpAddr,
    state: AtomicU8,
    /// Rung when the connection is displaced: its session's idle wait wakes for it. Owned by
    /// the [`Place`] (a claim may stay queued after its connection ended, until the next
    /// request prunes the queue: what the signal holds, an eventfd say, must not).
    displaced: std::sync::Weak<B>,
}

/// Every connection place of one server; `B` wakes a displaced connection, and the accept
/// loop as one ends.
#[derive(Debug)]
pub struct ConnectionPlaces<B> {
    /// Places: connections served at once, displaced ones not counted.
    limit: usize,
    /// How long an unproven connection keeps its place against newcomers.
    preempt_after: Duration,
    /// Places held (by connections not displaced).
    held: AtomicUsize,
    /// Displaced connections that have not ended yet (at most `2 × limit`, or `4 × limit`
    /// for vouched requests).
    leaving: AtomicUsize,
    /// Claims that were unproven when made, oldest first (proved, displaced and ended ones
    /// are dropped as they are met). A few times `limit` at most: each holds a place.
    unproven: Mutex<VecDeque<Arc<Claim<B>>>>,
    /// Rung as each connection ends: the accept loop, asleep until a request comes, looks at
    /// who is left.
    ended: B,
}

/// A connection's place, given back when dropped (a panicking session's too).
#[derive(Debug)]
pub struct Place<B: Signal> {
    places: Arc<ConnectionPlaces<B>>,
    claim: Arc<Claim<B>>,
    /// The claim's signal ([`Claim::displaced`]), `None` for a claim that cannot be displaced.
    bell: Option<Arc<B>>,
}

impl<B: Signal> ConnectionPlaces<B> {
    /// `limit` places, an unproven connection keeping its own `preempt_after` against
    /// newcomers.
    pub fn new(limit: usize, preempt_after: Duration) -> Self {
        ConnectionPlaces {
            limit,
            preempt_after,
            held: AtomicUsize::new(0),
            leaving: AtomicUsize::new(0),
            unproven: Mutex::new(VecDeque::new()),
            ended: B::new(),
        }
    }

    /// The signal rung as each connection ends.
    pub fn ended(&self) -> &B {
        &self.ended
    }

    fn unproven(&self) -> MutexGuard<'_, VecDeque<Arc<Claim<B>>>> {
        self.unproven.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections alive: those holding a place, and those displaced and still leaving.
    pub fn alive(&self) -> usize {
        self.held.load(Ordering::Acquire) + self.leaving.load(Ordering::Acquire)
    }

    /// A place for a connection requested at `now` from `from`, `vouched` when the request
    /// proved the secret already ([`super::knock`]): a free one, else the place of an unproven
    /// connection (the victim of the module's rules, which is told to leave). `None` when there is neither, or
    /// when twice as many displaced connections as there are places are still leaving (four
    /// times for a vouched request).
    pub fn take(self: &Arc<Self>, now: Instant, from: IpAddr, vouched: bool) -> Option<Place<B>> {
        let from = host(from);
        let state = if vouched { PROVEN } else { UNPROVEN };
        // A vouched claim is never displaced: it needs no bell.
        let bell = (!vouched).then(|| Arc::new(B::new()));
        let displaced = bell.as_ref().map_or_else(std::sync::Weak::new, Arc::downgrade);
        let claim = Arc::new(Claim { since: now, from, state: AtomicU8::new(state), displaced });
        let mut unproven = self.unproven();
        unproven.retain(|c| c.state.load(Ordering::Acquire) == UNPROVEN);
        // A vouched request may find twice as many leaving as another one: it is not kept out
        // by those that other requests displaced, and there is still a bound.
        let most_leaving = self.limit.saturating_mul(if vouched { 4 } else { 2 });
        while !self.enter() {
            if self.leaving.load(Ordering::Acquire) >= most_leaving {
                return None;
            }
            let at = self.victim(&unproven, now, from, vouched)?;
            let old = unproven.remove(at).expect("an index into the queue");
            // Counted as leaving before it is marked so: its end, which may come at once,
            // takes it off again.
            self.leaving.fetch_add(1, Ordering::AcqRel);
            if old.state.compare_exchange(UNPROVEN, DISPLACED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                if let Some(bell) = old.displaced.upgrade() {
                    bell.ring();
                }
                // Its place passes to the newcomer: `held` stays as it is.
                log!(
                    info,
                    age = ?now.saturating_duration_since(old.since),
                    from = %old.from,
                    vouched,
                    "an unproven connection gives its place to a newer one"
                );
                break;
            }
            // Raced with the old connection's proof or end: no place passed. Its end may have
            // freed one; else the next unproven connection is tried.
            self.leaving.fetch_sub(1, Ordering::AcqRel);
        }
        if !vouched {
            unproven.push_back(claim.clone());
        }
        Some(Place { places: self.clone(), claim, bell })
    }

    /// Which unproven connection gives its place to a newcomer from `from` at `now` (an index
    /// into `unproven`, oldest first), by the rules of the module's docs: among those the
    /// newcomer may take, the oldest of the address holding the most. A vouched newcomer may
    /// take any; another one that of an address holding two more unproven places than its own,
    /// or one past `preempt_after` of its own address or of one holding more than its own.
    fn victim(&self, unproven: &VecDeque<Arc<Claim<B>>>, now: Instant, from: IpAddr, vouched: bool) -> Option<usize> {
        let mut held: HashMap<IpAddr, usize> = HashMap::new();
        for c in unproven {
            *held.entry(c.from).or_insert(0) += 1;
        }
        let mine = held.get(&from).copied().unwrap_or(0);
        let mut best: Option<(usize, usize)> = None;
        for (at, c) in unproven.iter().enumerate() {
            let theirs = held[&c.from];
            let old = now.saturating_duration_since(c.since) >= self.preempt_after;
            let may = vouched || theirs >= mine + 2 || (old && (c.from == from || theirs > mine));
            if may && best.map_or(true, |(most, _)| theirs > most) {
                best = Some((theirs, at));
            }
        }
        best.map(|(_, at)| at)
    }

    /// Takes a free place, if one is free.
    fn enter(&self) -> bool {
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1)).is_ok()
    }
}

impl<B: Signal> Place<B> {
    /// The connection proved itself: it keeps its place to its end. `false` if it had been
    /// displaced already.
    pub fn prove(&self) -> bool {
        match self.claim.state.compare_exchange(UNPROVEN, PROVEN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(state) => state == PROVEN,
        }
    }

    /// Whether the connection gave its place to a newer one, and must end.
    pub fn displaced(&self) -> bool {
        self.claim.state.load(Ordering::Acquire) == DISPLACED
    }

    /// The signal rung when the connection is displaced, while it may be displaced still
    /// (`None` for one proved, vouched for, displaced or ended), for its session's idle wait.
    pub fn displaceable(&self) -> Option<&B> {
        let may = self.claim.state.load(Ordering::Acquire) == UNPROVEN;
        self.bell.as_deref().filter(|_| may)
    }
}

impl<B: Signal> Drop for Place<B> {
    fn drop(&mut self) {
        if self.claim.state.swap(ENDED, Ordering::AcqRel) == DISPLACED {
            self.places.leaving.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.places.held.fetch_sub(1, Ordering::AcqRel);
        }
        self.places.ended.ring();
    }
}

/// The address a peer counts as, for the per-address rules: itself, an IPv4 address also when
/// an IPv6 listener sees it IPv4-mapped. An IPv6 address is not counted as its /64: a /64 is
/// often a whole LAN, whose honest senders would then share one address's limit. So a host with
/// many IPv6 addresses counts as many peers.
pub fn host(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Connections by address, for the driver's `ReceiveOptions::max_per_address` (displaced ones
/// still leaving are counted).
#[derive(Debug, Default)]
pub struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

impl PerAddress {
    /// Takes a place for a connection from `ip` if its host ([`host`]) holds fewer than
    /// `limit`.
    pub fn enter(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<AddressPlace> {
        let ip = host(ip);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(AddressPlace(self.clone(), ip))
    }
}

/// One connection's place among its address's, given back when dropped.
#[derive(Debug)]
pub struct AddressPlace(Arc<PerAddress>, IpAddr);

impl Drop for AddressPlace {
    fn drop(&mut self) {
        let mut map = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(1);

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, n))
    }

    fn places(limit: usize) -> Arc<ConnectionPlaces<()>> {
        Arc::new(ConnectionPlaces::new(limit, AFTER))
    }

    #[test]
    fn a_full_server_gives_the_oldest_unproven_place_to_a_newcomer_once_it_is_old_enough() {
        let p = places(3);
        let t0 = Instant::now();
        let held: Vec<Place<()>> =
            (0..3).map(|i| p.take(t0 + Duration::from_millis(i), A, false).expect("a free place")).collect();
        // Younger than `preempt_after`: nobody gives way.
        assert!(p.take(t0 + Duration::from_millis(500), A, false).is_none());
        let newcomer = p.take(t0 + AFTER, A, false).expect("the oldest unproven connection's place");
        assert!(held[0].displaced(), "the oldest gives way");
        assert!(!held[1].displaced() && !held[2].displaced() && !newcomer.displaced());
        assert_eq!((p.held.load(Ordering::Acquire), p.leaving.load(Ordering::Acquire)), (3, 1));
        // A displaced connection cannot prove itself any more; its end frees no place.
        assert!(!held[0].prove());
        let mut held = held.into_iter();
        drop(held.next());
        assert_eq!((p.held.load(Ordering::Acquire), p.leaving.load(Ordering::Acquire)), (3, 0));
        assert_eq!(p.alive(), 3);
        drop(held);
        drop(newcomer);
        assert_eq!(p.alive(), 0);
    }

    #[test]
    fn proven_connections_keep_their_places() {
        let p = places(2);
        let t0 = Instant::now();
        let a = p.take(t0, A, false).unwrap();
        let b = p.take(t0, A, false).unwrap();
        assert!(a.prove() && b.prove() && a.prove(), "proving twice is still proved");
        assert!(p.take(t0 + 10 * AFTER, A, false).is_none(), "no unproven connection to give way: Busy");
        assert!(!a.displaced() && !b.displaced());
        drop(a);
        let c = p.take(t0 + 10 * AFTER, A, false).expect("the place a proven connection gave back");
        // `a` was proved before it was met in the queue: only `c` is unproven now.
        assert!(p.take(t0 + 11 * AFTER, A, false).is_some_and(|d| !d.displaced()) && c.displaced());
        drop((b, c));
    }

    #[test]
    fn no_more_connections_leave_at_once_than_twice_the_places() {
        let p = places(2);
        let t0 = Instant::now();
        let mut all = vec![p.take(t0, A, false).unwrap(), p.take(t0, A, false).unwrap()];
        // Each newcomer, once the oldest is old enough, displaces it: four may be leaving.
        for i in 1..=4u32 {
            all.push(p.take(t0 + AFTER * 2 * i, A, false).expect("a displaced place"));
        }
        assert_eq!(p.leaving.load(Ordering::Acquire), 4);
        assert!(p.take(t0 + AFTER * 20, A, false).is_none(), "four already leaving: the request hears Busy");
        // One of them ends: a place can pass again.
        all.remove(0);
        assert!(p.take(t0 + AFTER * 20, A, false).is_some());
    }

    #[test]
    fn addresses_that_keep_opening_connections_do_not_take_the_share_of_another() {
        // 12 places held by three addresses, 4 each, all younger than `preempt_after`.
        let p = places(12);
        let t0 = Instant::now();
        let mut theirs: Vec<Place<()>> =
            (0..12).map(|i| p.take(t0 + Duration::from_millis(i), ip(i as u8 % 3), false).unwrap()).collect();
        // A fourth address gets places at once, up to its fair share...
        let mine: Vec<Place<()>> = (0..3).map(|_| p.take(t0 + AFTER / 2, A, false).expect("a fair share")).collect();
        assert!(p.take(t0 + AFTER / 2, A, false).is_none(), "past a fair share, young places stay");
        // ...and keeps them however fast the others open new connections: they take only each
        // other's places, or their own.
        for round in 0..200u32 {
            let now = t0 + AFTER + Duration::from_millis(u64::from(round) * 5);
            if let Some(place) = p.take(now, ip((round % 3) as u8), false) {
                theirs.push(place);
            }
            theirs.retain(|t| !t.displaced());
            assert!(mine.iter().all(|m| !m.displaced()), "round {round}: a fair share was taken");
        }
        assert_eq!(theirs.len() + mine.len(), 12);
        drop((theirs, mine));
        assert_eq!(p.alive(), 0);
    }

    #[test]
    fn a_vouched_request_takes_any_unproven_place_and_keeps_it() {
        let p = places(2);
        let t0 = Instant::now();
        let held: Vec<Place<()>> = (0..2).map(|n| p.take(t0, ip(n), false).unwrap()).collect();
        let vouched = p.take(t0, A, true).expect("an unproven place, however young");
        assert!(held.iter().filter(|h| h.displaced()).count() == 1 && vouched.prove());
        // Proved from the start: nobody takes its place, at any age or share.
        for n in 0..8 {
            if let Some(other) = p.take(t0 + AFTER * 10, ip(n), false) {
                assert!(!vouched.displaced());
                drop(other);
            }
        }
        assert!(!vouched.displaced());
        let vouched2 = p.take(t0, A, true).expect("the other place");
        assert!(p.take(t0, A, true).is_none(), "every place proved: Busy even for a vouched request");
        drop((held, vouched, vouched2));
        assert_eq!(p.alive(), 0);
    }

    #[test]
    fn a_vouched_request_is_not_held_back_by_the_connections_leaving() {
        let p = places(1);
        let t0 = Instant::now();
        let mut all = vec![p.take(t0, A, false).unwrap()];
        for i in 1..=2u32 {
            all.push(p.take(t0 + AFTER * 2 * i, A, false).expect("an old place of its own address"));
        }
        assert_eq!(p.leaving.load(Ordering::Acquire), 2);
        assert!(p.take(t0 + AFTER * 20, A, false).is_none(), "two leaving: Busy");
        assert!(p.take(t0 + AFTER * 20, A, true).is_some_and(|v| v.prove()), "a vouched request passes");
        drop(all);
    }

    #[test]
    fn an_ipv4_address_is_itself_however_it_is_seen_and_ipv6_addresses_are_their_own() {
        let v4: IpAddr = "10.77.0.2".parse().unwrap();
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(10, 77, 0, 2).to_ipv6_mapped());
        assert_eq!((host(v4), host(mapped)), (v4, v4));
        // So the per-address limit counts an IPv4 sender once, however the listener sees it.
        let per = Arc::new(PerAddress::default());
        let first = per.enter(v4, 1).expect("a first place");
        assert!(per.enter(mapped, 1).is_none(), "the same sender");
        // Two hosts of one IPv6 /64 (often a whole LAN) are two peers.
        let a: IpAddr = "2001:db8:1:2::a".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2::b".parse().unwrap();
        let (pa, pb) = (per.enter(a, 1), per.enter(b, 1));
        assert!(pa.is_some() && pb.is_some());
        drop((first, pa, pb));
        assert!(per.enter(mapped, 1).is_some());
    }

    #[test]
    fn places_taken_and_given_back_from_many_threads_balance() {
        let p = places(4);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for i in 0..500u32 {
                        let now = Instant::now() + AFTER * (i % 3);
                        if let Some(place) = p.take(now, ip((i % 3) as u8), i % 7 == 0) {
                            if i % 2 == 0 {
                                place.prove();
                            }
                        }
                    }
                });
            }
        });
        assert_eq!((p.held.load(Ordering::Acquire), p.leaving.load(Ordering::Acquire)), (0, 0));
        assert!(p.unproven().iter().all(|c| c.state.load(Ordering::Acquire) != UNPROVEN));
    }
}
