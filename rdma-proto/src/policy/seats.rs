//! The receiver's session seats (the driver's `ReceiveOptions::max_sessions`): which sessions
//! hold one, and which slow session gives its seat to a sender that asks for one when they are
//! all taken. No I/O: the times are given, and a displaced session is woken through a
//! [`Signal`] its driver chose.
//!
//! The rules.
//! - A session takes a seat once its HELLO was taken (and its secret proved), and gives it
//!   back when its ring is freed, so that the seats' memory shares never overlap.
//! - When every seat is taken, a new session displaces the session that progresses slowest,
//!   if that one runs below half a fair share: the receiver's aggregate rate over its seats,
//!   the aggregate being the larger of the recent one, the highest seen within
//!   [`PEAK_HOLD`], and `floor` per seat (so that sessions that all trickle from the start
//!   count as slow). A session's rate is measured over its last one to two [`WINDOW`]s;
//!   one whose data phase is younger than [`GRACE`] is not displaced (nor measured).
//! - Authenticated sessions are preferred: an unauthenticated newcomer never displaces an
//!   authenticated session, and an authenticated newcomer displaces an unauthenticated one
//!   before any authenticated one.
//! - The displaced session is told to end ([`Seat::displaced`], its signal rung): it answers
//!   `Busy` with a hint and keeps its partial, which its sender resumes later. Its seat passes
//!   to the newcomer ([`Ticket::claim`]) only once it is given back, so that the seats' memory
//!   stays within the budget; meanwhile no one else can take it.
//! - Otherwise the newcomer hears `Busy`, with [`BUSY_HINT`] as the time to ask again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::Signal;

/// A session's rate is measured over the last one to two windows of its data phase.
pub const WINDOW: Duration = Duration::from_secs(1);

/// How long a session's data phase runs before it may be displaced: long enough to be
/// measured, and to store its first chunks after a resume's hash.
pub const GRACE: Duration = Duration::from_secs(2);

/// How long the highest aggregate rate seen stands for the receiver's capacity: sessions
/// that all slowed down (trickling peers that took every seat) still count as slow against it.
pub const PEAK_HOLD: Duration = Duration::from_secs(30);

/// The hint of a `Busy` heard because every seat (or connection place) is taken by sessions
/// that may not be displaced: about how long a small transfer takes.
pub const BUSY_HINT: Duration = crate::receiver::BUSY_RETRY_AFTER;

/// The hint of a displaced session's `Busy`: it comes back once the newcomer had its time.
pub const DISPLACED_HINT: Duration = Duration::from_secs(3);

/// How long a newcomer waits for the seat of the session displaced for it: that session's
/// teardown waits at most [`DISPLACED_TEARDOWN`] for its peer, then destroys its queue pair
/// and deregisters its ring, which a loaded device can take seconds over. Waiting longer beats
/// hearing `Busy` and displacing another session when it comes back.
pub const HEIR_WAIT: Duration = Duration::from_secs(10);

/// How long a displaced session's teardown waits for its sender to take the `Busy` and
/// disconnect.
pub const DISPLACED_TEARDOWN: Duration = Duration::from_secs(2);

/// The rate per seat, as a multiple of `min_rate`, that the receiver's capacity is at least
/// taken to be when it judges which session is slow: at the default floor of 16 KiB/s, a
/// session below 512 KiB/s gives its seat to a newer one when every seat is taken by such
/// sessions, whatever they bring together.
pub const FLOOR_FACTOR: u64 = 64;

/// The rate per seat the receiver's capacity is at least taken to be, for a pace floor of
/// `min_rate` bytes per second ([`Seats::new`]'s `floor`).
pub fn floor(min_rate: u64) -> u64 {
    min_rate.saturating_mul(FLOOR_FACTOR)
}

/// Every seat of one server; `B` wakes a displaced session and a newcomer waiting for its seat.
#[derive(Debug)]
pub struct Seats<B> {
    limit: usize,
    /// Bytes per second per seat the aggregate is at least taken to be.
    floor: u64,
    inner: Mutex<Inner<B>>,
}

#[derive(Debug)]
struct Inner<B> {
    next: u64,
    held: Vec<Held<B>>,
    /// The highest aggregate rate seen, and when.
    peak: Option<(Instant, u64)>,
}

/// One seat taken.
#[derive(Debug)]
struct Held<B> {
    id: u64,
    authenticated: bool,
    /// When its data phase began ([`Seat::started`]); `None` before.
    start: Option<Instant>,
    bytes: u64,
    /// Two marks of (time, bytes), the newer last: the rate is measured from one of them.
    marks: [(Instant, u64); 2],
    /// Told to give its seat to `heir`.
    displaced: bool,
    /// The newcomer its seat passes to, the signal that tells it, and when it was displaced
    /// for it.
    heir: Option<(u64, Arc<B>, Instant)>,
    /// Rung when displaced.
    bell: Arc<B>,
    /// Set when displaced: what the session looks at each round, without the lock.
    told: Arc<AtomicBool>,
}

impl<B: Signal> Held<B> {
    fn new(id: u64, authenticated: bool, now: Instant) -> Self {
        let (bell, told) = (Arc::new(B::new()), Arc::new(AtomicBool::new(false)));
        Held {
            id,
            authenticated,
            start: None,
            bytes: 0,
            marks: [(now, 0); 2],
            displaced: false,
            heir: None,
            bell,
            told,
        }
    }

    /// Its rate in bytes per second at `now`, once its data phase ran [`GRACE`].
    fn rate(&self, now: Instant) -> Option<u64> {
        let start = self.start?;
        if now.saturating_duration_since(start) < GRACE {
            return None;
        }
        let newer = self.marks[1];
        let (at, bytes) = if now.saturating_duration_since(newer.0) >= WINDOW { newer } else { self.marks[0] };
        let over = now.saturating_duration_since(at).as_secs_f64().max(1e-3);
        Some((self.bytes.saturating_sub(bytes) as f64 / over) as u64)
    }
}

impl<B> Default for Inner<B> {
    fn default() -> Self {
        Inner { next: 0, held: Vec::new(), peak: None }
    }
}

/// What a session asking for a seat gets.
#[derive(Debug)]
pub enum Taken<B: Signal> {
    /// A seat.
    Seat(Seat<B>),
    /// The seat of a session displaced for it, once that one gives it back.
    Wait(Ticket<B>),
    /// None: `Busy`, to ask again after [`BUSY_HINT`].
    Busy,
}

/// A session's seat, given back when dropped (a panicking session's too).
#[derive(Debug)]
pub struct Seat<B: Signal> {
    seats: Arc<Seats<B>>,
    id: u64,
    bell: Arc<B>,
    told: Arc<AtomicBool>,
}

/// A newcomer's claim on the seat of a session displaced for it.
#[derive(Debug)]
pub struct Ticket<B: Signal> {
    seats: Arc<Seats<B>>,
    id: u64,
    /// Rung when the seat is handed over.
    bell: Arc<B>,
    claimed: bool,
}

impl<B: Signal> Seats<B> {
    /// `limit` seats; sessions are taken to run at `floor` bytes per second each at least when
    /// judging who is slow (0: only the rates seen count).
    pub fn new(limit: usize, floor: u64) -> Self {
        Seats { limit, floor, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<B>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A seat for a session at `now`, `authenticated` when its sender proved the secret.
    pub fn take(self: &Arc<Self>, now: Instant, authenticated: bool) -> Taken<B> {
        let mut inner = self.lock();
        inner.next += 1;
        let id = inner.next;
        if inner.held.len() < self.limit {
            let held = Held::<B>::new(id, authenticated, now);
            let (bell, told) = (held.bell.clone(), held.told.clone());
            inner.held.push(held);
            return Taken::Seat(Seat { seats: self.clone(), id, bell, told });
        }
        let Some(at) = self.victim(&mut inner, now, authenticated) else { return Taken::Busy };
        let bell = Arc::new(B::new());
        let victim = &mut inner.held[at];
        victim.displaced = true;
        victim.heir = Some((id, bell.clone(), now));
        victim.told.store(true, Ordering::Release);
        victim.bell.ring();
        log!(
            info,
            rate = victim.rate(now),
            authenticated = victim.authenticated,
            "a slow session gives its seat to a new one"
        );
        Taken::Wait(Ticket { seats: self.clone(), id, bell, claimed: false })
    }

    /// Which session a newcomer displaces (an index into `held`), by the module's rules.
    fn victim(&self, inner: &mut Inner<B>, now: Instant, authenticated: bool) -> Option<usize> {
        let rates: Vec<(usize, u64)> = (inner.held.iter().enumerate())
            .filter(|(_, h)| !h.displaced)
            .filter_map(|(at, h)| h.rate(now).map(|r| (at, r)))
            .collect();
        let aggregate: u64 = rates.iter().map(|&(_, r)| r).sum();
        let peak = match inner.peak {
            Some((at, p)) if p >= aggregate && now.saturating_duration_since(at) < PEAK_HOLD => p,
            _ => {
                inner.peak = Some((now, aggregate));
                aggregate
            }
        };
        let limit = self.limit.max(1) as u64;
        let reference = aggregate.max(peak).max(self.floor.saturating_mul(limit));
        let below = reference / limit / 2;
        rates
            .into_iter()
            .filter(|&(at, r)| r < below && (authenticated || !inner.held[at].authenticated))
            .min_by_key(|&(at, r)| (inner.held[at].authenticated, r))
            .map(|(at, _)| at)
    }

    /// Gives back the seat `id`: it passes to its heir, if it has one. The heir's rate counts
    /// from its own start ([`Seat::started`]), so the time it is seated at is only a mark.
    fn give_back(&self, id: u64) {
        let mut inner = self.lock();
        let Some(at) = inner.held.iter().position(|h| h.id == id) else { return };
        let old = inner.held.swap_remove(at);
        if let Some((heir, bell, at)) = old.heir {
            inner.held.push(Held::new(heir, false, at));
            bell.ring();
        }
    }
}

impl<B: Signal> Seat<B> {
    /// The session's data phase began at `now` (its GRANT): its rate counts from here.
    pub fn started(&self, now: Instant) {
        self.with(|h| {
            h.start = Some(now);
            h.marks = [(now, h.bytes); 2];
        });
    }

    /// The session brought `bytes` more by `now`.
    pub fn progress(&self, bytes: u64, now: Instant) {
        self.with(|h| {
            h.bytes = h.bytes.saturating_add(bytes);
            if now.saturating_duration_since(h.marks[1].0) >= WINDOW {
                h.marks = [h.marks[1], (now, h.bytes)];
            }
        });
    }

    /// Whether the session was told to give its seat to a newer one.
    pub fn displaced(&self) -> bool {
        self.told.load(Ordering::Acquire)
    }

    /// The signal rung when the session is displaced.
    pub fn signal(&self) -> &B {
        &self.bell
    }

    fn with(&self, f: impl FnOnce(&mut Held<B>)) {
        if let Some(h) = self.seats.lock().held.iter_mut().find(|h| h.id == self.id) {
            f(h);
        }
    }
}

impl<B: Signal> Drop for Seat<B> {
    fn drop(&mut self) {
        self.seats.give_back(self.id);
    }
}

impl<B: Signal> Ticket<B> {
    /// The seat, once the displaced session gave it back; the ticket is used up then.
    pub fn claim(&mut self, authenticated: bool) -> Option<Seat<B>> {
        if self.claimed {
            return None;
        }
        let mut inner = self.seats.lock();
        let h = inner.held.iter_mut().find(|h| h.id == self.id)?;
        h.authenticated = authenticated;
        let (bell, told) = (h.bell.clone(), h.told.clone());
        self.claimed = true;
        Some(Seat { seats: self.seats.clone(), id: self.id, bell, told })
    }

    /// The signal rung when the seat is handed over.
    pub fn signal(&self) -> &B {
        &self.bell
    }
}

impl<B: Signal> Drop for Ticket<B> {
    /// A newcomer that stops waiting: a seat handed to it already is given back, else the
    /// displaced session's seat is freed when it ends.
    fn drop(&mut self) {
        if self.claimed {
            return;
        }
        let mut inner = self.seats.lock();
        if let Some(at) = inner.held.iter().position(|h| h.id == self.id) {
            inner.held.swap_remove(at);
            return;
        }
        for h in &mut inner.held {
            if h.heir.as_ref().is_some_and(|(heir, _, _)| *heir == self.id) {
                h.heir = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn seat(t: Taken<()>) -> Seat<()> {
        match t {
            Taken::Seat(s) => s,
            other => panic!("a seat, not {other:?}"),
        }
    }

    /// `n` seats started at `t0`, each bringing `rate` bytes per second until `t0 + secs`.
    fn running(seats: &Arc<Seats<()>>, t0: Instant, rates: &[u64], secs: u64, auth: bool) -> Vec<Seat<()>> {
        let held: Vec<Seat<()>> = rates.iter().map(|_| seat(seats.take(t0, auth))).collect();
        for s in &held {
            s.started(t0);
        }
        for tick in 1..=secs * 10 {
            let now = t0 + Duration::from_millis(100 * tick);
            for (s, r) in held.iter().zip(rates) {
                s.progress(r / 10, now);
            }
        }
        held
    }

    #[test]
    fn a_full_receiver_without_a_slow_session_says_busy_with_a_hint() {
        let seats = Arc::new(Seats::<()>::new(2, 0));
        let t0 = Instant::now();
        let held = running(&seats, t0, &[10 * MB, 10 * MB], 5, false);
        let now = t0 + Duration::from_secs(5);
        assert!(matches!(seats.take(now, false), Taken::Busy));
        // Young sessions are not displaced, however slow: they are not measured yet.
        let young = Arc::new(Seats::<()>::new(1, 0));
        let s = seat(young.take(t0, false));
        s.started(t0);
        assert!(matches!(young.take(t0 + Duration::from_secs(1), false), Taken::Busy));
        drop(held);
        assert!(matches!(seats.take(now, false), Taken::Seat(_)), "a seat given back is free");
    }

    /// Seats all taken by tricklers from the start: the floor per seat stands for the
    /// receiver's capacity, so they count as slow, and the slowest gives way.
    #[test]
    fn tricklers_that_took_every_seat_give_way_to_a_newcomer_slowest_first() {
        let seats = Arc::new(Seats::<()>::new(4, MB));
        let t0 = Instant::now();
        let held = running(&seats, t0, &[90_000, 80_000, 95_000, 90_000], 5, true);
        let now = t0 + Duration::from_secs(5);
        let Taken::Wait(mut ticket) = seats.take(now, true) else { panic!("a trickler gives way") };
        let displaced: Vec<bool> = held.iter().map(Seat::displaced).collect();
        assert_eq!(displaced, [false, true, false, false], "the slowest, 80 kB/s");
        assert!(ticket.claim(true).is_none(), "not before it gave its seat back");
        // Meanwhile no one else gets a seat: the next newcomer displaces the next slowest.
        let Taken::Wait(_other) = seats.take(now, true) else { panic!() };
        assert!(held[0].displaced() || held[3].displaced());
        let mut held = held.into_iter();
        let (_a, b) = (held.next(), held.next());
        drop(b);
        let mine = ticket.claim(true).expect("the displaced session's seat");
        assert!(!mine.displaced());
        assert_eq!(seats.lock().held.len(), 4, "never more seats than the limit");
    }

    /// Sessions at a fair share keep their seats; one far below it gives way.
    #[test]
    fn only_a_session_below_half_a_fair_share_gives_way() {
        let seats = Arc::new(Seats::<()>::new(4, 0));
        let t0 = Instant::now();
        let even = running(&seats, t0, &[10 * MB, 8 * MB, 9 * MB, 6 * MB], 5, false);
        assert!(matches!(seats.take(t0 + Duration::from_secs(5), false), Taken::Busy), "6 MB/s is no laggard");
        drop(even);
        let t1 = t0 + Duration::from_secs(10);
        let held = running(&seats, t1, &[10 * MB, 10 * MB, MB, 10 * MB], 5, false);
        let Taken::Wait(_) = seats.take(t1 + Duration::from_secs(5), false) else { panic!() };
        assert!(held[2].displaced() && !held[0].displaced());
    }

    /// A session that slowed down is measured over its recent windows, not its whole life.
    #[test]
    fn a_session_that_slowed_down_is_measured_by_its_recent_rate() {
        let seats = Arc::new(Seats::<()>::new(2, 0));
        let t0 = Instant::now();
        let held = running(&seats, t0, &[10 * MB, 10 * MB], 10, false);
        // Then the second trickles for 5 s, the first keeps its pace.
        for tick in 1..=50 {
            let now = t0 + Duration::from_secs(10) + Duration::from_millis(100 * tick);
            held[0].progress(MB, now);
            held[1].progress(1000, now);
        }
        let Taken::Wait(_) = seats.take(t0 + Duration::from_secs(15), false) else { panic!() };
        assert!(held[1].displaced() && !held[0].displaced());
    }

    /// Authenticated senders are preferred: an unauthenticated newcomer displaces none of
    /// them, and an authenticated one displaces an unauthenticated session first.
    #[test]
    fn unauthenticated_sessions_give_way_first_and_never_take_an_authenticated_seat() {
        let seats = Arc::new(Seats::<()>::new(2, MB));
        let t0 = Instant::now();
        let authed = running(&seats, t0, &[1000], 5, true);
        let open = running(&seats, t0, &[50_000], 5, false);
        let now = t0 + Duration::from_secs(5);
        let Taken::Wait(ticket) = seats.take(now, false) else { panic!() };
        assert!(open[0].displaced() && !authed[0].displaced(), "the unauthenticated one, though faster");
        drop(ticket);
        assert!(matches!(seats.take(now, false), Taken::Busy), "an authenticated seat is not for it");
        let Taken::Wait(_) = seats.take(now, true) else { panic!() };
        assert!(authed[0].displaced());
    }

    /// A newcomer that stops waiting leaves no seat held: the displaced session's seat is free
    /// once it ends, or given back if it was handed over already.
    #[test]
    fn a_ticket_dropped_unclaimed_leaves_the_seat_free() {
        let seats = Arc::new(Seats::<()>::new(1, MB));
        let t0 = Instant::now();
        let held = running(&seats, t0, &[1000], 5, false);
        let now = t0 + Duration::from_secs(5);
        let Taken::Wait(ticket) = seats.take(now, false) else { panic!() };
        drop(ticket);
        drop(held);
        assert!(matches!(seats.take(now, false), Taken::Seat(_)));
        let held = running(&seats, t0 + Duration::from_secs(10), &[1000], 5, false);
        let Taken::Wait(ticket) = seats.take(t0 + Duration::from_secs(15), false) else { panic!() };
        drop(held);
        drop(ticket);
        assert!(seats.lock().held.is_empty());
    }
}
