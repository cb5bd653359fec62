//! Which partials a receiver keeps for resumes, and which it gives up: at most `max_partials`
//! of them and `max_partial_bytes` together (the driver's `ReceiveOptions`), the oldest given
//! up first; one larger than the byte cap alone is not kept. Free space is a limit too
//! ([`Reserve`]): a partial is kept only while its file system keeps its reserve free, the
//! oldest partials (those of senders that did not prove the secret first) given up to keep it,
//! and a transfer that opens gives up partials until its file fits beside the reserve, so
//! that it is never refused for space that abandoned partials hold. Without a secret, one
//! address's partials hold at most `max_partial_bytes_per_address` together: keeping one more
//! gives up that address's oldest. A partial expires `partial_ttl` after it was last written
//! ([`expired`]); a partial that [`FRUITLESS_RESUMES`] resumes in a row add nothing to is
//! given up ([`Fruitless`]).
//!
//! No I/O: the driver's ledger holds the list, says which partials are still on disk, how much
//! space is free and what time it is, and removes what these rules give up.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A directory's identity: its device and inode.
pub type DirId = (u64, u64);

/// How often one directory's expired partials are looked for: a sweep reads the whole
/// directory, and a batch of N files into one directory, each with its resume key, would
/// otherwise sweep it N times (N² entries read).
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Resumes in a row that add nothing to a partial before it is given up: each costs the
/// receiver a hash of the partial, up to a third of its `timeout`, for about a kilobyte from
/// the peer, and a peer could offer the same resume and leave, over and over.
pub const FRUITLESS_RESUMES: u32 = 3;

/// Whether a partial last written `age` ago has expired, with a time to live of `ttl`.
pub fn expired(age: Duration, ttl: Duration) -> bool {
    age > ttl
}

/// Whose a partial is: the address of a sender that did not prove the secret (counted against
/// its address's cap), or one that did. Partials found when the receiver starts are nobody's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    /// The sender's address, when it proved no secret.
    pub peer: Option<IpAddr>,
    /// Whether it proved the secret: its partials are given up last.
    pub authenticated: bool,
}

/// The free space a receiver keeps on the file system of its destination: `percent` of it, or
/// `bytes` if that is more, but never more than a fifth of it (so that a small file system
/// still keeps partials).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    /// The bytes kept free, at most a fifth of the file system.
    pub bytes: u64,
    /// The share of the file system kept free, in percent.
    pub percent: u8,
}

impl Reserve {
    /// None: free space is no limit.
    pub const NONE: Reserve = Reserve { bytes: 0, percent: 0 };

    /// The reserve on a file system of `total` bytes.
    pub fn of(&self, total: u64) -> u64 {
        let share = (u128::from(total) * u128::from(self.percent.min(100)) / 100) as u64;
        share.max(self.bytes.min(total / 5))
    }
}

/// A partial the receiver keeps, in the driver's list (oldest first): `dir` is the driver's
/// handle of its directory.
#[derive(Debug, Clone)]
pub struct Kept<D> {
    /// The directory's handle.
    pub dir: D,
    /// The directory's identity.
    pub at: DirId,
    /// The partial's resume key.
    pub key: u64,
    /// What it takes on disk.
    pub bytes: u64,
    /// Whose it is.
    pub owner: Owner,
}

/// The caps on the partials kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Partials kept at most.
    pub count: usize,
    /// Bytes they hold together at most.
    pub bytes: u64,
    /// Bytes one address's partials hold at most (senders that proved no secret).
    pub per_address: u64,
}

impl Caps {
    /// Whether a partial of `bytes` may be kept at all.
    pub fn fits_alone(&self, bytes: u64) -> bool {
        bytes <= self.bytes && self.count > 0
    }

    /// Whether a partial of `bytes` of `owner` fits its address's cap alone.
    pub fn fits_address(&self, owner: Owner, bytes: u64) -> bool {
        owner.peer.is_none() || bytes <= self.per_address
    }

    /// Takes the oldest partials out of `kept` until one more of `bytes` fits both caps, and
    /// returns them, for the driver to remove.
    pub fn make_room<D>(&self, kept: &mut VecDeque<Kept<D>>, bytes: u64) -> Vec<Kept<D>> {
        let over = |kept: &VecDeque<Kept<D>>| {
            let total: u64 = kept.iter().map(|k| k.bytes).sum();
            kept.len() >= self.count || total.saturating_add(bytes) > self.bytes
        };
        let mut given_up = Vec::new();
        while over(kept) {
            let Some(oldest) = kept.pop_front() else { break };
            given_up.push(oldest);
        }
        given_up
    }

    /// Takes `owner`'s oldest partials out of `kept` until one more of `bytes` fits its
    /// address's cap (only for a sender that proved no secret), and returns them.
    pub fn make_room_of<D>(&self, kept: &mut VecDeque<Kept<D>>, owner: Owner, bytes: u64) -> Vec<Kept<D>> {
        let Some(peer) = owner.peer else { return Vec::new() };
        let mut given_up = Vec::new();
        loop {
            let held: u64 = kept.iter().filter(|k| k.owner.peer == Some(peer)).map(|k| k.bytes).sum();
            if held.saturating_add(bytes) <= self.per_address {
                break;
            }
            let Some(at) = kept.iter().position(|k| k.owner.peer == Some(peer)) else { break };
            given_up.extend(kept.remove(at));
        }
        given_up
    }
}

/// Takes out of `kept` the partials on device `dev` to give up for `short` bytes of free
/// space, in order: those of senders that proved no secret first, each group oldest first;
/// never `except` (a directory and key). Returns them, fewer when all of them free less.
pub fn make_space<D>(kept: &mut VecDeque<Kept<D>>, dev: u64, short: u64, except: Option<(DirId, u64)>) -> Vec<Kept<D>> {
    let mut order: Vec<usize> =
        (0..kept.len()).filter(|&i| kept[i].at.0 == dev && except != Some((kept[i].at, kept[i].key))).collect();
    order.sort_by_key(|&i| (kept[i].owner.authenticated, i));
    let (mut take, mut freed) = (Vec::new(), 0u64);
    for i in order {
        if freed >= short {
            break;
        }
        freed = freed.saturating_add(kept[i].bytes);
        take.push(i);
    }
    take.sort_unstable_by(|a, b| b.cmp(a));
    take.into_iter().filter_map(|i| kept.remove(i)).collect()
}

/// The bytes that the partials `given_up` free on device `dev`.
pub fn freed_on<D>(given_up: &[Kept<D>], dev: u64) -> u64 {
    given_up.iter().filter(|k| k.at.0 == dev).map(|k| k.bytes).sum()
}

/// When each directory was last swept for expired partials.
#[derive(Debug, Default)]
pub struct Sweeps(HashMap<DirId, Instant>);

impl Sweeps {
    /// Whether the directory `at` is due a sweep at `now` (at most once per [`SWEEP_EVERY`]);
    /// `true` marks it swept then. Directories swept long ago are forgotten: their next open
    /// sweeps them anyway. Still full (a batch spreading partials over thousands of new
    /// directories within `SWEEP_EVERY`), all are: a sweep more each, rather than a scan of
    /// them all on every open.
    pub fn due(&mut self, at: DirId, now: Instant) -> bool {
        let swept = &mut self.0;
        if swept.get(&at).is_some_and(|last| now.saturating_duration_since(*last) < SWEEP_EVERY) {
            return false;
        }
        if swept.len() >= 4096 {
            swept.retain(|_, last| now.saturating_duration_since(*last) < SWEEP_EVERY);
            if swept.len() >= 2048 {
                swept.clear();
            }
        }
        swept.insert(at, now);
        true
    }
}

/// Resumes in a row that added nothing, by partial.
#[derive(Debug, Default)]
pub struct Fruitless(HashMap<(DirId, u64), u32>);

impl Fruitless {
    /// Counts a session of the partial `key` in `at` that `added` nothing, or clears the count
    /// of one that did; whether it was the [`FRUITLESS_RESUMES`]th in a row (the count starts
    /// again then). Counts of partials long gone are forgotten, past 4096 partials counted.
    pub fn count(&mut self, at: DirId, key: u64, added: bool) -> bool {
        let counts = &mut self.0;
        if added {
            counts.remove(&(at, key));
            return false;
        }
        if counts.len() >= 4096 {
            counts.clear();
        }
        let n = counts.entry((at, key)).or_insert(0);
        *n += 1;
        if *n < FRUITLESS_RESUMES {
            return false;
        }
        counts.remove(&(at, key));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: DirId = (1, 2);

    fn kept(key: u64, bytes: u64, owner: Owner) -> Kept<()> {
        Kept { dir: (), at: AT, key, bytes, owner }
    }

    fn keys(g: &[Kept<()>]) -> Vec<u64> {
        let mut k: Vec<u64> = g.iter().map(|k| k.key).collect();
        k.sort();
        k
    }

    fn peer(n: u8) -> Owner {
        Owner { peer: Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, n))), authenticated: false }
    }

    #[test]
    fn the_reserve_is_the_larger_share_with_its_bytes_at_most_a_fifth() {
        assert_eq!(Reserve { bytes: 1 << 30, percent: 5 }.of(100 << 30), 5 << 30);
        assert_eq!(Reserve { bytes: 1 << 30, percent: 5 }.of(10 << 30), 1 << 30);
        assert_eq!(Reserve { bytes: 1 << 30, percent: 5 }.of(1 << 30), (1 << 30) / 5);
        assert_eq!(Reserve { bytes: 0, percent: 200 }.of(1 << 30), 1 << 30, "at most the whole");
        assert_eq!(Reserve::NONE.of(1 << 40), 0);
    }

    #[test]
    fn partials_past_either_cap_give_up_the_oldest() {
        let caps = Caps { count: 2, bytes: 100, per_address: u64::MAX };
        let mut list: VecDeque<Kept<()>> = [kept(1, 40, Owner::default()), kept(2, 40, Owner::default())].into();
        assert_eq!(keys(&caps.make_room(&mut list, 10)), [1], "a third past the count of 2");
        list.push_back(kept(3, 10, Owner::default()));
        assert_eq!(keys(&caps.make_room(&mut list, 70)), [2], "70 more bytes past 100: only as many as needed");
        assert_eq!(keys(&caps.make_room(&mut list, 100)), [3], "100 more: all of them");
        assert!(list.is_empty());
        assert!(caps.fits_alone(100) && !caps.fits_alone(101), "one over the byte cap alone is not kept");
        assert!(!Caps { count: 0, ..caps }.fits_alone(1), "a cap of 0 keeps none");
    }

    #[test]
    fn one_address_past_its_cap_gives_up_its_own_oldest_partials() {
        let caps = Caps { count: 8, bytes: 1 << 20, per_address: 100 };
        let mut list: VecDeque<Kept<()>> = [kept(1, 40, peer(1)), kept(2, 40, peer(2)), kept(3, 40, peer(1))].into();
        assert_eq!(keys(&caps.make_room_of(&mut list, peer(1), 40)), [1], "peer 1's oldest, not peer 2's");
        assert!(caps.make_room_of(&mut list, peer(2), 60).is_empty());
        assert!(!caps.fits_address(peer(2), 101), "one over the cap alone is not kept");
        let authenticated = Owner { peer: None, authenticated: true };
        assert!(caps.fits_address(authenticated, 101) && caps.make_room_of(&mut list, authenticated, 101).is_empty());
    }

    /// Partials give up their space oldest first, those of senders that proved no secret
    /// before the others, only those on the file system short of space, never the one a
    /// transfer resumes.
    #[test]
    fn space_is_made_from_unauthenticated_partials_first_oldest_first() {
        let on = |key: u64, authenticated: bool, dev: u64| Kept {
            dir: (),
            at: (dev, AT.1),
            key,
            bytes: 40,
            owner: Owner { peer: None, authenticated },
        };
        let dev = AT.0;
        let mut list: VecDeque<Kept<()>> =
            [on(1, true, dev), on(2, false, dev), on(3, false, dev + 1), on(4, false, dev), on(5, false, dev)].into();
        let got = make_space(&mut list, dev, 50, None);
        assert_eq!((keys(&got), freed_on(&got, dev)), (vec![2, 4], 80), "the two oldest unauthenticated");
        assert_eq!(keys(&make_space(&mut list, dev, 50, Some((AT, 5)))), [1], "then the authenticated; 5 is resumed");
        assert_eq!(keys(&make_space(&mut list, dev, 500, None)), [5], "all there is; 3 is on another device");
        assert_eq!(keys(&list.into_iter().collect::<Vec<_>>()), [3]);
    }

    #[test]
    fn a_directory_is_swept_at_most_once_per_sweep_every() {
        let (mut sweeps, t0) = (Sweeps::default(), Instant::now());
        assert!(sweeps.due(AT, t0));
        assert!(!sweeps.due(AT, t0 + SWEEP_EVERY / 2), "swept a moment ago");
        assert!(sweeps.due((1, 3), t0), "another directory has its own time");
        assert!(sweeps.due(AT, t0 + SWEEP_EVERY));
        // Thousands of directories swept within the minute: the table stays bounded.
        for ino in 0..10_000 {
            sweeps.due((9, ino), t0);
        }
        assert!(sweeps.0.len() <= 4096);
    }

    #[test]
    fn the_third_resume_in_a_row_that_adds_nothing_gives_a_partial_up() {
        let mut f = Fruitless::default();
        let runs: Vec<bool> =
            [true, false, false, true, false, false, false].iter().map(|&a| f.count(AT, 1, a)).collect();
        assert_eq!(runs, [false, false, false, false, false, false, true]);
        assert!(!f.count(AT, 1, false), "the count starts again");
        assert!(!f.count(AT, 2, false) && !f.count(AT, 2, false) && f.count(AT, 2, false), "each partial its own");
    }

    #[test]
    fn a_partial_expires_only_past_its_time_to_live() {
        let ttl = Duration::from_secs(86_400);
        assert!(!expired(ttl, ttl) && expired(ttl + Duration::from_secs(1), ttl));
    }
}
