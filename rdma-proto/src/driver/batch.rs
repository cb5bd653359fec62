//! [`send_files`]: many files and directory trees in one session (capability `BATCH`): one
//! connection, one grant, an ENTRY per file or directory, a verdict per entry, one summary.

use std::collections::VecDeque;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::send::{open_regular, resume_key, run, test_session, Identity, Ran, SendOptions, SendSession, SourceFile};
#[cfg(feature = "tokio")]
use crate::driver::io::Tokio;
use crate::driver::io::{block_on, Blocking, Io};
use crate::driver::retry::{self, Attempt, Retries};
use crate::driver::Error;
use crate::sender::{Sender, SenderConfig};
use crate::wire::{entry_flags, Entry, EntryKind, MAX_PATH_LEN};
use crate::{Outcome, Status};

/// What became of one entry of a batch, as the sender saw it.
#[derive(Debug)]
#[non_exhaustive]
pub struct SentEntry {
    /// The local path.
    pub source: PathBuf,
    /// The path the receiver was asked to store it under, relative to its destination.
    pub path: String,
    /// A directory (else a file).
    pub directory: bool,
    /// Bytes of the file.
    pub size: u64,
    /// `Ok` when the receiver stored it; [`Error::Refused`] with the receiver's status;
    /// another error when it could not be sent (a local file error: then it was never
    /// offered), or when the session ended during it.
    pub result: Result<(), Error>,
    /// Bytes the receiver already held of it (resumed): not sent again.
    pub resumed_from: u64,
}

/// What a batch did.
#[derive(Debug)]
#[non_exhaustive]
pub struct BatchReport {
    /// The session id.
    pub session: u64,
    /// Each entry, in the order sent (a directory after what it holds).
    pub entries: Vec<SentEntry>,
    /// What was left out: symbolic links and special files, with why.
    pub skipped: Vec<(PathBuf, String)>,
    /// Bytes of the files the receiver stored.
    pub bytes: u64,
    /// Wall time from start to the summary.
    pub total: Duration,
    /// `Ok` when every entry was stored; [`Error::Refused`] with the receiver's summary (the
    /// first failure's status) when some were not; another error when the session broke off
    /// (entries after the one in progress were not sent).
    pub result: Result<(), Error>,
}

impl BatchReport {
    /// Entries that were not stored.
    pub fn failed(&self) -> impl Iterator<Item = &SentEntry> {
        self.entries.iter().filter(|e| e.result.is_err())
    }
}

/// A local file or directory to send, and the path it is stored under.
#[derive(Debug)]
struct SourceEntry {
    source: PathBuf,
    path: String,
    meta: std::fs::Metadata,
}

/// A batch in progress, in a [`SendSession`].
#[derive(Debug)]
pub(crate) struct BatchState {
    queue: VecDeque<SourceEntry>,
    /// The entry offered, awaiting its verdict.
    current: Option<SourceEntry>,
    sent: Vec<SentEntry>,
    /// Bytes of the entries that ended, and of all the files.
    pub(crate) done_bytes: u64,
    pub(crate) total: u64,
}

impl BatchState {
    /// The receiver's verdict on the entry in progress.
    pub(crate) fn entry_done(&mut self, status: Status, detail: String, _received: u64) {
        let Some(e) = self.current.take() else { return };
        let result =
            if status == Status::Ok { Ok(()) } else { Err(Error::Refused { status, detail, retry_after: None }) };
        let last = self.sent.last_mut().filter(|s| s.path == e.path && s.result.is_ok());
        // The size it was offered with (what `total` now counts), not the walk's: a file that
        // changed since would leave the progress short of (or past) its total.
        self.done_bytes += last.as_ref().map_or(0, |s| s.size);
        if let Some(last) = last {
            last.result = result;
        }
    }
}

/// Sends the files and directory trees `paths` to a receiver in one session: one connection
/// and one grant, each file or directory offered in turn (a directory's contents before the
/// directory itself, so that its modification time can be kept), each with its own verdict,
/// then one summary. A directory is stored under its own name (as `cp -r`), with every path
/// relative to the receiver's destination; empty files and empty directories are sent;
/// symbolic links and special files, and inside a tree names that are not UTF-8 or not
/// valid on the receiver, paths over 960 bytes and what cannot be read, are skipped and listed. With [`SendOptions::preserve`]
/// modes and modification times are kept. A file that cannot be read is listed with its error
/// and not offered; the rest of the batch goes on. `progress(done, total)` covers the whole
/// batch.
///
/// # Errors
/// When no session started: a path that cannot be read or has no name, or connecting failed,
/// or the receiver refused the batch (`Error::Refused`; a receiver that does not take batches
/// refuses its name with `BadName`). Everything after that is in the report.
pub fn send_files(paths: &[PathBuf], opts: &SendOptions, progress: impl FnMut(u64, u64)) -> Result<BatchReport, Error> {
    block_on(send_batch(&Blocking, paths, opts, progress))
}

/// [`send_files`] for async code (feature `tokio`): the same session, awaited as
/// `send_file_async` awaits one file's.
///
/// # Errors
/// As [`send_files`].
#[cfg(feature = "tokio")]
pub async fn send_files_async(
    paths: &[PathBuf],
    opts: &SendOptions,
    progress: impl FnMut(u64, u64),
) -> Result<BatchReport, Error> {
    send_batch(&Tokio, paths, opts, progress).await
}

/// The one body of [`send_files`] and `send_files_async`. A receiver that refuses the batch
/// itself with `Busy` (every place taken) is asked again, as a single file's send asks it,
/// within [`SendOptions::busy_wait`]; nothing else is tried again (the report says what each
/// entry got).
async fn send_batch<I: Io>(
    io: &I,
    paths: &[PathBuf],
    opts: &SendOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<BatchReport, Error> {
    let start = Instant::now();
    let mut retries = Retries::new(opts);
    loop {
        let (source, batch, skipped) = prepare(paths, opts)?;
        let first = paths.first().cloned().unwrap_or_default();
        let result = match run(io, &first, source, Some(batch), opts, &mut progress, start).await {
            Ok(ran) => finish(ran, skipped, start),
            Err(e) => Err(e),
        };
        match result {
            Err(e @ Error::Refused { status: Status::Busy, .. }) => {
                match retries.after::<BatchReport>(Attempt::ConnectFailed(e), opts) {
                    Ok(wait) => retry::sleep(io, wait, opts).await?,
                    Err(result) => return result,
                }
            }
            result => return result,
        }
    }
}

/// What was left out of a batch, and why.
type Skipped = Vec<(PathBuf, String)>;

/// The batch's entries walked from `paths`, and its machine.
fn prepare(paths: &[PathBuf], opts: &SendOptions) -> Result<(SourceFile, BatchState, Skipped), Error> {
    let mut skipped = Vec::new();
    let mut queue = VecDeque::new();
    for p in paths {
        collect(p, None, &mut queue, &mut skipped)?;
    }
    let total = queue.iter().filter(|e| e.meta.is_file()).map(|e| e.meta.len()).sum();
    let session = test_session(opts).unwrap_or_else(super::send::session_id);
    let mut cfg = SenderConfig::new(opts.chunk, opts.depth, opts.timeout);
    // The connection's QP allows remote writes (`connect`): the receiver may probe it.
    cfg.probes = true;
    cfg.secret = opts.secret.clone();
    cfg.lanes = opts.lanes;
    let machine = Sender::batch(session, total, cfg, Instant::now())?.with_nonce(super::random_bytes());
    tracing::info!(session = format_args!("{session:016x}"), entries = queue.len(), total, to = %opts.to, "sending a batch");
    let identity = Identity::default();
    let source = SourceFile { file: None, size: 0, session, machine, identity, chunk: opts.chunk };
    let batch = BatchState { queue, current: None, sent: Vec::new(), done_bytes: 0, total };
    Ok((source, batch, skipped))
}

/// The batch's report, once its session ran.
fn finish(ran: Ran, skipped: Skipped, start: Instant) -> Result<BatchReport, Error> {
    let (outcome, summary, batch) = ran;
    let session = summary.session;
    let mut batch = batch.expect("the batch comes back");
    let result = match outcome {
        Ok(Outcome::Acked { status: Status::Ok, .. }) => Ok(()),
        Ok(Outcome::Acked { status, detail }) => Err(Error::Refused { status, detail, retry_after: None }),
        Ok(Outcome::Failed(e)) => Err(e.into()),
        Err(e) => Err(e),
    };
    // Nothing was offered: the receiver refused the batch itself.
    let result = match result {
        Err(e) if batch.sent.is_empty() && !batch.queue.is_empty() => return Err(e),
        r => r,
    };
    // The entry in progress when the session broke off: not stored, for the session's reason
    // (a cancel is `Cancelled`, a lost connection `ConnectionLost`), so that its exit code,
    // which a batch's is, says why.
    if let (Some(e), Err(err)) = (batch.current.take(), &result) {
        if let Some(last) = batch.sent.last_mut().filter(|s| s.path == e.path && s.result.is_ok()) {
            last.result = Err(err.again());
        }
    }
    let bytes = batch.sent.iter().filter(|e| e.result.is_ok()).map(|e| e.size).sum();
    Ok(BatchReport { session, entries: batch.sent, skipped, bytes, total: start.elapsed(), result })
}

/// Adds `path` (stored as `under/name`) to `queue`: a file, or a directory's contents (sorted
/// by name) and then the directory. Symbolic links and special files go to `skipped`.
fn collect(
    path: &Path,
    under: Option<&str>,
    queue: &mut VecDeque<SourceEntry>,
    skipped: &mut Vec<(PathBuf, String)>,
) -> Result<(), Error> {
    let file_err = |e| Error::File { path: path.display().to_string(), source: e };
    // Inside a tree, what cannot be read or named is skipped and listed (as a link is): one
    // such name must not cost the rest of the batch. A path given by the caller is an error.
    let skip = |skipped: &mut Vec<(PathBuf, String)>, e: Error| {
        if under.is_none() {
            return Err(e);
        }
        let why = match e {
            Error::File { source, .. } => source.to_string(),
            e => e.to_string(),
        };
        skipped.push((path.to_path_buf(), why));
        Ok(())
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return skip(skipped, file_err(e)),
    };
    let name = match path.file_name().map(|n| n.to_str()) {
        Some(Some(n)) => n,
        Some(None) => return skip(skipped, Error::Usage(format!("{}: the name is not UTF-8", path.display()))),
        None => {
            // `.` or `/`: the directory's real name.
            let real = std::fs::canonicalize(path).map_err(file_err)?;
            return match real.file_name() {
                Some(_) => collect(&real, under, queue, skipped),
                None => Err(Error::Usage(format!("{}: send a directory with a name", path.display()))),
            };
        }
    };
    let rel = match under {
        Some(u) => format!("{u}/{name}"),
        None => name.to_owned(),
    };
    if let Err(why) = crate::name::check_path(&rel) {
        let why = if rel.len() > MAX_PATH_LEN { format!("path over {MAX_PATH_LEN} bytes") } else { why };
        skipped.push((path.to_path_buf(), why));
        return Ok(());
    }
    let ft = meta.file_type();
    if ft.is_dir() {
        let listed =
            std::fs::read_dir(path).and_then(|d| d.map(|e| e.map(|e| e.path())).collect::<Result<Vec<_>, _>>());
        let mut children = match listed {
            Ok(c) => c,
            Err(e) => return skip(skipped, file_err(e)),
        };
        children.sort();
        for c in children {
            collect(&c, Some(&rel), queue, skipped)?;
        }
        queue.push_back(SourceEntry { source: path.to_path_buf(), path: rel, meta });
    } else if ft.is_file() {
        queue.push_back(SourceEntry { source: path.to_path_buf(), path: rel, meta });
    } else {
        let what = if ft.is_symlink() { "a symbolic link" } else { "not a regular file or directory" };
        skipped.push((path.to_path_buf(), format!("{what}: not sent")));
    }
    Ok(())
}

impl SendSession<'_> {
    /// The machine asks for the next entry: the next file that opens (one that does not is
    /// listed with its error and skipped), or a directory, or the end of the batch.
    pub(crate) fn next_entry(&mut self) {
        let now = Instant::now();
        let (preserve, resume) = (self.opts.preserve, self.opts.resume);
        let Some(b) = self.batch.as_mut() else { return };
        while let Some(e) = b.queue.pop_front() {
            let flags = if preserve { entry_flags::MODE | entry_flags::MTIME } else { 0 };
            let mut entry = Entry {
                index: 0,
                kind: EntryKind::Directory,
                flags,
                mode: e.meta.permissions().mode() & 0o7777,
                mtime_sec: e.meta.mtime(),
                mtime_nsec: e.meta.mtime_nsec().clamp(0, 999_999_999) as u32,
                size: 0,
                resume: 0,
                path: e.path.clone(),
            };
            let mut sent = SentEntry {
                source: e.source.clone(),
                path: e.path.clone(),
                directory: e.meta.is_dir(),
                size: 0,
                result: Ok(()),
                resumed_from: 0,
            };
            if !e.meta.is_dir() {
                let (file, meta) = match open_regular(&e.source) {
                    Ok(f) => f,
                    Err(err) => {
                        b.done_bytes += e.meta.len();
                        sent.result = Err(err);
                        b.sent.push(sent);
                        continue;
                    }
                };
                entry.kind = EntryKind::File;
                entry.size = meta.len();
                entry.resume = if resume { resume_key(&e.path, &meta) } else { 0 };
                sent.size = meta.len();
                // The file as it is now: what the batch's total counted may have changed.
                b.total = b.total - e.meta.len().min(b.total) + meta.len();
                self.identity = Identity::of(&meta);
                self.size = meta.len();
                self.file = Some(file);
                self.path = e.source.clone();
                self.hasher.reset(self.machine.digest(), self.machine.digest_key().as_ref());
                self.held_hashed = false;
            }
            b.sent.push(sent);
            b.current = Some(e);
            self.machine.start_entry(entry, now);
            return;
        }
        self.machine.end_batch(now);
    }

    /// Records the bytes the receiver held of the entry in progress (its READY).
    pub(crate) fn note_resumed(&mut self) {
        let held = self.machine.resumed_from();
        if let Some(last) = self.batch.as_mut().and_then(|b| b.sent.last_mut()) {
            last.resumed_from = held;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// A batch cancelled while a file was on its way reports that file as cancelled (exit 8),
    /// as the batch is.
    #[test]
    fn the_entry_a_cancel_cut_is_cancelled() {
        let dir = scratch("cut");
        std::fs::write(dir.join("f"), b"data").unwrap();
        let meta = std::fs::metadata(dir.join("f")).unwrap();
        let entry = || SourceEntry { source: dir.join("f"), path: "f".into(), meta: meta.clone() };
        let sent = SentEntry {
            source: dir.join("f"),
            path: "f".into(),
            directory: false,
            size: 4,
            result: Ok(()),
            resumed_from: 0,
        };
        let batch =
            BatchState { queue: VecDeque::new(), current: Some(entry()), sent: vec![sent], done_bytes: 0, total: 4 };
        let now = Instant::now();
        let cfg = SenderConfig::new(1024, 4, std::time::Duration::from_secs(1));
        let machine = Sender::batch(1, 4, cfg, now).unwrap();
        let summary = crate::driver::send::SendSummary {
            machine,
            size: 4,
            session: 1,
            start: now,
            connect: std::time::Duration::ZERO,
            granted_at: None,
            lanes_at: None,
            data_end: None,
            fin_at: None,
        };
        let report = finish((Err(Error::Cancelled), summary, Some(batch)), Vec::new(), now).unwrap();
        assert!(matches!(report.result, Err(Error::Cancelled)), "{:?}", report.result);
        let cut = report.entries[0].result.as_ref().unwrap_err();
        assert!(matches!(cut, Error::Cancelled), "the cut entry: {cut:?}");
        assert_eq!(cut.exit_code(), 8);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-proto-walk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn walk(paths: &[PathBuf]) -> Result<(Vec<String>, Skipped), Error> {
        let (mut queue, mut skipped) = (VecDeque::new(), Vec::new());
        for p in paths {
            collect(p, None, &mut queue, &mut skipped)?;
        }
        Ok((queue.into_iter().map(|e| e.path).collect(), skipped))
    }

    #[test]
    fn progress_ends_at_the_total_when_a_file_changed_size_since_the_walk() {
        let d = scratch("grew");
        std::fs::write(d.join("f"), [0u8; 10]).unwrap();
        let meta = std::fs::symlink_metadata(d.join("f")).unwrap();
        let e = SourceEntry { source: d.join("f"), path: "f".into(), meta };
        // Offered at 25 bytes (it grew): `next_entry` moved the total to match.
        let sent = SentEntry {
            source: d.join("f"),
            path: "f".into(),
            directory: false,
            size: 25,
            result: Ok(()),
            resumed_from: 0,
        };
        let mut b = BatchState { queue: VecDeque::new(), current: Some(e), sent: vec![sent], done_bytes: 0, total: 25 };
        b.entry_done(Status::Ok, String::new(), 25);
        assert_eq!(b.done_bytes, b.total);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_dot_a_trailing_slash_and_dot_dot_send_the_directory_under_its_name() {
        let d = scratch("dot");
        std::fs::create_dir_all(d.join("top/sub")).unwrap();
        std::fs::write(d.join("top/sub/f"), b"x").unwrap();
        let want = vec!["top/sub/f".to_owned(), "top/sub".into(), "top".into()];
        for p in [d.join("top/"), d.join("top/."), d.join("top/sub/..")] {
            let (q, skipped) = walk(std::slice::from_ref(&p)).unwrap();
            assert_eq!(q, want, "{p:?}");
            assert!(skipped.is_empty());
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn links_fifos_bad_names_and_deep_paths_are_skipped_not_fatal() {
        let d = scratch("skip");
        let top = d.join("t");
        std::fs::create_dir(&top).unwrap();
        std::fs::write(top.join("ok"), b"x").unwrap();
        std::os::unix::fs::symlink(top.join("ok"), top.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("nowhere"), top.join("dangling")).unwrap();
        let (fifo, mode) = (top.join("fifo"), rustix::fs::Mode::from_raw_mode(0o644));
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
        // A name that is not UTF-8, a file and a directory.
        let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
        std::fs::write(top.join(bad), b"x").unwrap();
        std::fs::create_dir(top.join("dir")).unwrap();
        std::fs::create_dir(top.join("dir").join(bad)).unwrap();
        // A name the receiver would refuse.
        std::fs::write(top.join("x.rdcp-tmp"), b"x").unwrap();
        // A tree deeper than a path may be (over 960 bytes).
        let mut deep = top.join("deep");
        for _ in 0..6 {
            deep.push("d".repeat(200));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), b"x").unwrap();
        let (q, skipped) = walk(std::slice::from_ref(&top)).unwrap();
        let skipped: Vec<_> = skipped.iter().map(|(p, _)| p.strip_prefix(&top).unwrap().to_owned()).collect();
        assert!(q.contains(&"t/ok".to_owned()) && q.contains(&"t/dir".to_owned()) && q.last().unwrap() == "t", "{q:?}");
        assert!(q.iter().all(|p| crate::name::check_path(p).is_ok() && p.len() <= MAX_PATH_LEN), "{q:?}");
        assert_eq!(q.iter().filter(|p| p.starts_with("t/deep")).count(), 5, "{q:?}: the levels that fit");
        for s in ["link", "dangling", "fifo", "x.rdcp-tmp"] {
            assert!(skipped.contains(&PathBuf::from(s)), "{s}: {skipped:?}");
        }
        assert!(skipped.contains(&PathBuf::from(bad)), "{skipped:?}");
        assert!(skipped.contains(&Path::new("dir").join(bad)), "{skipped:?}");
        // Given by itself, a name that is not UTF-8 is the caller's error.
        assert!(matches!(walk(&[top.join(bad)]), Err(Error::Usage(_))));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
