//! The receiver's ledger of the partials it keeps for resumes: at most
//! [`ReceiveOptions::max_partials`](super::ReceiveOptions::max_partials) of them, and at most
//! [`ReceiveOptions::max_partial_bytes`](super::ReceiveOptions::max_partial_bytes) together.
//! Keeping one past either cap first gives up the oldest (those a session holds again are not
//! in the ledger); one larger than the byte cap alone is not kept. Partials from before the
//! receiver started are in it if they are in the destination itself (found when it binds);
//! any others expire only by `partial_ttl`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::files::{DirFd, Incoming};

/// A directory's identity: its device and inode.
type DirId = (u64, u64);

/// A partial the receiver kept.
struct Kept {
    dir: DirFd,
    at: DirId,
    key: u64,
    bytes: u64,
}

/// How often one directory's expired partials are looked for: a sweep reads the whole
/// directory, and a batch of N files into one directory, each with its resume key, once swept
/// it N times (N² entries read; review finding G5).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Resumes in a row that add nothing to a partial before it is given up (review H3: each
/// costs the receiver a hash of the partial, up to a third of its `timeout`, for about a
/// kilobyte from the peer; a peer could offer the same resume and leave, over and over).
pub(crate) const FRUITLESS_RESUMES: u32 = 3;

/// The partials kept, oldest first, within their caps.
pub(crate) struct Ledger {
    max_count: usize,
    max_bytes: u64,
    kept: Mutex<VecDeque<Kept>>,
    /// Resumes in a row that added nothing, by partial.
    fruitless: Mutex<HashMap<(DirId, u64), u32>>,
    /// When each directory was last swept for expired partials.
    swept: Mutex<HashMap<DirId, Instant>>,
}

fn dir_id(dir: &DirFd) -> Option<DirId> {
    let st = rustix::fs::fstat(&**dir).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

impl Ledger {
    pub(crate) fn new(max_count: usize, max_bytes: u64) -> Ledger {
        Ledger {
            max_count,
            max_bytes,
            kept: Mutex::new(VecDeque::new()),
            fruitless: Mutex::new(HashMap::new()),
            swept: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `dir` is due a sweep for expired partials (at most once per [`SWEEP_EVERY`]);
    /// `true` marks it swept now.
    pub(crate) fn sweep_due(&self, dir: &DirFd) -> bool {
        let Some(at) = dir_id(dir) else { return true };
        let now = Instant::now();
        let mut swept = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
        if swept.get(&at).is_some_and(|last| now.duration_since(*last) < SWEEP_EVERY) {
            return false;
        }
        // Directories swept long ago are forgotten: their next open sweeps them anyway. Still
        // full (a batch spreading partials over thousands of new directories within
        // `SWEEP_EVERY`), all are: a sweep more each, rather than a scan of them all on every
        // open (review L4).
        if swept.len() >= 4096 {
            swept.retain(|_, last| now.duration_since(*last) < SWEEP_EVERY);
            if swept.len() >= 2048 {
                swept.clear();
            }
        }
        swept.insert(at, now);
        true
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
            // One over the byte cap alone is not kept, and gives up nothing for its place
            // (review R5: before, it gave up every partial found before it).
            for (key, bytes) in partials.into_iter().filter(|&(_, bytes)| self.fits_alone(bytes)) {
                given_up.extend(self.make_room(&mut kept, bytes));
                kept.push_back(Kept { dir: dir.clone(), at, key, bytes });
            }
        }
        self.give_up(given_up);
    }

    /// Whether a partial of `bytes` may be kept at all.
    fn fits_alone(&self, bytes: u64) -> bool {
        bytes <= self.max_bytes && self.max_count > 0
    }

    /// Keeps `file`'s partial with its first `held` bytes ([`Incoming::keep`]; its sidecar
    /// rewritten only when the session `added` bytes) when it fits the caps once the oldest
    /// partials are given up; otherwise it goes when `file` drops.
    ///
    /// It counts what the partial takes on disk: `held` when the session `added` bytes (its
    /// checkpoint cuts the data file to `held`), else the larger of `held` and the data file's
    /// blocks. Review H4: a resume that hashed only part of a partial, and broke off, made the
    /// ledger count what it hashed (16 MiB) while the disk kept the whole partial and its
    /// sidecar still vouched for it; the byte cap could be passed about 64 times.
    pub(crate) fn keep(&self, file: &mut Incoming, held: u64, added: bool) {
        self.keep_counted(file, held, added, true);
    }

    /// Puts a partial a session took and did not touch back as it was (its sidecar, time and
    /// all), without counting the session as a resume that added nothing: a sender that could
    /// not prove the partial's bytes was not its owner, and wrong proofs must not make the
    /// receiver give up its owner's partial.
    pub(crate) fn put_back(&self, file: &mut Incoming) {
        let vouched = file.vouched();
        self.keep_counted(file, vouched, false, false);
    }

    /// [`keep`](Self::keep); `count` says whether a session that added nothing counts towards
    /// [`FRUITLESS_RESUMES`].
    fn keep_counted(&self, file: &mut Incoming, held: u64, added: bool, count: bool) {
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
        if !self.fits_alone(bytes) {
            tracing::info!(bytes, max = self.max_bytes, "a partial over max_partial_bytes is not kept");
            return;
        }
        // Its place is taken under the lock; the disk work (the older partials' removal, this
        // one's checkpoint and fsync) is done after it, so that sessions ending together do not
        // wait for each other's disk (review R6). A partial that could not be kept gives its
        // place back.
        let given_up = {
            let mut kept = self.lock();
            kept.retain(|k| !(k.at == at && k.key == key));
            let given_up = self.make_room(&mut kept, bytes);
            kept.push_back(Kept { dir: dir.clone(), at, key, bytes });
            given_up
        };
        // The older partials go only once this one is kept (review H8: they were removed
        // first, and for nothing when this one could not be kept).
        if file.keep(held, added) {
            self.give_up(given_up);
        } else {
            self.take(&dir, key);
            self.restore(given_up);
        }
    }

    /// Counts a session of the partial `key` in `at` that `added` nothing, or clears the count
    /// of one that did; whether it was the [`FRUITLESS_RESUMES`]th in a row.
    fn fruitless(&self, at: DirId, key: u64, added: bool) -> bool {
        let mut counts = self.fruitless.lock().unwrap_or_else(PoisonError::into_inner);
        if added {
            counts.remove(&(at, key));
            return false;
        }
        // Counts of partials long gone are forgotten (a partial forgotten so starts again).
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

    /// The partial of `key` in `dir` is a session's again (resumed, or committed in its
    /// place): it leaves the ledger, and comes back only if it is kept again.
    pub(crate) fn take(&self, dir: &DirFd, key: u64) {
        let Some(at) = dir_id(dir) else { return };
        self.lock().retain(|k| !(k.at == at && k.key == key));
    }

    /// Takes the oldest partials out of the list until one more of `bytes` fits both caps, and
    /// returns them: [`give_up`](Self::give_up) removes them, after the lock. A partial gone
    /// meanwhile (expired, or removed by hand) frees its place without a removal.
    fn make_room(&self, kept: &mut VecDeque<Kept>, bytes: u64) -> Vec<Kept> {
        kept.retain(|k| super::files::partial_exists(&k.dir, k.key));
        let over = |kept: &VecDeque<Kept>| {
            let total: u64 = kept.iter().map(|k| k.bytes).sum();
            kept.len() >= self.max_count || total.saturating_add(bytes) > self.max_bytes
        };
        let mut given_up = Vec::new();
        while over(kept) {
            let Some(oldest) = kept.pop_front() else { break };
            given_up.push(oldest);
        }
        given_up
    }

    /// Removes partials [`make_room`](Self::make_room) took out of the list. One a session
    /// still holds (its own `keep` in progress, or resumed meanwhile) is not removed, and goes
    /// back in the list: it is still on disk, and still counts (review H8: it fell out of the
    /// ledger and stayed on disk, outside both caps, for its time to live).
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

    /// Senders that break off on purpose made the receiver keep a partial each, for a day:
    /// nothing bounded how many or how large (issue 33 §2). The ledger keeps the newest within
    /// both caps.
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

    /// Review H3: a peer that offers a partial's resume and leaves, over and over, cost the
    /// receiver a hash of the partial each time. The third resume in a row that adds nothing
    /// gives it up; one that adds bytes starts the count again.
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

    /// Review H8: a partial whose session still held it (its own keep in progress) when
    /// another session's keep gave it up was not removed, and fell out of the ledger: it stayed
    /// on disk outside both caps. It now goes back in the list, and goes at the next chance.
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

    /// Review H4: a resume that hashed 16 MiB of a large partial and broke off (nothing added)
    /// made the ledger count 16 MiB, while the whole partial stayed on disk, vouched for by its
    /// sidecar. It now counts the data file's blocks; a session that added bytes cuts the data
    /// file to what its new sidecar vouches for.
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

    /// Review R5: a receiver that starts counts what a partial found in its destination takes on
    /// disk, and one over the byte cap gives up nothing. Before, a local user's sparse file of
    /// a terabyte under a partial's name (or any file over the cap) made it give up every
    /// partial found before it.
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
