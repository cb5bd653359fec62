//! The source of a send: the file opened and checked (a regular file, with the size it
//! reports), what tells it changed while it was sent, its resume key, and the machine made for
//! it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Instant;

use crate::driver::Error;
use crate::sender::{Sender, SenderConfig};

use super::{session_id, SendOptions};

/// The file to send, opened and checked, and the machine made for it (for a batch: no file
/// yet, and the batch's machine).
pub(crate) struct SourceFile {
    pub(crate) file: Option<std::fs::File>,
    pub(crate) size: u64,
    pub(crate) session: u64,
    pub(crate) machine: Sender,
    pub(crate) identity: Identity,
    /// The chunk size it is sent with ([`fitted_chunk`](super::fitted_chunk)).
    pub(crate) chunk: u32,
}

impl SourceFile {
    pub(crate) fn open(path: &Path, opts: &SendOptions) -> Result<Self, Error> {
        let name = match &opts.name {
            Some(n) => n.clone(),
            None => match path.file_name().map(|n| n.to_str()) {
                Some(Some(n)) => n.to_owned(),
                Some(None) => {
                    return Err(Error::Usage(format!("{}: the file name is not UTF-8: give a name", path.display())))
                }
                None => return Err(Error::Usage(format!("{}: no file name: give a name", path.display()))),
            },
        };
        let offer = offered_versions(opts);
        if offer.is_none() {
            crate::name::check(&name).map_err(|why| Error::Usage(format!("{name:?}: {why}")))?;
        }
        let (file, meta) = open_regular(path)?;
        let size = meta.len();
        let session = test_session(opts).unwrap_or_else(session_id);
        let chunk = super::fitted_chunk(opts.chunk, size);
        let mut cfg = SenderConfig::new(chunk, opts.depth, opts.timeout);
        // The connection's QP allows remote writes (`connect`): the receiver may probe it.
        cfg.probes = true;
        cfg.secret = opts.secret.clone();
        cfg.lanes = opts.lanes;
        cfg.resume_key = opts.resume.then(|| resume_key(&name, &meta));
        let machine = match offer {
            None => Sender::new(session, &name, size, cfg, Instant::now())?,
            Some(v) => Sender::offering(session, &name, size, cfg, Instant::now(), v)?,
        }
        .with_nonce(crate::driver::random_bytes());
        tracing::info!(session = format_args!("{session:016x}"), %name, size, to = %opts.to, "sending");
        Ok(SourceFile { file: Some(file), size, session, machine, identity: Identity::of(&meta), chunk })
    }
}

/// Opens `path` for sending and checks it is a regular file with the size it reports.
pub(crate) fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), Error> {
    let file_err = |e| Error::File { path: path.display().to_string(), source: e };
    // Non-blocking, so that a FIFO does not hang the open; then only regular files are sent
    // (a device or /proc file reports no size, a directory no data).
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(file_err)?;
    let meta = file.metadata().map_err(file_err)?;
    if !meta.is_file() {
        return Err(file_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
    }
    if meta.len() == 0 && has_data(&file).map_err(file_err)? {
        // /proc and some other pseudo-files report a size of 0 and yield data: sent as
        // what they report, they would arrive empty.
        let why = "reports a size of 0 but has data (a /proc or /sys file?): copy it to a regular file first";
        return Err(file_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, why)));
    }
    Ok((file, meta))
}

/// What tells a file changed since it was opened, as rsync and tar tell it: its inode, size,
/// modification and status-change times. Compared once every chunk was read, before the FIN:
/// a source rewritten while it was read would otherwise be stored torn, with a digest that
/// matches the torn bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Identity {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) mtime: (i64, i64),
    pub(crate) ctime: (i64, i64),
}

impl Identity {
    pub(crate) fn of(m: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The key of this version of a file, which a receiver's partial of it carries: a hash of the
/// name it is stored under, its size, device, inode and modification time (another file, or
/// this one changed, has another key).
pub(crate) fn resume_key(name: &str, meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(b"rdcp resume key v1\0");
    h.update(name.as_bytes());
    for v in [meta.size(), meta.dev(), meta.ino(), meta.mtime() as u64, meta.mtime_nsec() as u64] {
        h.update(&v.to_be_bytes());
    }
    h.digest()
}

/// Whether a file that reports a size of 0 yields data when read.
pub(crate) fn has_data(file: &std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 1];
    loop {
        match file.read_at(&mut b, 0) {
            Ok(n) => return Ok(n > 0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The protocol versions a test sender offers instead of this build's (and then sends its
/// name unchecked): the test hook [`SendOptions::test_offer`].
#[cfg(feature = "fault-injection")]
pub(crate) fn offered_versions(opts: &SendOptions) -> Option<std::ops::RangeInclusive<u16>> {
    opts.test_offer.clone()
}

/// The session id a test sender uses instead of a random one ([`SendOptions::test_session`]).
#[cfg(feature = "fault-injection")]
pub(crate) fn test_session(opts: &SendOptions) -> Option<u64> {
    opts.test_session
}

/// Without fault injection every session id is random.
#[cfg(not(feature = "fault-injection"))]
pub(crate) fn test_session(_: &SendOptions) -> Option<u64> {
    None
}

/// Without fault injection a sender offers this build's versions.
#[cfg(not(feature = "fault-injection"))]
pub(crate) fn offered_versions(_: &SendOptions) -> Option<std::ops::RangeInclusive<u16>> {
    None
}
