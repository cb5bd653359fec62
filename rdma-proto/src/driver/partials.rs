//! The receiver's ledger of the partials it keeps for resumes: the list, and the file system
//! work of the rules of [`crate::policy::partials`] (which partials are still on disk, how much
//! space is free, removing those given up). Partials from before the receiver started are in
//! it if they are in the destination itself (found when it binds); any others expire only by
//! `partial_ttl`.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::files::{DirFd, Incoming};
use crate::policy::partials::{make_space, Caps, DirId, Fruitless, Sweeps, FRUITLESS_RESUMES};
pub(crate) use crate::policy::partials::{Owner, Reserve};

/// A partial the receiver kept.
type Kept = crate::policy::partials::Kept<DirFd>;

/// The free space of `dir`'s file system for an unprivileged user, and its size, in bytes.
fn space(dir: &DirFd) -> Option<(u64, u64)> {
    let st = rustix::fs::fstatvfs(&**dir).ok()?;
    Some((st.f_bavail.saturating_mul(st.f_frsize), st.f_blocks.saturating_mul(st.f_frsize)))
}

/// The partials kept, oldest first, within their caps.
pub(crate) struct Ledger {
    caps: Caps,
    /// Free space kept on each partial's file system.
    reserve: Reserve,
    kept: Mutex<VecDeque<Kept>>,
    /// Resumes in a row that added nothing, by partial.
    fruitless: Mutex<Fruitless>,
    /// When each directory was last swept for expired partials.
    swept: Mutex<Sweeps>,
}

fn dir_id(dir: &DirFd) -> Option<DirId> {
    let st = rustix::fs::fstat(&**dir).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

impl Ledger {
    /// At most `max_count` partials of `max_bytes` together.
    pub(crate) fn new(max_count: usize, max_bytes: u64) -> Ledger {
        Ledger {
            caps: Caps { count: max_count, bytes: max_bytes, per_address: u64::MAX },
            reserve: Reserve::NONE,
            kept: Mutex::new(VecDeque::new()),
            fruitless: Mutex::new(Fruitless::default()),
            swept: Mutex::new(Sweeps::default()),
        }
    }

    /// The ledger with a free-space `reserve` and a cap of `per_address` bytes on one address's
    /// partials.
    pub(crate) fn with_space(self, reserve: Reserve, per_address: u64) -> Ledger {
        Ledger { reserve, caps: Caps { per_address, ..self.caps }, ..self }
    }

    /// Whether `dir` is due a sweep for expired partials now ([`Sweeps::due`]); `true` marks it
    /// swept.
    pub(crate) fn sweep_due(&self, dir: &DirFd) -> bool {
        let Some(at) = dir_id(dir) else { return true };
        self.swept.lock().unwrap_or_else(PoisonError::into_inner).due(at, Instant::now())
    }

    /// The list; a session that panicked holding it left it whole (each change is one step).
    fn lock(&self) -> MutexGuard<'_, VecDeque<Kept>> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the partials found in `dir` when the receiver binds (oldest first), giving up
    /// the oldest past the caps.
    pub(crate) fn found(&self, dir: &DirFd, partials: Vec<(u64, u64)>) {
        let Some(at) = dir_id(dir) else { return };
        let mut given_up = Vec::new();
        {
            let mut kept = self.lock();
            // One over the byte cap alone is not kept, and gives up nothing for its place.
            for (key, bytes) in partials.into_iter().filter(|&(_, bytes)| self.caps.fits_alone(bytes)) {
                given_up.extend(self.make_room(&mut kept, bytes));
                kept.push_back(Kept { dir: dir.clone(), at, key, bytes, owner: Owner::default() });
            }
        }
        self.give_up(given_up);
    }

    /// Keeps `file`'s partial with its first `held` bytes ([`Incoming::keep`]; its sidecar
    /// rewritten only when the session `added` bytes) when it fits the caps once the oldest
    /// partials are given up; otherwise it goes when `file` drops.
    ///
    /// It counts what the partial takes on disk: `held` when the session `added` bytes (its
    /// checkpoint cuts the data file to `held`), else the larger of `held` and the data file's
    /// blocks (a resume that hashed only part of a partial and broke off leaves the whole
    /// partial on disk, its sidecar still vouching for it).
    #[cfg(test)]
    pub(crate) fn keep(&self, file: &mut Incoming, held: u64, added: bool) {
        self.keep_for(file, held, added, Owner::default());
    }

    /// Puts a partial a session took and did not touch back as it was (its sidecar, time and
    /// all), without counting the session as a resume that added nothing: a sender that could
    /// not prove the partial's bytes was not its owner, and wrong proofs must not make the
    /// receiver give up its owner's partial. It goes back as nobody's (the session that took
    /// it does not know whose it was), like the partials found when the receiver starts.
    pub(crate) fn put_back(&self, file: &mut Incoming) {
        let vouched = file.vouched();
        self.keep_as(file, vouched, false, Owner::default(), false);
    }

    /// [`keep`](Self::keep) for `owner`: past its address's cap its oldest partials go first,
    /// and the partial is kept only while the file system keeps its reserve free once the
    /// oldest partials there (`owner`'s own too) are given up (else they go, and this one too).
    pub(crate) fn keep_for(&self, file: &mut Incoming, held: u64, added: bool, owner: Owner) {
        self.keep_as(file, held, added, owner, true);
    }

    /// [`keep_for`](Self::keep_for); `count` says whether a session that added nothing counts
    /// towards [`FRUITLESS_RESUMES`].
    fn keep_as(&self, file: &mut Incoming, held: u64, added: bool, owner: Owner, count: bool) {
        let Some((dir, key)) = file.partial_of() else { return };
        let Some(at) = dir_id(&dir) else { return };
        // Only a session that resumed (its sidecar vouched for bytes: it hashed them) counts.
        if count && (added || file.vouched() > 0) && self.fruitless(at, key, added) {
            tracing::info!(
                key = format_args!("{key:016x}"),
                "a partial that {FRUITLESS_RESUMES} resumes in a row added nothing to is given up"
            );
            return;
        }
        let bytes = if added { held } else { held.max(file.occupied()) };
        if !self.caps.fits_alone(bytes) {
            tracing::info!(bytes, max = self.caps.bytes, "a partial over max_partial_bytes is not kept");
            return;
        }
        // Its place is taken under the lock; the disk work (the older partials' removal, this
        // one's checkpoint and fsync) is done after it, so that sessions ending together do not
        // wait for each other's disk. A partial that could not be kept gives its place back.
        if !self.caps.fits_address(owner, bytes) {
            let max = self.caps.per_address;
            tracing::info!(bytes, max, "a partial over max_partial_bytes_per_address is not kept");
            return;
        }
        let given_up = {
            let mut kept = self.lock();
            kept.retain(|k| !(k.at == at && k.key == key));
            let mut given_up = self.make_room(&mut kept, bytes);
            given_up.extend(self.caps.make_room_of(&mut kept, owner, bytes));
            // Its bytes are on disk already: the space the older partials free is what counts.
            if let Some((free, total)) = space(&dir) {
                let reserve = self.reserve.of(total);
                let freed = |g: &[Kept]| crate::policy::partials::freed_on(g, at.0);
                let short = reserve.saturating_sub(free.saturating_add(freed(&given_up)));
                if short > 0 {
                    let more = make_space(&mut kept, at.0, short, None);
                    let still = short.saturating_sub(freed(&more));
                    given_up.extend(more);
                    if still > 0 {
                        // Every older partial there given up, the reserve is still not free:
                        // this one goes too (when `file` drops).
                        drop(kept);
                        tracing::info!(
                            bytes,
                            reserve,
                            "a partial that would eat into the free-space reserve is not kept"
                        );
                        self.give_up(given_up);
                        return;
                    }
                }
            }
            kept.push_back(Kept { dir: dir.clone(), at, key, bytes, owner });
            given_up
        };
        // The older partials go only once this one is kept: for nothing, when it could not be.
        if file.keep(held, added) {
            self.give_up(given_up);
        } else {
            self.take(&dir, key);
            self.restore(given_up);
        }
    }

    /// Gives up partials until a file of `need` bytes fits in `dir` beside the free-space
    /// reserve: the oldest first, those of senders that proved no secret before the others,
    /// never `key`'s own in `dir` (the partial this transfer may resume). A transfer is never
    /// refused for space that partials hold.
    pub(crate) fn make_space_for(&self, dir: &DirFd, need: u64, key: Option<u64>) {
        let (Some(at), Some((free, total))) = (dir_id(dir), space(dir)) else { return };
        let want = need.saturating_add(self.reserve.of(total));
        if free >= want {
            return;
        }
        let given_up = {
            let mut kept = self.lock();
            kept.retain(|k| super::files::partial_exists(&k.dir, k.key));
            make_space(&mut kept, at.0, want - free, key.map(|key| (at, key)))
        };
        if !given_up.is_empty() {
            let bytes: u64 = given_up.iter().map(|k| k.bytes).sum();
            tracing::info!(partials = given_up.len(), bytes, need, free, "partials given up for a new transfer's room");
        }
        self.give_up(given_up);
    }

    /// Counts a session of the partial `key` in `at` ([`Fruitless::count`]).
    fn fruitless(&self, at: DirId, key: u64, added: bool) -> bool {
        self.fruitless.lock().unwrap_or_else(PoisonError::into_inner).count(at, key, added)
    }

    /// The partial of `key` in `dir` is a session's again (resumed, or committed in its
    /// place): it leaves the ledger, and comes back only if it is kept again.
    pub(crate) fn take(&self, dir: &DirFd, key: u64) {
        let Some(at) = dir_id(dir) else { return };
        self.lock().retain(|k| !(k.at == at && k.key == key));
    }

    /// Takes the oldest partials out of the list until one more of `bytes` fits both caps
    /// ([`Caps::make_room`]), and returns them: [`give_up`](Self::give_up) removes them, after
    /// the lock. A partial gone meanwhile (expired, or removed by hand) frees its place without
    /// a removal.
    fn make_room(&self, kept: &mut VecDeque<Kept>, bytes: u64) -> Vec<Kept> {
        kept.retain(|k| super::files::partial_exists(&k.dir, k.key));
        self.caps.make_room(kept, bytes)
    }

    /// Removes partials [`make_room`](Self::make_room) took out of the list. One a session
    /// still holds (its own `keep` in progress, or resumed meanwhile) is not removed, and goes
    /// back in the list: it is still on disk, and still counts.
    fn give_up(&self, given_up: Vec<Kept>) {
        let mut held = Vec::new();
        for oldest in given_up {
            if super::files::remove_partial_of(&oldest.dir, oldest.key) {
                tracing::info!(key = format_args!("{:016x}", oldest.key), bytes = oldest.bytes, "partial given up");
            } else {
                held.push(oldest);
            }
        }
        self.restore(held);
    }

    /// Puts partials taken out of the list back in, as the oldest.
    fn restore(&self, back: Vec<Kept>) {
        if back.is_empty() {
            return;
        }
        let mut kept = self.lock();
        for k in back.into_iter().rev() {
            kept.push_front(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(86_400);

    /// The keys of the partials in `d`, sorted.
    fn partials_in(d: &std::path::Path) -> Vec<u64> {
        let mut keys: Vec<u64> = std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                let hex = name.strip_prefix('.')?.strip_suffix(".part.rdcp-tmp")?.to_owned();
                u64::from_str_radix(&hex, 16).ok()
            })
            .collect();
        keys.sort();
        keys
    }

    /// A new empty directory for one test, and its handle.
    fn fresh(name: &str) -> (std::path::PathBuf, DirFd) {
        let d = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let dir = super::super::files::open_destination(&d).unwrap();
        (d, dir)
    }

    /// A session of file `f{key}` that breaks off with `held` bytes, kept through `ledger`.
    fn break_off(ledger: &Ledger, dir: &DirFd, key: u64, held: u64) {
        let name = format!("f{key}");
        let (mut f, _) = Incoming::resumable(dir, &name, &name, 1 << 20, key, false, Some(DAY)).unwrap();
        ledger.take(dir, key);
        ledger.keep(&mut f, held, true);
    }

    /// As [`break_off`], the partial `owner`'s.
    fn break_off_for(ledger: &Ledger, dir: &DirFd, key: u64, held: u64, owner: Owner) {
        let name = format!("f{key}");
        let (mut f, _) = Incoming::resumable(dir, &name, &name, 1 << 20, key, false, Some(DAY)).unwrap();
        ledger.take(dir, key);
        ledger.keep_for(&mut f, held, true, owner);
    }

    fn peer(n: u8) -> Owner {
        Owner { peer: Some(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, n))), authenticated: false }
    }

    /// A partial is kept only while the reserve stays free (the older ones given up first), so
    /// that peers that start sends and vanish cannot fill the disk for the next honest send;
    /// here the reserve is the whole file system, so none is.
    #[test]
    fn a_partial_that_would_eat_into_the_free_space_reserve_is_not_kept_and_older_ones_go() {
        let (d, dir) = fresh("rdma-proto-reserve");
        let roomy = Ledger::new(8, 1 << 20);
        break_off(&roomy, &dir, 1, 40);
        break_off(&roomy, &dir, 2, 40);
        assert_eq!(partials_in(&d), [1, 2]);
        let all = Reserve { bytes: 0, percent: 100 };
        let tight = Ledger::new(8, 1 << 20).with_space(all, u64::MAX);
        tight.found(&dir, super::super::files::sweep_partials(&dir, DAY));
        break_off(&tight, &dir, 3, 40);
        assert!(partials_in(&d).is_empty(), "the reserve is never free: nothing is kept");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Without a secret one address's partials hold at most their cap: its oldest go, no other
    /// address's.
    #[test]
    fn one_address_past_its_cap_gives_up_its_own_oldest_partials() {
        let (d, dir) = fresh("rdma-proto-per-address");
        let ledger = Ledger::new(8, 1 << 20).with_space(Reserve::NONE, 100);
        break_off_for(&ledger, &dir, 1, 40, peer(1));
        break_off_for(&ledger, &dir, 2, 40, peer(2));
        break_off_for(&ledger, &dir, 3, 40, peer(1));
        assert_eq!(partials_in(&d), [1, 2, 3]);
        break_off_for(&ledger, &dir, 4, 40, peer(1));
        assert_eq!(partials_in(&d), [2, 3, 4], "peer 1's oldest went, peer 2's stayed");
        break_off_for(&ledger, &dir, 5, 101, peer(2));
        assert_eq!(partials_in(&d), [2, 3, 4], "one over the cap alone is not kept");
        let authenticated = Owner { peer: None, authenticated: true };
        break_off_for(&ledger, &dir, 6, 101, authenticated);
        assert_eq!(partials_in(&d), [2, 3, 4, 6], "a sender that proved the secret has no address cap");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Senders that break off on purpose cannot make the receiver keep more partials than its
    /// caps: the ledger keeps the newest within both.
    #[test]
    fn partials_past_either_cap_give_up_the_oldest_and_one_over_the_byte_cap_is_not_kept() {
        let d = std::env::temp_dir().join(format!("rdma-proto-partials-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let dir = super::super::files::open_destination(&d).unwrap();
        let ledger = Ledger::new(2, 100);
        break_off(&ledger, &dir, 1, 40);
        break_off(&ledger, &dir, 2, 40);
        assert_eq!(partials_in(&d), [1, 2]);
        break_off(&ledger, &dir, 3, 40);
        assert_eq!(partials_in(&d), [2, 3], "a third past the count of 2 gives up the oldest");
        break_off(&ledger, &dir, 4, 70);
        assert_eq!(partials_in(&d), [4], "70 more bytes past 100 give up the two oldest");
        break_off(&ledger, &dir, 5, 101);
        assert_eq!(partials_in(&d), [4], "one over the byte cap alone is not kept");
        // Resumed and broken off again: the same partial, counted once, now the newest.
        break_off(&ledger, &dir, 6, 10);
        break_off(&ledger, &dir, 4, 80);
        assert_eq!(partials_in(&d), [4, 6]);
        break_off(&ledger, &dir, 7, 5);
        assert_eq!(partials_in(&d), [4, 7], "6 was the oldest once 4 was kept again");
        // One removed by hand frees its place without evicting another.
        std::fs::remove_file(d.join(".0000000000000007.part.rdcp-tmp")).unwrap();
        break_off(&ledger, &dir, 8, 5);
        assert_eq!(partials_in(&d), [4, 8]);

        // A receiver that starts finds the partials there, and keeps the newest within its caps.
        let restarted = Ledger::new(1, 1000);
        restarted.found(&dir, super::super::files::sweep_partials(&dir, DAY));
        break_off(&restarted, &dir, 9, 1);
        assert_eq!(partials_in(&d), [9]);
        // A cap of 0 keeps none.
        break_off(&Ledger::new(0, 1000), &dir, 10, 1);
        assert_eq!(partials_in(&d), [9]);

        // A directory is swept at most once per SWEEP_EVERY, however many opens look in it.
        assert!(restarted.sweep_due(&dir));
        assert!(!restarted.sweep_due(&dir), "swept a moment ago");
        let other = super::super::files::open_destination(&std::env::temp_dir()).unwrap();
        assert!(restarted.sweep_due(&other), "another directory has its own time");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The third resume in a row that adds nothing to a partial gives it up (each costs the
    /// receiver a hash of it); one that adds bytes starts the count again.
    #[test]
    fn a_partial_that_resumes_in_a_row_add_nothing_to_is_given_up() {
        let (d, dir) = fresh("rdma-proto-fruitless");
        let ledger = Ledger::new(8, 1 << 20);
        let resume = |added: bool| {
            use std::os::unix::fs::FileExt;
            let (mut f, _) = Incoming::resumable(&dir, "f1", "f1", 1 << 20, 1, false, Some(DAY)).unwrap();
            f.file.write_all_at(&[1; 10], 0).unwrap();
            ledger.take(&dir, 1);
            ledger.keep(&mut f, 10, added);
        };
        resume(true);
        resume(false);
        resume(false);
        resume(true);
        resume(false);
        resume(false);
        assert_eq!(partials_in(&d), [1], "two in a row, twice: kept");
        resume(false);
        assert!(partials_in(&d).is_empty(), "the third in a row gives it up");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A partial whose session still holds it (its own keep in progress) when another
    /// session's keep gives it up is not removed: it goes back in the list, still counted, and
    /// goes at the next chance.
    #[test]
    fn a_partial_still_held_by_its_session_stays_counted_when_it_cannot_be_given_up() {
        let (d, dir) = fresh("rdma-proto-held");
        let ledger = Ledger::new(1, 1 << 20);
        // Partial 1 kept, its session not yet over (its data file still locked).
        let (mut f1, _) = Incoming::resumable(&dir, "f1", "f1", 1 << 20, 1, false, Some(DAY)).unwrap();
        ledger.keep(&mut f1, 10, true);
        break_off(&ledger, &dir, 2, 10);
        assert_eq!(partials_in(&d), [1, 2], "1 is held by its session: not removed");
        drop(f1);
        break_off(&ledger, &dir, 3, 10);
        assert_eq!(partials_in(&d), [3], "1, still counted, goes once its session ended");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A resume that hashed part of a large partial and broke off (nothing added) leaves the
    /// whole partial on disk: it is counted by the data file's blocks. A session that added
    /// bytes cuts the data file to what its new sidecar vouches for.
    #[test]
    fn a_partial_is_counted_by_what_it_takes_on_disk_after_a_short_resume() {
        use std::os::unix::fs::FileExt;
        let (d, dir) = fresh("rdma-proto-short-resume");
        let ledger = Ledger::new(8, 3 << 20);
        let data = |key: u64| d.join(format!(".{key:016x}.part.rdcp-tmp"));
        // Partial 1: 2 MiB stored, then a resume that hashed 1 KiB of it and left.
        let (mut f, _) = Incoming::resumable(&dir, "f1", "f1", 4 << 20, 1, false, Some(DAY)).unwrap();
        std::fs::File::options().write(true).open(data(1)).unwrap().write_all_at(&[7u8; 2 << 20], 0).unwrap();
        ledger.take(&dir, 1);
        ledger.keep(&mut f, 1024, false);
        drop(f);
        assert_eq!(std::fs::metadata(data(1)).unwrap().len(), 2 << 20, "nothing added: the partial is as it was");
        // Partial 2: another 2 MiB. Counted as 1 KiB, partial 1 left room for it (3 MiB cap).
        let (mut g, _) = Incoming::resumable(&dir, "f2", "f2", 4 << 20, 2, false, Some(DAY)).unwrap();
        std::fs::File::options().write(true).open(data(2)).unwrap().write_all_at(&[8u8; 2 << 20], 0).unwrap();
        ledger.take(&dir, 2);
        ledger.keep(&mut g, 2 << 20, true);
        drop(g);
        assert_eq!(partials_in(&d), [2], "2 MiB + 2 MiB pass the 3 MiB cap: the older is given up");
        // A session that added bytes, and stored fewer than the file holds: cut to its sidecar.
        let (mut h, _) = Incoming::resumable(&dir, "f2", "f2", 4 << 20, 2, false, Some(DAY)).unwrap();
        ledger.take(&dir, 2);
        ledger.keep(&mut h, 1 << 20, true);
        drop(h);
        assert_eq!(std::fs::metadata(data(2)).unwrap().len(), 1 << 20, "cut to the 1 MiB its sidecar vouches for");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A receiver that starts counts what a partial found in its destination takes on disk, and
    /// one over the byte cap gives up nothing: a local user's sparse file of a terabyte under a
    /// partial's name does not make it give up the partials found before it.
    #[test]
    fn a_planted_partial_over_the_cap_gives_up_no_other_when_the_receiver_starts() {
        let d = std::env::temp_dir().join(format!("rdma-proto-planted-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let dir = super::super::files::open_destination(&d).unwrap();
        let ledger = Ledger::new(8, 1 << 20);
        break_off(&ledger, &dir, 1, 100);
        break_off(&ledger, &dir, 2, 100);
        // Kept an hour ago, an hour apart: the oldest, in order.
        for (key, ago) in [(1, 7200), (2, 3600)] {
            let meta = std::fs::File::options().write(true).open(d.join(format!(".{key:016x}.meta.rdcp-tmp")));
            let at = std::time::SystemTime::now() - Duration::from_secs(ago);
            meta.unwrap().set_modified(at).unwrap();
        }
        let sparse = std::fs::File::create(d.join(".0000000000000003.part.rdcp-tmp")).unwrap();
        sparse.set_len(1 << 40).unwrap();
        std::fs::write(d.join(".0000000000000004.part.rdcp-tmp"), vec![1u8; 2 << 20]).unwrap();
        assert_eq!(partials_in(&d), [1, 2, 3, 4]);
        let restarted = Ledger::new(8, 1 << 20);
        restarted.found(&dir, super::super::files::sweep_partials(&dir, DAY));
        assert_eq!(partials_in(&d), [1, 2, 3, 4], "nothing given up for a partial that is not kept");
        // The sparse one counts its blocks (none), and 4 (2 MiB, over the cap alone) is not
        // in the ledger: with six more, the oldest goes for the count of 8.
        for key in 5..=10 {
            break_off(&restarted, &dir, key, 1);
        }
        assert_eq!(partials_in(&d), [2, 3, 4, 5, 6, 7, 8, 9, 10], "8 in the ledger, and 4 outside it");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
