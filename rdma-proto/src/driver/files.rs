//! The receiver's files: a temporary in the destination directory, renamed into place only
//! after the digest matched and the data is synced; removed on every failure.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::Status;

/// The status an I/O error on the receiver's files maps to.
pub(crate) fn io_status(e: &io::Error) -> Status {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Status::NoSpace,
        _ => Status::DiskIo,
    }
}

/// Temporaries of one session id tried before creating one fails.
const MAX_TEMP_TRIES: u32 = 64;

/// A file being received: `dir/.SESSION-N.rdcp-tmp` until [`commit`](Self::commit), `N` the
/// first number whose name is free (two senders may use one session id: both are served). The
/// temporary's name does not contain the file's, so every valid name (up to 255 bytes) fits,
/// and no valid name is a temporary's ([`crate::name::TEMP_SUFFIX`] is refused).
/// Dropping it uncommitted removes the temporary.
///
/// The details of its errors name files relative to the destination directory: they go to
/// the sender, which has no business knowing the receiver's paths.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) file: File,
    temp: PathBuf,
    target: PathBuf,
    /// The name the file is stored under, relative to the destination directory.
    name: String,
    overwrite: bool,
    committed: bool,
    /// Set when the temporary is a resumable partial.
    partial: Option<Partial>,
}

/// A resumable partial: `dir/.KEY.part.rdcp-tmp` holds the data, `dir/.KEY.meta.rdcp-tmp`
/// (the sidecar) says which file version it is of (key, size, name) and how many of its first
/// bytes are synced (`held`). The sidecar is replaced atomically (written to
/// `.KEY.meta-new.rdcp-tmp`, synced, renamed) after the data it vouches for is synced, so a
/// crash at any moment leaves a sidecar that undercounts, never one that overcounts. The data
/// file is locked (`flock`) while a session writes it.
#[derive(Debug)]
struct Partial {
    meta: PathBuf,
    key: u64,
    size: u64,
    /// Keep it when the session ends uncommitted (it failed in a way a resume can follow).
    keep: bool,
}

/// The first line of a sidecar.
const META_MAGIC: &str = "rdcp-partial 1";

impl Incoming {
    /// Creates the temporary (exclusively) for `name`.
    ///
    /// # Errors
    /// [`Status::Exists`] when `name` exists and `overwrite` is off; the I/O status otherwise.
    pub(crate) fn create(dir: &Path, name: &str, session: u64, overwrite: bool) -> Result<Self, (Status, String)> {
        let target = dir.join(name);
        if !overwrite && target.symlink_metadata().is_ok() {
            return Err((Status::Exists, format!("{name} exists")));
        }
        let mut n = 0u32;
        loop {
            let temp_name = format!(".{session:016x}-{n}{}", crate::name::TEMP_SUFFIX);
            let temp = dir.join(&temp_name);
            match OpenOptions::new().write(true).create_new(true).mode(0o644).open(&temp) {
                Ok(file) => {
                    return Ok(Incoming {
                        file,
                        temp,
                        target,
                        name: name.to_owned(),
                        overwrite,
                        committed: false,
                        partial: None,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < MAX_TEMP_TRIES => n += 1,
                Err(e) => return Err((io_status(&e), format!("creating the temporary {temp_name}: {e}"))),
            }
        }
    }

    /// Opens (or creates) the resumable partial of the file version `key` names: its data file
    /// locked for this session, and the bytes a valid sidecar vouches for (0 when there is none,
    /// or it is of another name or size, or claims more than the data file holds). Removes
    /// partials whose sidecar (or, without one, data) was last written more than `ttl` ago.
    ///
    /// # Errors
    /// [`Status::Exists`] as [`create`](Self::create); [`Status::Busy`] while another session
    /// writes this partial; the I/O status otherwise.
    pub(crate) fn resumable(
        dir: &Path,
        name: &str,
        size: u64,
        key: u64,
        overwrite: bool,
        ttl: std::time::Duration,
    ) -> Result<(Self, u64), (Status, String)> {
        let target = dir.join(name);
        if !overwrite && target.symlink_metadata().is_ok() {
            return Err((Status::Exists, format!("{name} exists")));
        }
        sweep_partials(dir, ttl);
        let (data_name, meta_name) = partial_names(key);
        let temp = dir.join(&data_name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&temp)
            .map_err(|e| (io_status(&e), format!("opening the partial {data_name}: {e}")))?;
        // SAFETY: a valid descriptor; `flock` only takes an advisory lock on it.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err((Status::Busy, format!("another transfer of {name} is in progress")));
        }
        let meta = dir.join(&meta_name);
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let held = read_meta(&meta).filter(|m| m.key == key && m.size == size && m.name == name && m.held <= len);
        let held = held.map_or(0, |m| m.held);
        let partial = Partial { meta, key, size, keep: false };
        let name = name.to_owned();
        let incoming = Incoming { file, temp, target, name, overwrite, committed: false, partial: Some(partial) };
        Ok((incoming, held))
    }

    /// Whether this is a resumable partial.
    pub(crate) fn is_partial(&self) -> bool {
        self.partial.is_some()
    }

    /// Records that the first `held` bytes are written: syncs them, then the sidecar that says
    /// so. A no-op for a plain temporary.
    ///
    /// # Errors
    /// The I/O error; the previous sidecar then stays (it undercounts, which is safe).
    pub(crate) fn checkpoint(&self, held: u64) -> io::Result<()> {
        let Some(p) = &self.partial else { return Ok(()) };
        self.file.sync_data()?;
        let text = format!("{META_MAGIC}\nkey={:016x}\nsize={}\nheld={held}\nname={}\n", p.key, p.size, self.name);
        let dir = self.target.parent().unwrap_or(Path::new("."));
        let new = dir.join(format!(".{:016x}.meta-new{}", p.key, crate::name::TEMP_SUFFIX));
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&new)?;
        io::Write::write_all(&mut f, text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&new, &p.meta)
    }

    /// Keeps the partial when the session ends uncommitted, with the first `held` bytes
    /// vouched for (checkpointed now). A plain temporary is removed as always.
    pub(crate) fn keep(&mut self, held: u64) {
        // Not when the file arrived meanwhile (another session of it, served while this one
        // held the partial): nothing would continue it.
        let arrived = !self.overwrite && self.target.symlink_metadata().is_ok();
        if self.partial.is_some() && !arrived && self.checkpoint(held).is_ok() {
            if let Some(p) = &mut self.partial {
                p.keep = true;
            }
        }
    }

    /// Syncs the data and renames the temporary into place (without replacing an existing file
    /// unless `overwrite`), then syncs the directory. With a batch's `entry`, its mode and
    /// modification time are applied first (after the last write: a truncation would change
    /// the time again).
    ///
    /// # Errors
    /// The status and a sentence; the temporary is then removed when `self` drops.
    pub(crate) fn commit(mut self, entry: Option<&crate::wire::Entry>) -> Result<(), (Status, String)> {
        let io = |what: &str, e: io::Error| (io_status(&e), format!("{what}: {e}"));
        if let Some(p) = &self.partial {
            // A partial may hold bytes past the file's end from an earlier, longer write.
            self.file.set_len(p.size).map_err(|e| io("truncating the partial", e))?;
        }
        if let Some(e) = entry {
            apply_meta(&self.file, e).map_err(|err| io("setting the mode and time", err))?;
        }
        self.file.sync_all().map_err(|e| io("fsync", e))?;
        if self.overwrite {
            std::fs::rename(&self.temp, &self.target).map_err(|e| io("rename", e))?;
        } else {
            rename_noreplace(&self.temp, &self.target).map_err(|e| {
                if e.raw_os_error() == Some(libc::EEXIST) {
                    (Status::Exists, format!("{} appeared meanwhile", self.name))
                } else {
                    io("rename", e)
                }
            })?;
        }
        self.committed = true;
        if let Some(p) = &self.partial {
            let _ = std::fs::remove_file(&p.meta);
        }
        if let Some(dir) = self.target.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(|e| {
                let (status, why) = io("fsync of the directory", e);
                (status, format!("the file is in place, but not known durable: {why}"))
            })?;
        }
        Ok(())
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.committed || self.partial.as_ref().is_some_and(|p| p.keep) {
            return;
        }
        let _ = std::fs::remove_file(&self.temp);
        if let Some(p) = &self.partial {
            let _ = std::fs::remove_file(&p.meta);
        }
    }
}

/// Makes the directories `components` name under `dest`, one level at a time (mode 0755
/// before the umask), and returns the last one's path. Nothing is followed: a component that
/// is a symbolic link is refused (`BadName`), one that is not a directory too (`Exists`), so
/// a sender's path never leads out of `dest`, whatever links the destination holds. A local
/// user who swaps a directory for a link between this check and the file's creation is
/// outside this promise (the sender is the one it guards against).
///
/// # Errors
/// The status and a sentence naming the path relative to `dest`.
pub(crate) fn make_dirs(dest: &Path, components: &[&str], made: &mut MadeDirs) -> Result<PathBuf, (Status, String)> {
    let mut at = dest.to_path_buf();
    let mut rel = String::new();
    for c in components {
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(c);
        at.push(c);
        match at.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => {
                return Err((Status::BadName, format!("{rel} is a symbolic link on the receiver: not followed")))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err((Status::Exists, format!("{rel} exists and is not a directory"))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(&at) {
                Ok(()) => made.note(&at),
                // Made meanwhile by another session: checked again as above.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    if !at.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                        return Err((Status::Exists, format!("{rel} exists and is not a directory")));
                    }
                }
                Err(e) => return Err((io_status(&e), format!("making {rel}: {e}"))),
            },
            Err(e) => return Err((io_status(&e), format!("{rel}: {e}"))),
        }
    }
    Ok(at)
}

/// The directories a session made (by device and inode, at most [`MadeDirs::MAX`]): only
/// those take a directory entry's mode and time, so that a sender cannot change those of
/// directories that were there before it (a `.ssh` made world-writable), unless overwriting
/// is on.
#[derive(Debug, Default)]
pub(crate) struct MadeDirs(std::collections::HashSet<(u64, u64)>);

impl MadeDirs {
    /// Directories remembered; those made past it keep the receiver's mode and time.
    const MAX: usize = 1 << 20;

    fn note(&mut self, dir: &Path) {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = dir.symlink_metadata() {
            if self.0.len() < Self::MAX {
                self.0.insert((m.dev(), m.ino()));
            }
        }
    }

    fn contains(&self, m: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.0.contains(&(m.dev(), m.ino()))
    }
}

/// A batch's directory entry `name` in `dir` (its parents made): made unless it is there (a
/// link or a file there is refused as by [`make_dirs`]), then given the entry's mode and
/// time when this session made it, or `overwrite` is on; an existing directory otherwise
/// keeps its own.
///
/// # Errors
/// The status and a sentence naming the path relative to the destination (`rel`).
pub(crate) fn make_dir_entry(
    dir: &Path,
    name: &str,
    e: &crate::wire::Entry,
    overwrite: bool,
    made: &mut MadeDirs,
) -> Result<(), (Status, String)> {
    // Its details name the entry by its whole path, not by its last component.
    let whole = |(status, why): (Status, String)| match why.strip_prefix(name) {
        Some(rest) => (status, format!("{}{rest}", e.path)),
        None => (status, why),
    };
    let d = make_dirs(dir, &[name], made).map_err(whole)?;
    let f = File::open(&d).map_err(|err| (io_status(&err), format!("{}: {err}", e.path)))?;
    let m = f.metadata().map_err(|err| (io_status(&err), format!("{}: {err}", e.path)))?;
    if overwrite || made.contains(&m) {
        apply_meta(&f, e).map_err(|err| (io_status(&err), format!("{}: {err}", e.path)))?;
    }
    Ok(())
}

/// The permission bits and modification time an entry asks for (its `flags`), applied to
/// `fd`: the received file before it is renamed into place, or a directory. Only the
/// permission bits (`0o777`) are kept: no set-id or sticky bit comes from a peer.
pub(crate) fn apply_meta(fd: &impl AsRawFd, e: &crate::wire::Entry) -> io::Result<()> {
    use crate::wire::entry_flags;
    if e.flags & entry_flags::MODE != 0 {
        // SAFETY: a valid descriptor; fchmod reads nothing from our memory.
        if unsafe { libc::fchmod(fd.as_raw_fd(), (e.mode & 0o777) as libc::mode_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if e.flags & entry_flags::MTIME != 0 {
        let omit = libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT };
        let mtime = libc::timespec { tv_sec: e.mtime_sec as libc::time_t, tv_nsec: i64::from(e.mtime_nsec) as _ };
        let times = [omit, mtime];
        // SAFETY: a valid descriptor and two timespecs that live across the call.
        if unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Removes the partial of `key` in `dir` unless a session holds it: the file it was of has
/// just been committed by a session that could not use it. Best effort.
pub(crate) fn drop_partial(dir: &Path, key: u64) {
    let (data_name, meta_name) = partial_names(key);
    let data = dir.join(data_name);
    let Ok(f) = File::open(&data) else { return };
    // SAFETY: a valid descriptor; an advisory lock, released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        let _ = std::fs::remove_file(dir.join(meta_name));
        let _ = std::fs::remove_file(&data);
    }
}

/// The data and sidecar names of the partial of key `key`. Both end with
/// [`crate::name::TEMP_SUFFIX`], which no sender's name may.
fn partial_names(key: u64) -> (String, String) {
    let s = crate::name::TEMP_SUFFIX;
    (format!(".{key:016x}.part{s}"), format!(".{key:016x}.meta{s}"))
}

/// A sidecar's contents.
#[derive(Debug, PartialEq, Eq)]
struct Meta {
    key: u64,
    size: u64,
    held: u64,
    name: String,
}

/// Reads a sidecar; `None` when it is missing or not one.
fn read_meta(path: &Path) -> Option<Meta> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    if lines.next()? != META_MAGIC {
        return None;
    }
    let mut field = |k: &str| lines.next()?.strip_prefix(k)?.strip_prefix('=').map(str::to_owned);
    let key = u64::from_str_radix(&field("key")?, 16).ok()?;
    let size = field("size")?.parse().ok()?;
    let held = field("held")?.parse().ok()?;
    let name = field("name")?;
    Some(Meta { key, size, held, name })
}

/// Removes the partials of `dir` last written more than `ttl` ago (their sidecar's time, or
/// the data's without one), unless a session holds them. Best effort: errors are ignored.
pub(crate) fn sweep_partials(dir: &Path, ttl: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let suffix = format!(".part{}", crate::name::TEMP_SUFFIX);
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(n) = file_name.to_str() else { continue };
        let Some(hex) = n.strip_prefix('.').and_then(|n| n.strip_suffix(&suffix)) else { continue };
        let Ok(key) = u64::from_str_radix(hex, 16) else { continue };
        let (data_name, meta_name) = partial_names(key);
        let (data, meta) = (dir.join(data_name), dir.join(meta_name));
        let age = |p: &Path| p.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        let Some(age) = age(&meta).or_else(|| age(&data)) else { continue };
        if age <= ttl {
            continue;
        }
        let Ok(f) = File::open(&data) else { continue };
        // SAFETY: a valid descriptor; an advisory lock, released when `f` closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_file(&meta);
            let _ = std::fs::remove_file(&data);
        }
    }
}

/// `renameat2(RENAME_NOREPLACE)`: fails with `EEXIST` rather than replace `to`.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL));
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated paths that live across the call.
    let r =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-proto-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        v.sort();
        v
    }

    const DAY: Duration = Duration::from_secs(86_400);

    fn dir_entry(path: &str, mode: u32, mtime_sec: i64) -> crate::wire::Entry {
        use crate::wire::{entry_flags, Entry, EntryKind};
        let flags = entry_flags::MODE | entry_flags::MTIME;
        Entry {
            index: 0,
            kind: EntryKind::Directory,
            flags,
            mode,
            mtime_sec,
            mtime_nsec: 5,
            size: 0,
            resume: 0,
            path: path.into(),
        }
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        p.symlink_metadata().unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn make_dirs_follows_no_link_and_refuses_a_file() {
        let d = scratch("mkdirs");
        let outside = scratch("mkdirs-outside");
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling")).unwrap();
        std::fs::write(d.join("file"), b"x").unwrap();
        std::fs::create_dir(d.join("there")).unwrap();
        let mut made = MadeDirs::default();
        for (path, status) in [
            (&["link", "x"][..], Status::BadName),
            (&["link"][..], Status::BadName),
            (&["dangling", "x"][..], Status::BadName),
            (&["file", "x"][..], Status::Exists),
            (&["file"][..], Status::Exists),
        ] {
            let (s, why) = make_dirs(&d, path, &mut made).unwrap_err();
            assert_eq!(s, status, "{path:?}: {why}");
            assert!(!why.contains(d.to_str().unwrap()), "{why}: names the receiver's own path");
        }
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing made through the link");
        assert!(!d.join("nowhere").exists(), "nothing made through the dangling link");
        assert_eq!(make_dirs(&d, &["there", "a", "b"], &mut made).unwrap(), d.join("there/a/b"));
        assert!(d.join("there/a/b").is_dir());
        assert_eq!(made.0.len(), 2, "there was not made, a and b were");
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn apply_meta_keeps_only_the_permission_bits() {
        let d = scratch("meta");
        let f = File::create(d.join("f")).unwrap();
        let mut e = dir_entry("f", 0o7755, 1_000_000);
        apply_meta(&f, &e).unwrap();
        assert_eq!(mode_of(&d.join("f")), 0o755, "no set-uid, set-gid or sticky bit");
        let m = d.join("f").metadata().unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_000_000, 5));
        e.flags = 0;
        e.mode = 0o600;
        apply_meta(&f, &e).unwrap();
        assert_eq!(mode_of(&d.join("f")), 0o755, "without its flag, no mode is applied");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_entry_sets_the_mode_only_of_a_directory_this_session_made() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("direntry");
        std::fs::create_dir(d.join("old")).unwrap();
        std::fs::set_permissions(d.join("old"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("file"), b"x").unwrap();
        let mut made = MadeDirs::default();
        // A directory that was there keeps its mode (a sender cannot open up a `.ssh`).
        make_dir_entry(&d, "old", &dir_entry("old", 0o777, 7), false, &mut made).unwrap();
        assert_eq!(mode_of(&d.join("old")), 0o700);
        // One made now, or made earlier in the session as a parent, takes the entry's.
        make_dir_entry(&d, "new", &dir_entry("new", 0o750, 7), false, &mut made).unwrap();
        assert_eq!(mode_of(&d.join("new")), 0o750);
        make_dirs(&d, &["parent", "child"], &mut made).unwrap();
        make_dir_entry(&d.join("parent"), "child", &dir_entry("parent/child", 0o711, 7), false, &mut made).unwrap();
        make_dir_entry(&d, "parent", &dir_entry("parent", 0o751, 7), false, &mut made).unwrap();
        assert_eq!((mode_of(&d.join("parent/child")), mode_of(&d.join("parent"))), (0o711, 0o751));
        // With overwriting on, the sender may change what is there.
        make_dir_entry(&d, "old", &dir_entry("old", 0o755, 7), true, &mut MadeDirs::default()).unwrap();
        assert_eq!(mode_of(&d.join("old")), 0o755);
        // A directory entry over a file, or a link, is refused; the file stays.
        let (s, _) = make_dir_entry(&d, "file", &dir_entry("file", 0o755, 7), true, &mut made).unwrap_err();
        assert_eq!(s, Status::Exists);
        assert_eq!(std::fs::read(d.join("file")).unwrap(), b"x");
        std::os::unix::fs::symlink(d.join("old"), d.join("l")).unwrap();
        let (s, _) = make_dir_entry(&d, "l", &dir_entry("l", 0o777, 7), true, &mut made).unwrap_err();
        assert_eq!(s, Status::BadName);
        assert_eq!(mode_of(&d.join("old")), 0o755);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_kept_partial_is_found_again_with_what_it_vouched_for() {
        let d = scratch("keep");
        let (mut a, held) = Incoming::resumable(&d, "f", 100, 7, false, DAY).unwrap();
        assert_eq!(held, 0);
        std::os::unix::fs::FileExt::write_all_at(&a.file, &[1; 60], 0).unwrap();
        // While a session holds it, another is told Busy.
        assert_eq!(Incoming::resumable(&d, "f", 100, 7, false, DAY).unwrap_err().0, Status::Busy);
        a.keep(40);
        drop(a);
        assert_eq!(listing(&d), [".0000000000000007.meta.rdcp-tmp", ".0000000000000007.part.rdcp-tmp"]);
        let (b, held) = Incoming::resumable(&d, "f", 100, 7, false, DAY).unwrap();
        assert_eq!(held, 40, "the sidecar's count, not the data's length");
        // Another size, name or key does not take it.
        drop(b);
        for (name, size, key) in [("g", 100, 7), ("f", 101, 7)] {
            let (c, held) = Incoming::resumable(&d, name, size, key, false, DAY).unwrap();
            assert_eq!(held, 0, "{name} {size} {key}");
            drop(c); // not kept: removed, sidecar and all
        }
        assert!(listing(&d).is_empty(), "{:?}", listing(&d));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_committed_partial_leaves_only_the_file_cut_to_its_size() {
        let d = scratch("commit");
        let (a, _) = Incoming::resumable(&d, "f", 10, 9, false, DAY).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&a.file, &[5; 16], 0).unwrap();
        a.checkpoint(10).unwrap();
        a.commit(None).unwrap();
        assert_eq!(listing(&d), ["f"]);
        assert_eq!(std::fs::read(d.join("f")).unwrap(), [5; 10]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_committed_partial_keeps_the_entry_s_mode_and_time_without_set_id_bits() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = scratch("meta");
        let (a, _) = Incoming::resumable(&d, "f", 4, 5, false, DAY).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&a.file, &[7; 4], 0).unwrap();
        let e = crate::wire::Entry {
            index: 0,
            kind: crate::wire::EntryKind::File,
            flags: crate::wire::entry_flags::MODE | crate::wire::entry_flags::MTIME,
            mode: 0o4751,
            mtime_sec: 1_600_000_000,
            mtime_nsec: 5,
            size: 4,
            resume: 5,
            path: "f".into(),
        };
        // The partial is cut to its size at the commit: the time must be set after that.
        a.commit(Some(&e)).unwrap();
        let m = std::fs::metadata(d.join("f")).unwrap();
        assert_eq!((m.mtime(), m.mtime_nsec()), (1_600_000_000, 5));
        assert_eq!(m.permissions().mode() & 0o7777, 0o751);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn stale_partials_expire_and_held_ones_do_not() {
        let d = scratch("sweep");
        let (mut a, _) = Incoming::resumable(&d, "f", 10, 1, false, DAY).unwrap();
        a.keep(0);
        drop(a);
        let (held, _) = Incoming::resumable(&d, "g", 10, 2, false, DAY).unwrap();
        sweep_partials(&d, Duration::ZERO);
        assert_eq!(listing(&d), [".0000000000000002.part.rdcp-tmp"], "the held one stays");
        drop(held);
        assert!(listing(&d).is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_sidecar_that_claims_more_than_the_data_holds_is_ignored() {
        let d = scratch("claims");
        let (mut a, _) = Incoming::resumable(&d, "f", 100, 3, false, DAY).unwrap();
        a.keep(90); // nothing was written: the data file is empty
        drop(a);
        let (_b, held) = Incoming::resumable(&d, "f", 100, 3, false, DAY).unwrap();
        assert_eq!(held, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
