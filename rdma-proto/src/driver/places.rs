//! The receiver's connection places: how many connections it serves at once, how many one
//! address may hold, and who gives way when they are all taken.
//!
//! The rule (review finding H2): a connection that has not proved itself (no HELLO yet, or a
//! secret not yet proved) holds its place only for [`ReceiveOptions::preempt_after`]
//! against newcomers. When every place is taken, a new connection request takes the place of
//! the oldest such connection past that age instead of hearing `Busy`; the one it displaces
//! ends at its next slow check (within 20 ms once established; a connection still being
//! accepted ends when its accept does, within `hello_timeout`) with [`Error::Preempted`], and
//! its teardown waits for nothing. So connections that are opened and then hold still, from
//! however many addresses, keep a sender out for at most `preempt_after`. What this does not
//! stop: a peer that opens new connections faster than the places turn over (about
//! `max_sessions + 4` per `preempt_after`), or keeps twice as many connections leaving (each
//! accept it never completes lingers up to `hello_timeout`), still crowds others out; that
//! takes an authenticated connection request (docs/protocol.md, "Threat model").
//! A displaced connection holds its thread and queue pair until it ends; at most twice as
//! many as there are places may be on their way out at once, beyond that requests hear `Busy`.
//!
//! [`ReceiveOptions::preempt_after`]: super::ReceiveOptions::preempt_after
//! [`Error::Preempted`]: super::Error::Preempted

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
struct Claim {
    since: Instant,
    state: AtomicU8,
}

/// Every connection place of one server.
#[derive(Debug)]
pub(super) struct ConnectionPlaces {
    /// Places: connections served at once, displaced ones not counted.
    limit: usize,
    /// How long an unproven connection keeps its place against newcomers.
    preempt_after: Duration,
    /// Places held (by connections not displaced).
    held: AtomicUsize,
    /// Displaced connections that have not ended yet (at most `2 × limit`).
    leaving: AtomicUsize,
    /// Claims that were unproven when made, oldest first (proved, displaced and ended ones
    /// are dropped as they are met).
    unproven: Mutex<VecDeque<Arc<Claim>>>,
}

/// A connection's place, given back when dropped (a panicking session's too).
#[derive(Debug)]
pub(super) struct Place {
    places: Arc<ConnectionPlaces>,
    claim: Arc<Claim>,
}

impl ConnectionPlaces {
    /// `limit` places, an unproven connection keeping its own `preempt_after` against
    /// newcomers.
    pub(super) fn new(limit: usize, preempt_after: Duration) -> Self {
        ConnectionPlaces {
            limit,
            preempt_after,
            held: AtomicUsize::new(0),
            leaving: AtomicUsize::new(0),
            unproven: Mutex::new(VecDeque::new()),
        }
    }

    fn unproven(&self) -> MutexGuard<'_, VecDeque<Arc<Claim>>> {
        self.unproven.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connections alive: those holding a place, and those displaced and still leaving.
    pub(super) fn alive(&self) -> usize {
        self.held.load(Ordering::Acquire) + self.leaving.load(Ordering::Acquire)
    }

    /// A place for a connection requested at `now`: a free one, else the place of the oldest
    /// unproven connection older than `preempt_after` (which is told to leave); `None` when
    /// neither is there, or when twice as many displaced connections as there are places are
    /// still leaving.
    pub(super) fn take(self: &Arc<Self>, now: Instant) -> Option<Place> {
        let claim = Arc::new(Claim { since: now, state: AtomicU8::new(UNPROVEN) });
        let mut unproven = self.unproven();
        unproven.retain(|c| c.state.load(Ordering::Acquire) == UNPROVEN);
        if !self.enter() {
            if self.leaving.load(Ordering::Acquire) >= self.limit.saturating_mul(2) {
                return None;
            }
            let old = unproven.front().filter(|c| now.saturating_duration_since(c.since) >= self.preempt_after)?;
            // Raced with the old connection's proof or end: no place passes. Its end may have
            // freed one.
            // Counted as leaving before it is marked so: its end, which may come at once,
            // takes it off again.
            self.leaving.fetch_add(1, Ordering::AcqRel);
            if old.state.compare_exchange(UNPROVEN, DISPLACED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                // Its place passes to the newcomer: `held` stays as it is.
                tracing::info!(age = ?now.saturating_duration_since(old.since), "an unproven connection gives its place to a newer one");
                unproven.pop_front();
            } else {
                self.leaving.fetch_sub(1, Ordering::AcqRel);
                if !self.enter() {
                    return None;
                }
            }
        }
        unproven.push_back(claim.clone());
        Some(Place { places: self.clone(), claim })
    }

    /// Takes a free place, if one is free.
    fn enter(&self) -> bool {
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1)).is_ok()
    }
}

impl Place {
    /// The connection proved itself: it keeps its place to its end. `false` if it had been
    /// displaced already.
    pub(super) fn prove(&self) -> bool {
        match self.claim.state.compare_exchange(UNPROVEN, PROVEN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(state) => state == PROVEN,
        }
    }

    /// Whether the connection gave its place to a newer one, and must end.
    pub(super) fn displaced(&self) -> bool {
        self.claim.state.load(Ordering::Acquire) == DISPLACED
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.claim.state.swap(ENDED, Ordering::AcqRel) == DISPLACED {
            self.places.leaving.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.places.held.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Connections by address, for [`ReceiveOptions::max_per_address`] (displaced ones still
/// leaving are counted).
///
/// [`ReceiveOptions::max_per_address`]: super::ReceiveOptions::max_per_address
#[derive(Debug, Default)]
pub(super) struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

impl PerAddress {
    /// Takes a place for a connection from `ip` if it holds fewer than `limit`.
    pub(super) fn enter(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<AddressPlace> {
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
pub(super) struct AddressPlace(Arc<PerAddress>, IpAddr);

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

/// Counts one holder of a shared count while it lives (a panicking session still gives its
/// place back).
#[derive(Debug)]
pub(super) struct Counted(Arc<AtomicUsize>);

impl Counted {
    /// Takes a place if fewer than `limit` are taken.
    pub(super) fn enter(count: &Arc<AtomicUsize>, limit: usize) -> Option<Counted> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .ok()
            .map(|_| Counted(count.clone()))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(1);

    fn places(limit: usize) -> Arc<ConnectionPlaces> {
        Arc::new(ConnectionPlaces::new(limit, AFTER))
    }

    #[test]
    fn a_full_server_gives_the_oldest_unproven_place_to_a_newcomer_once_it_is_old_enough() {
        let p = places(3);
        let t0 = Instant::now();
        let held: Vec<Place> = (0..3).map(|i| p.take(t0 + Duration::from_millis(i)).expect("a free place")).collect();
        // Younger than `preempt_after`: nobody gives way.
        assert!(p.take(t0 + Duration::from_millis(500)).is_none());
        let newcomer = p.take(t0 + AFTER).expect("the oldest unproven connection's place");
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
        let a = p.take(t0).unwrap();
        let b = p.take(t0).unwrap();
        assert!(a.prove() && b.prove() && a.prove(), "proving twice is still proved");
        assert!(p.take(t0 + 10 * AFTER).is_none(), "no unproven connection to give way: Busy");
        assert!(!a.displaced() && !b.displaced());
        drop(a);
        let c = p.take(t0 + 10 * AFTER).expect("the place a proven connection gave back");
        // `a` was proved before it was met in the queue: only `c` is unproven now.
        assert!(p.take(t0 + 11 * AFTER).is_some_and(|d| !d.displaced()) && c.displaced());
        drop((b, c));
    }

    #[test]
    fn no_more_connections_leave_at_once_than_twice_the_places() {
        let p = places(2);
        let t0 = Instant::now();
        let mut all = vec![p.take(t0).unwrap(), p.take(t0).unwrap()];
        // Each newcomer, once the oldest is old enough, displaces it: four may be leaving.
        for i in 1..=4u32 {
            all.push(p.take(t0 + AFTER * 2 * i).expect("a displaced place"));
        }
        assert_eq!(p.leaving.load(Ordering::Acquire), 4);
        assert!(p.take(t0 + AFTER * 20).is_none(), "four already leaving: the request hears Busy");
        // One of them ends: a place can pass again.
        all.remove(0);
        assert!(p.take(t0 + AFTER * 20).is_some());
    }

    #[test]
    fn places_taken_and_given_back_from_many_threads_balance() {
        let p = places(4);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for i in 0..500u32 {
                        let now = Instant::now() + AFTER * (i % 3);
                        if let Some(place) = p.take(now) {
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
