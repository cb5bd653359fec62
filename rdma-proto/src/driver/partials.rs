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

/// The partials kept, oldest first, within their caps.
pub(crate) struct Ledger {
    max_count: usize,
    max_bytes: u64,
    kept: Mutex<VecDeque<Kept>>,
    /// When each directory was last swept for expired partials.
    swept: Mutex<HashMap<DirId, Instant>>,
}

fn dir_id(dir: &DirFd) -> Option<DirId> {
    let st = rustix::fs::fstat(&**dir).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

impl Ledger {
    pub(crate) fn new(max_count: usize, max_bytes: u64) -> Ledger {
        Ledger { max_count, max_bytes, kept: Mutex::new(VecDeque::new()), swept: Mutex::new(HashMap::new()) }
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
        // Directories swept long ago are forgotten: their next open sweeps them anyway.
        if swept.len() >= 4096 {
            swept.retain(|_, last| now.duration_since(*last) < SWEEP_EVERY);
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
        Self::give_up(given_up);
    }

    /// Whether a partial of `bytes` may be kept at all.
    fn fits_alone(&self, bytes: u64) -> bool {
        bytes <= self.max_bytes && self.max_count > 0
    }

    /// Keeps `file`'s partial with its first `held` bytes ([`Incoming::keep`]; its sidecar
    /// rewritten only when the session `added` bytes) when it fits the caps once the oldest
    /// partials are given up; otherwise it goes when `file` drops.
    pub(crate) fn keep(&self, file: &mut Incoming, held: u64, added: bool) {
        let Some((dir, key)) = file.partial_of() else { return };
        let Some(at) = dir_id(&dir) else { return };
        if !self.fits_alone(held) {
            tracing::info!(held, max = self.max_bytes, "a partial over max_partial_bytes is not kept");
            return;
        }
        // Its place is taken under the lock; the disk work (the older partials' removal, this
        // one's checkpoint and fsync) is done after it, so that sessions ending together do not
        // wait for each other's disk (review R6). A partial that could not be kept gives its
        // place back.
        let given_up = {
            let mut kept = self.lock();
            kept.retain(|k| !(k.at == at && k.key == key));
            let given_up = self.make_room(&mut kept, held);
            kept.push_back(Kept { dir: dir.clone(), at, key, bytes: held });
            given_up
        };
        Self::give_up(given_up);
        if !file.keep(held, added) {
            self.take(&dir, key);
        }
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

    /// Removes partials [`make_room`](Self::make_room) took out of the list.
    fn give_up(given_up: Vec<Kept>) {
        for oldest in given_up {
            tracing::info!(key = format_args!("{:016x}", oldest.key), bytes = oldest.bytes, "partial given up");
            super::files::remove_partial_of(&oldest.dir, oldest.key);
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
