//! What a receiver session does with the files: a batch's entries and directories, the
//! embedder's policy, the temporary or resumable partial, the chunks stored, and the commit
//! (every call through `files.rs`, relative to the open destination).

use std::os::unix::fs::FileExt;
use std::time::Instant;

use rdma_verbs::Deadline;

use crate::driver::files::{io_status, make_dir_entry, make_dirs, DirFd, Incoming};
use crate::driver::link::peer_left;
use crate::driver::ProgressEvent;
use crate::policy::Offer;
use crate::receiver::Input;
use crate::wire::{Entry, EntryKind};
use crate::Status;

use super::*;

impl ReceiveSession<'_> {
    /// A batch's entry (`Action::OpenEntry`): its parent directories made under the
    /// destination, then its file opened as a single file's, or the directory made.
    pub(super) fn open_entry(&mut self, e: Entry, conn: &rdma_cm::Connection<'static>) {
        let Some((addr, rkey)) = self.ring_at else {
            return self.machine.handle(Input::OpenFailed(Status::Internal, "no ring".into()), Instant::now());
        };
        self.file = None;
        self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
        let directory = e.kind == EntryKind::Directory;
        if let Some((status, why)) = self.judge(&e.path, directory, e.size, true) {
            return self.machine.handle(Input::OpenFailed(status, why), Instant::now());
        }
        let mut parent = None;
        if let Some(dest) = self.dest {
            let path = e.path.clone();
            let Ok(components) = crate::name::check_path(&path) else {
                return self.machine.handle(Input::OpenFailed(Status::BadName, path), Instant::now());
            };
            let (last, parents) = components.split_last().expect("a path has a component");
            let dir = match make_dirs(dest, parents, &mut self.made_dirs) {
                Ok(d) => d,
                Err((status, why)) => return self.machine.handle(Input::OpenFailed(status, why), Instant::now()),
            };
            match e.kind {
                EntryKind::Directory => {
                    let made = make_dir_entry(&dir, last, &e, &mut self.made_dirs);
                    if let Err((status, why)) = made {
                        return self.machine.handle(Input::OpenFailed(status, why), Instant::now());
                    }
                }
                EntryKind::File => {
                    if !self.open_file(&dir, last, &e.path, e.size, conn) {
                        return;
                    }
                }
            }
            parent = Some(dir);
        }
        self.entry = Some((e, parent));
        self.machine.handle(Input::Ready { addr, rkey }, Instant::now());
    }

    /// Asks the embedder's policy about an offer; the refusal, if it refuses.
    pub(super) fn judge(&self, path: &str, directory: bool, size: u64, in_batch: bool) -> Option<(Status, String)> {
        let policy = self.opts.policy.as_ref()?;
        let authenticated = self.opts.secret.is_some() && self.machine.authorized();
        policy.judge(&Offer { peer: self.report.peer, authenticated, path, directory, size, in_batch })
    }

    /// The key this session's partial is stored under: the sender's resume key, or with a
    /// secret its keyed derivation ([`Secret::partial_key`]); `None` without resuming.
    pub(super) fn partial_key(&self) -> Option<u64> {
        let key = self.machine.resume_key()?;
        Some(self.opts.secret.as_ref().map_or(key, |s| s.partial_key(key)))
    }

    /// Opens the temporary (or the resumable partial) of `name` in `dir` (`rel` under the
    /// destination), and tells the machine what a partial holds; `false` when it failed (the
    /// machine was told).
    pub(super) fn open_file(
        &mut self,
        dir: &DirFd,
        name: &str,
        rel: &str,
        size: u64,
        conn: &rdma_cm::Connection<'static>,
    ) -> bool {
        let session = self.machine.session();
        // Room for the file beside the free-space reserve, made by giving up partials (never
        // the one this transfer may resume): a transfer is never refused for their space.
        self.partials.make_space_for(dir, size, self.partial_key());
        {
            let plain = || Incoming::create(dir, name, rel, session, self.opts.overwrite).map(|f| (f, 0));
            let opened = match self.partial_key() {
                Some(key) => {
                    let sweep = self.partials.sweep_due(dir).then_some(self.opts.partial_ttl);
                    match Incoming::resumable(dir, name, rel, size, key, self.opts.overwrite, sweep) {
                        // Its partial is still held (a session of this file whose sender was killed
                        // a moment ago has not ended yet), or something the receiver cannot remove
                        // is at its name (a local user's directory, in a sticky destination,
                        // must not fail every send of the file): served from the start in
                        // a plain temporary rather than refused. A refusal that is the file's
                        // (it exists) or the disk's comes again from the plain temporary.
                        Err((status, why)) => {
                            tracing::debug!(session = format_args!("{session:016x}"), %name, %status, %why, "not resumable");
                            plain()
                        }
                        r => r,
                    }
                }
                None => plain(),
            };
            match opened {
                Ok((f, held)) => {
                    if let (Some(key), true) = (self.partial_key(), f.is_partial()) {
                        // A session's own again: out of the ledger until it is kept again.
                        self.partials.take(dir, key);
                    }
                    let (held, proof) = self.hash_held(&f, held, conn);
                    self.file = Some(f);
                    if self.partial_key().is_some() {
                        if held > 0 {
                            tracing::info!(session = format_args!("{session:016x}"), %name, held, "resuming, once the sender proves it holds those bytes");
                        }
                        self.machine.handle(Input::Resumed { from: held, proof }, Instant::now());
                    }
                }
                Err((Status::Exists, _)) if self.partial_key().is_some() && self.present(dir, name, size, conn) => {
                    return false;
                }
                Err((status, why)) => {
                    self.machine.handle(Input::OpenFailed(status, why), Instant::now());
                    return false;
                }
            }
        }
        true
    }

    /// Hashes the first `held` bytes of a partial (the digest covers every byte of the file,
    /// those of earlier sessions too), and in the same pass the proof the sender must show of
    /// them (BLAKE3 keyed with the machine's `prefix_key`); returns how many it hashed (`held`,
    /// or 0 when reading them failed: the transfer then starts over) and that proof.
    ///
    /// The sender waits for the GRANT meanwhile, and then hashes as much of its own file before
    /// its first chunk: so only what hashes within a third of `timeout` is used (the rest is
    /// sent again and written over), and the hash stops when the receiver is stopped or the peer
    /// leaves. Unbounded, a 20 GB
    /// partial at the VM's 32 MB/s of keyed BLAKE3 would take 10 minutes, and every attempt to
    /// resume it would time out.
    pub(super) fn hash_held(
        &mut self,
        f: &Incoming,
        held: u64,
        conn: &rdma_cm::Connection<'static>,
    ) -> (u64, [u8; 32]) {
        let mut proof = blake3::Hasher::new_keyed(self.machine.prefix_key().as_bytes());
        let mut buf = vec![0u8; (1 << 20).min(held as usize)];
        let mut at = 0u64;
        let budget = Deadline::after(self.opts.timeout / 3);
        if held > 0 {
            tracing::info!(held, "hashing the bytes a partial holds, to resume it");
        }
        while at < held {
            // Whether the peer left is asked every 16 MiB (a read of the CM channel that does
            // not block): a peer that offers a resume and leaves costs the receiver no more
            // hashing than it stays connected for.
            let gone = at % (16 << 20) == 0 && at > 0 && peer_left(conn).unwrap_or(true);
            if gone || budget.has_passed() || self.opts.stop.is_set() {
                tracing::info!(held, hashed = at, gone, "resuming from what was hashed in time");
                return (at, *proof.finalize().as_bytes());
            }
            let n = (held - at).min(buf.len() as u64) as usize;
            if f.file.read_exact_at(&mut buf[..n], at).is_err() {
                self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
                return (0, [0; 32]);
            }
            self.hasher.update(&buf[..n]);
            proof.update(&buf[..n]);
            at += n as u64;
        }
        (held, *proof.finalize().as_bytes())
    }

    /// The file is in place already (overwriting off): when it is a regular file of `size`
    /// bytes, hashes all of it for the proof the sender must show (BLAKE3 keyed with the
    /// machine's `prefix_key`) and answers `Input::Present`; whether it did (else the caller
    /// refuses with `Exists`). Bounded as a partial's hash is (a third of `timeout`, the peer
    /// leaving, the receiver stopping): a file that takes longer is refused as before.
    pub(super) fn present(&mut self, dir: &DirFd, name: &str, size: u64, conn: &rdma_cm::Connection<'static>) -> bool {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let Ok(fd) = rustix::fs::openat(&**dir, name, flags, Mode::empty()) else { return false };
        let file = std::fs::File::from(fd);
        match file.metadata() {
            Ok(m) if m.is_file() && m.len() == size => {}
            _ => return false,
        }
        let mut proof = blake3::Hasher::new_keyed(self.machine.prefix_key().as_bytes());
        let mut buf = vec![0u8; (1 << 20).min(size as usize)];
        let budget = Deadline::after(self.opts.timeout / 3);
        let mut at = 0u64;
        while at < size {
            let gone = at % (16 << 20) == 0 && at > 0 && peer_left(conn).unwrap_or(true);
            if gone || budget.has_passed() || self.opts.stop.is_set() {
                return false;
            }
            let n = (size - at).min(buf.len() as u64) as usize;
            if file.read_exact_at(&mut buf[..n], at).is_err() {
                return false;
            }
            proof.update(&buf[..n]);
            at += n as u64;
        }
        tracing::info!(session = format_args!("{:016x}", self.machine.session()), %name, size, "in place already: the sender is asked to prove it has the same");
        self.machine.handle(Input::Present { proof: *proof.finalize().as_bytes() }, Instant::now());
        true
    }

    /// The sender did not prove it holds the partial's bytes (`Action::StartOver`): the
    /// partial goes back to the ledger as it was (its owner's, to resume; no chunk was written
    /// into it, and a wrong proof is not counted against it), and the file is taken from byte 0
    /// into a new plain temporary.
    pub(super) fn start_over(&mut self) {
        let Some((addr, rkey)) = self.ring_at else {
            return self.machine.handle(Input::OpenFailed(Status::Internal, "no ring".into()), Instant::now());
        };
        if let Some(mut f) = self.file.take() {
            self.partials.put_back(&mut f);
        }
        self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
        let session = self.machine.session();
        tracing::info!(
            session = format_args!("{session:016x}"),
            "the sender did not prove the partial's bytes: from byte 0, the partial left alone"
        );
        let opened = match (&self.entry, self.dest) {
            (Some((e, Some(dir))), _) => {
                let name = e.path.rsplit('/').next().unwrap_or(&e.path);
                Some(Incoming::create(dir, name, &e.path, session, self.opts.overwrite))
            }
            (Some((_, None)), _) | (None, None) => None,
            (None, Some(dir)) => {
                let name = self.report.name.clone().unwrap_or_default();
                Some(Incoming::create(dir, &name, &name, session, self.opts.overwrite))
            }
        };
        match opened {
            Some(Err((status, why))) => return self.machine.handle(Input::OpenFailed(status, why), Instant::now()),
            Some(Ok(f)) => self.file = Some(f),
            None => {}
        }
        self.machine.handle(Input::Ready { addr, rkey }, Instant::now());
    }

    /// Takes chunk `seq` out of its slot, hashes and stores it (`Action::StoreChunk`).
    pub(super) fn store(&mut self, seq: u64, slot: u32, offset: u64, len: u32) {
        let now = Instant::now();
        // The slot is writable by the peer: copy it out once (no reference to it is made),
        // then hash and store that copy, so the bytes hashed are the bytes stored whatever the
        // peer does meanwhile.
        let Some(copy) = self.copy.as_mut() else {
            let why = "a chunk arrived before its ring was registered".to_owned();
            return self.machine.handle(Input::StoreFailed(Status::Internal, why), now);
        };
        let buf = &mut copy.as_mut_slice()[..len as usize];
        if let Err(e) = self.slots[slot as usize].read_at(0, buf) {
            return self.machine.handle(Input::StoreFailed(Status::Internal, e.to_string()), now);
        }
        #[cfg(feature = "fault-injection")]
        if self.opts.corrupt_chunk == Some(seq) && !buf.is_empty() {
            buf[0] ^= 0xff;
        }
        self.hasher.update(buf);
        if let Some(f) = &self.file {
            if let Err(e) = f.file.write_all_at(buf, offset) {
                let why = format!("writing at {offset}: {e}");
                return self.machine.handle(Input::StoreFailed(io_status(&e), why), now);
            }
        }
        self.last_stored = Some(Instant::now());
        self.machine.handle(Input::ChunkStored { seq }, now);
        if let Some(seat) = &self.admitted {
            seat.progress(u64::from(len), now);
        }
        if let Some(p) = &self.opts.progress {
            let name = match &self.entry {
                Some((e, _)) => e.path.as_str(),
                None => self.report.name.as_deref().unwrap_or(""),
            };
            let (session, size) = (self.machine.session(), self.machine.size());
            p.call(&ProgressEvent { session, name, done: self.machine.bytes_stored(), size });
        }
        // A partial vouches for what it holds every `checkpoint_every` bytes, so that a
        // receiver killed outright (SIGKILL, a crash) loses at most that much.
        let held = self.machine.bytes_stored();
        let every = self.opts.checkpoint_every.max(1);
        if let Some(f) = self.file.as_ref().filter(|f| f.is_partial()) {
            if held / every != held.saturating_sub(u64::from(len)) / every {
                let _ = f.checkpoint(held);
            }
        }
    }

    /// Checks the digest, syncs and renames the file into place (`Action::Finalize`).
    pub(super) fn finalize(&mut self, digest: &[u8]) {
        let now = Instant::now();
        self.data_end = Some(now);
        let ours = self.hasher.finish();
        self.report.phases.digest = now.elapsed(); // the hashing itself ran with the data
        let (status, why) = if ours[..] != digest[..] {
            (Status::ChecksumMismatch, "the data does not match the sender's digest".to_owned())
        } else if let Some(f) = self.file.take() {
            let t = Instant::now();
            let partial = f.is_partial();
            let r = f.commit(self.entry.as_ref().map(|(e, _)| e));
            self.report.phases.sync_rename = t.elapsed();
            match r {
                Ok(()) => {
                    // Served from the start while its partial was held: that partial, once
                    // free, is of a file now in place (unless it is of another file).
                    let dir = self.entry.as_ref().and_then(|(_, d)| d.as_ref()).or(self.dest);
                    let (rel, size) = match &self.entry {
                        Some((e, _)) => (e.path.as_str(), e.size),
                        None => (self.report.name.as_deref().unwrap_or_default(), self.machine.size()),
                    };
                    // Out of the ledger only when removed: another file's partial under the key
                    // stays within the caps.
                    if let (false, Some(key), Some(dir)) = (partial, self.partial_key(), dir) {
                        if crate::driver::files::drop_partial(dir, key, rel, size) {
                            self.partials.take(dir, key);
                        }
                    }
                    (Status::Ok, String::new())
                }
                Err((status, why)) => (status, why),
            }
        } else {
            (Status::Ok, String::new())
        };
        self.machine.handle(Input::Finalized(status, why), Instant::now());
    }
}
