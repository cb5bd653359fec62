//! The receiver's files: a temporary in the destination directory, renamed into place only
//! after the digest matched and the data is synced; removed on every failure.
//!
//! Every call here is relative to an open directory ([`DirFd`]: the destination, or a batch's
//! directory under it, opened one component at a time) and follows no symbolic link: no name
//! a sender chooses, and no link or hard link a local user plants at a temporary's, partial's
//! or sidecar's name, makes the receiver touch a file outside its destination
//! ([`docs/protocol.md`, "Threat model"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md#threat-model)).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, RenameFlags};

use crate::Status;

/// An open directory: the destination, or a directory under it.
pub(crate) type DirFd = Arc<OwnedFd>;

/// The status an I/O error on the receiver's files maps to.
pub(crate) fn io_status(e: &io::Error) -> Status {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Status::NoSpace,
        _ => Status::DiskIo,
    }
}

/// Temporaries of one session id tried before creating one fails.
const MAX_TEMP_TRIES: u32 = 64;

/// How every file of the receiver is opened: never through a link at the last component,
/// never inherited by a child.
const NOFOLLOW: OFlags = OFlags::NOFOLLOW.union(OFlags::CLOEXEC);

/// A received file's mode before the umask, when no mode came with it.
const FILE_MODE: Mode = Mode::from_raw_mode(0o644);

/// Every file the receiver makes before it is put in place (temporaries, partials, sidecars):
/// its user's alone, so that no one who may merely read the destination reads a file (or
/// holds it open) before it has its own mode: made with the final file's default mode, a file
/// sent as 0600 could be read while it arrived.
const TEMP_MODE: Mode = Mode::from_raw_mode(0o600);

/// [`FILE_MODE`] under the process's umask, read once from `/proc/self/status` (not by
/// `umask(2)`, which would change it for the other threads meanwhile); 022 when it cannot be
/// read.
fn file_mode() -> Mode {
    static UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let umask = *UMASK.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = status.lines().find_map(|l| l.strip_prefix("Umask:"));
        field.and_then(|m| u32::from_str_radix(m.trim(), 8).ok()).unwrap_or(0o022)
    });
    Mode::from_raw_mode(FILE_MODE.as_raw_mode() & !umask & 0o777)
}

/// A new directory's mode before the umask (as `mkdir(1)`).
const DIR_MODE: Mode = Mode::from_raw_mode(0o777);

/// A file being received: `.SESSION-N.rdcp-tmp` in its directory until
/// [`commit`](Self::commit), `N` the first number whose name is free (two senders may use one
/// session id: both are served). The temporary's name does not contain the file's, so every
/// valid name (up to 255 bytes) fits, and no valid name is a temporary's
/// ([`crate::name::TEMP_SUFFIX`] is refused). Dropping it uncommitted removes the temporary.
///
/// The details of its errors name files relative to the destination directory: they go to
/// the sender, which has no business knowing the receiver's paths.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) file: File,
    /// The directory the file goes in.
    dir: DirFd,
    /// The temporary's name in `dir`.
    temp: String,
    /// The file's name in `dir`.
    target: String,
    /// The name the file is stored under, relative to the destination directory.
    name: String,
    overwrite: bool,
    committed: bool,
    /// Set when the temporary is a resumable partial.
    partial: Option<Partial>,
}

/// A resumable partial: `.KEY.part.rdcp-tmp` holds the data, `.KEY.meta.rdcp-tmp` (the
/// sidecar) says which file version it is of (key, size, name) and how many of its first
/// bytes are synced (`held`). The sidecar is replaced atomically (written to
/// `.KEY.meta-new.rdcp-tmp`, synced, renamed) after the data it vouches for is synced, so a
/// crash at any moment leaves a sidecar that undercounts, never one that overcounts. The data
/// file is locked (`flock`) while a session writes it.
#[derive(Debug)]
struct Partial {
    key: u64,
    size: u64,
    /// Keep it when the session ends uncommitted (it failed in a way a resume can follow).
    keep: bool,
    /// The bytes its sidecar vouched for when this session took it.
    vouched: u64,
}

/// The first line of a sidecar.
const META_MAGIC: &str = "rdcp-partial 1";

/// Whether something is at `name` in `dir` (a link counts: it is not followed).
fn exists(dir: &DirFd, name: &str) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

/// Whether `file` is one this process may take as its own partial: a regular file it owns
/// with no other name. A file a local user planted (their own, or a hard link to someone
/// else's) is not one.
fn is_own_private_file(file: &impl AsFd) -> bool {
    rustix::fs::fstat(file).is_ok_and(|st| is_own_private(&st))
}

/// [`is_own_private_file`] of a file's status.
fn is_own_private(st: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
        && st.st_nlink == 1
        && st.st_uid == rustix::process::geteuid().as_raw()
}

/// Opens `name` in `dir` for reading and writing when it is this process's own private file
/// ([`is_own_private_file`]); anything else there (a link, a planted file, a directory) is
/// removed when it can be, and `None` returned.
fn open_own(dir: &DirFd, name: &str, write: bool) -> Option<File> {
    let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
    // NONBLOCK: a FIFO planted at the name must not block the open.
    match rustix::fs::openat(dir, name, access | NOFOLLOW | OFlags::NONBLOCK, Mode::empty()) {
        Ok(fd) if is_own_private_file(&fd) => {
            let file = File::from(fd);
            // Back to blocking I/O (regular files ignore the flag; this only keeps it tidy).
            let _ = rustix::fs::fcntl_setfl(&file, OFlags::empty());
            Some(file)
        }
        Err(e) if e == rustix::io::Errno::NOENT => None,
        _ => {
            let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
            None
        }
    }
}

/// What a partial's data file takes on disk, as the ledger counts it: its allocated blocks,
/// at most its length (a sparse file's length is not what it takes).
fn occupied(st: &rustix::fs::Stat) -> u64 {
    (st.st_size as u64).min((st.st_blocks as u64).saturating_mul(512))
}

/// Whether `name` in `dir` (not followed) is `file` itself: the same device and inode.
fn is_same_file(dir: &DirFd, name: &str, file: &File) -> bool {
    match (rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW), rustix::fs::fstat(file)) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

/// Creates `name` in `dir`, exclusively (nothing there is followed or reused).
fn create_new(dir: &DirFd, name: &str) -> io::Result<File> {
    let fd = rustix::fs::openat(dir, name, OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | NOFOLLOW, TEMP_MODE)?;
    Ok(File::from(fd))
}

impl Incoming {
    /// Creates the temporary (exclusively) for `name` in `dir`; `rel` is its path relative to
    /// the destination.
    ///
    /// # Errors
    /// [`Status::Exists`] when `name` exists and `overwrite` is off; the I/O status otherwise.
    pub(crate) fn create(
        dir: &DirFd,
        name: &str,
        rel: &str,
        session: u64,
        overwrite: bool,
    ) -> Result<Self, (Status, String)> {
        if !overwrite && exists(dir, name) {
            return Err((Status::Exists, format!("{rel} exists")));
        }
        let mut n = 0u32;
        loop {
            let temp = format!(".{session:016x}-{n}{}", crate::name::TEMP_SUFFIX);
            match create_new(dir, &temp) {
                Ok(file) => {
                    return Ok(Incoming {
                        file,
                        dir: dir.clone(),
                        temp,
                        target: name.to_owned(),
                        name: rel.to_owned(),
                        overwrite,
                        committed: false,
                        partial: None,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < MAX_TEMP_TRIES => n += 1,
                Err(e) => return Err((io_status(&e), format!("creating the temporary {temp}: {e}"))),
            }
        }
    }

    /// Opens (or creates) the resumable partial of the file version `key` names: its data file
    /// locked for this session, and the bytes a valid sidecar vouches for (0 when there is none,
    /// or it claims more than the data file holds). A partial whose sidecar names another name
    /// or size is not touched: `Busy` (the caller serves the file from a plain temporary,
    /// leaving the partial to its owner). A data file
    /// that is not this process's own ([`is_own_private_file`]: a link or a file a local user
    /// planted) is removed and a new one made. With `sweep`, first removes the directory's
    /// partials whose sidecar (or, without one, data) was last written more than that ago.
    ///
    /// # Errors
    /// [`Status::Exists`] as [`create`](Self::create); [`Status::Busy`] while another session
    /// writes this partial, or when it is of another file; the I/O status otherwise.
    pub(crate) fn resumable(
        dir: &DirFd,
        name: &str,
        rel: &str,
        size: u64,
        key: u64,
        overwrite: bool,
        sweep: Option<std::time::Duration>,
    ) -> Result<(Self, u64), (Status, String)> {
        if !overwrite && exists(dir, name) {
            return Err((Status::Exists, format!("{rel} exists")));
        }
        if let Some(ttl) = sweep {
            sweep_partials(dir, ttl);
        }
        if !keeps_names(dir) {
            return Err((Status::Busy, format!("the directory of {rel} is one other users may rename files in")));
        }
        let (data_name, meta_name) = partial_names(key);
        let file = match open_own(dir, &data_name, true) {
            Some(f) => f,
            None => create_new(dir, &data_name)
                .map_err(|e| (io_status(&e), format!("opening the partial {data_name}: {e}")))?,
        };
        if rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err((Status::Busy, format!("another transfer of {rel} is in progress")));
        }
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let meta = read_meta(dir, &meta_name);
        if meta.as_ref().is_some_and(|m| m.key == key && (m.size != size || m.name != rel)) {
            // The partial of another file under this key: a sender that saw the key (in `ls -a`
            // or a HELLO) and offers another name or size. Left alone, it is not this one's.
            return Err((Status::Busy, format!("the partial under this key is of another file than {rel}")));
        }
        let held = meta.filter(|m| m.key == key && m.held <= len).map_or(0, |m| m.held);
        let incoming = Incoming {
            file,
            dir: dir.clone(),
            temp: data_name,
            target: name.to_owned(),
            name: rel.to_owned(),
            overwrite,
            committed: false,
            partial: Some(Partial { key, size, keep: false, vouched: held }),
        };
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
        let new = format!(".{:016x}.meta-new{}", p.key, crate::name::TEMP_SUFFIX);
        // Left by a crash, or planted: only the name is removed, nothing it points at.
        let _ = rustix::fs::unlinkat(&self.dir, &new, AtFlags::empty());
        let mut f = create_new(&self.dir, &new)?;
        let written = io::Write::write_all(&mut f, text.as_bytes()).and_then(|()| f.sync_all());
        let (_, meta) = partial_names(p.key);
        let renamed = written.and_then(|()| Ok(rustix::fs::renameat(&self.dir, &new, &self.dir, &meta)?));
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.dir, &new, AtFlags::empty());
        }
        renamed
    }

    /// Keeps the partial when the session ends uncommitted, with the first `held` bytes
    /// vouched for (checkpointed now, when `checkpoint`; else its sidecar stays as it was, time
    /// and all); whether it is kept. A plain temporary is removed as always. The receiver
    /// keeps partials through its ledger (`partials::Ledger::keep_for`).
    ///
    /// A checkpointed partial is cut to `held` bytes: no bytes stay on disk that its sidecar
    /// does not vouch for (else a resume that hashed less than the partial held would keep the
    /// rest on disk, uncounted).
    pub(crate) fn keep(&mut self, held: u64, checkpoint: bool) -> bool {
        // Not when the file arrived meanwhile (another session of it, served while this one
        // held the partial): nothing would continue it.
        let arrived = !self.overwrite && exists(&self.dir, &self.target);
        let cut = |f: &File| f.metadata().and_then(|m| if m.len() > held { f.set_len(held) } else { Ok(()) });
        if self.partial.is_some()
            && !arrived
            && (!checkpoint || self.checkpoint(held).and_then(|()| cut(&self.file)).is_ok())
        {
            if let Some(p) = &mut self.partial {
                p.keep = true;
                return true;
            }
        }
        false
    }

    /// The bytes the partial's sidecar vouched for when this session took it (0 for a plain
    /// temporary, or a partial with no valid sidecar).
    pub(crate) fn vouched(&self) -> u64 {
        self.partial.as_ref().map_or(0, |p| p.vouched)
    }

    /// What the data file takes on disk now (its allocated blocks, at most its length); 0 when
    /// it cannot be read.
    pub(crate) fn occupied(&self) -> u64 {
        rustix::fs::fstat(&self.file).map_or(0, |st| occupied(&st))
    }

    /// The directory and key of this partial; `None` for a plain temporary.
    pub(crate) fn partial_of(&self) -> Option<(DirFd, u64)> {
        self.partial.as_ref().map(|p| (self.dir.clone(), p.key))
    }

    /// Syncs the data and renames the temporary into place (without replacing an existing file
    /// unless `overwrite`: [`put_in_place`]), then syncs the directory. Its mode is set first:
    /// a batch `entry`'s, with its modification time (after the last write: a truncation would
    /// change the time again), else 0644 under the umask.
    ///
    /// # Errors
    /// The status and a sentence; the temporary is then removed when `self` drops.
    pub(crate) fn commit(mut self, entry: Option<&crate::wire::Entry>) -> Result<(), (Status, String)> {
        let io = |what: &str, e: io::Error| (io_status(&e), format!("{what}: {e}"));
        if let Some(p) = &self.partial {
            // A partial may hold bytes past the file's end from an earlier, longer write.
            self.file.set_len(p.size).map_err(|e| io("truncating the partial", e))?;
        }
        // Made its user's alone ([`TEMP_MODE`]): the entry's mode, or the receiver's own.
        if !entry.is_some_and(|e| e.flags & crate::wire::entry_flags::MODE != 0) {
            rustix::fs::fchmod(&self.file, file_mode()).map_err(|err| io("setting the mode", err.into()))?;
        }
        if let Some(e) = entry {
            apply_meta(&self.file, e).map_err(|err| io("setting the mode and time", err))?;
        }
        self.file.sync_all().map_err(|e| io("fsync", e))?;
        // The temporary is put in place by its name, not as the file written: a
        // local user who can write a destination without the sticky bit could move it away and
        // put a file of their own under its name. Checked before the rename, and after it (a
        // swap between the two): the file in place is the one written, or the verdict fails.
        let replaced = || (Status::DiskIo, format!("the temporary of {} was replaced meanwhile", self.name));
        if !is_same_file(&self.dir, &self.temp, &self.file) {
            return Err(replaced());
        }
        if self.overwrite {
            // Replaces what is at the name (a link itself, never its target).
            rustix::fs::renameat(&self.dir, &self.temp, &self.dir, &self.target).map_err(|e| io("rename", e.into()))?;
        } else {
            put_in_place(&self.dir, &self.temp, &self.target).map_err(|e| match e {
                PutError::Exists => (Status::Exists, format!("{} appeared meanwhile", self.name)),
                PutError::Unsupported(why) => (Status::DiskIo, why),
                PutError::Io(e) => io("rename", e),
            })?;
        }
        self.committed = true;
        if !is_same_file(&self.dir, &self.target, &self.file) {
            // Not the file written: out of the name again, and the verdict fails with it.
            let _ = rustix::fs::unlinkat(&self.dir, &self.target, AtFlags::empty());
            return Err(replaced());
        }
        if let Some(p) = &self.partial {
            let (_, meta) = partial_names(p.key);
            let _ = rustix::fs::unlinkat(&self.dir, &meta, AtFlags::empty());
        }
        rustix::fs::fsync(&*self.dir).map_err(|e| {
            let (status, why) = io("fsync of the directory", e.into());
            (status, format!("the file is in place, but not known durable: {why}"))
        })?;
        Ok(())
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if self.committed || self.partial.as_ref().is_some_and(|p| p.keep) {
            return;
        }
        let _ = rustix::fs::unlinkat(&self.dir, &self.temp, AtFlags::empty());
        if let Some(p) = &self.partial {
            let (_, meta) = partial_names(p.key);
            let _ = rustix::fs::unlinkat(&self.dir, &meta, AtFlags::empty());
        }
    }
}

/// Why [`put_in_place`] did not.
#[derive(Debug)]
pub(crate) enum PutError {
    /// Something is at the name.
    Exists,
    /// The file system can do neither way (the sentence names it).
    Unsupported(String),
    /// Another error.
    Io(io::Error),
}

/// Gives the file `from` the name `to` in `dir`, never replacing what is there:
/// `renameat2(RENAME_NOREPLACE)`, or, on file systems that refuse it (`EINVAL`: 9p, some NFS
/// and FUSE), a hard link at `to` and then the removal of `from`, which never replaces either.
pub(crate) fn put_in_place(dir: &DirFd, from: &str, to: &str) -> Result<(), PutError> {
    use rustix::io::Errno;
    let errno = |e: Errno| match e {
        Errno::EXIST => PutError::Exists,
        e => PutError::Io(e.into()),
    };
    match rustix::fs::renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(Errno::INVAL) | Err(Errno::NOSYS) => {}
        Err(e) => return Err(errno(e)),
    }
    match rustix::fs::linkat(dir, from, dir, to, AtFlags::empty()) {
        Ok(()) => {
            let _ = rustix::fs::unlinkat(dir, from, AtFlags::empty());
            Ok(())
        }
        Err(Errno::EXIST) => Err(PutError::Exists),
        Err(e @ (Errno::PERM | Errno::OPNOTSUPP | Errno::NOSYS | Errno::INVAL)) => Err(PutError::Unsupported(format!(
            "the receiver's file system ({}) can put a file in place without replacing another neither by \
             renameat2(RENAME_NOREPLACE) nor by a hard link ({e})",
            file_system_name(dir)
        ))),
        Err(e) => Err(errno(e)),
    }
}

/// The type of the file system `dir` is on, for messages: its mount's type in
/// `/proc/self/mountinfo` (by device number: `statfs` would name the exported file system of
/// a 9p or FUSE share), else `unknown`.
pub(crate) fn file_system_name(dir: &impl AsFd) -> String {
    let Ok(st) = rustix::fs::fstat(dir) else { return "unknown".into() };
    let dev = format!("{}:{}", rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return "unknown".into() };
    // "ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [TAGS...] - TYPE SOURCE SUPER-OPTIONS"
    let fs = mounts.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        (f.nth(2)? == dev).then(|| l.split(" - ").nth(1)?.split(' ').next().map(str::to_owned)).flatten()
    });
    fs.unwrap_or_else(|| "unknown".into())
}

/// Opens the directories `components` name under `dest`, one level at a time, each relative
/// to the one before and with `O_NOFOLLOW`, making those missing (mode 0777 before the
/// umask), and returns the last one. Nothing is followed: a component that is a symbolic link
/// is refused (`BadName`), one that is not a directory too (`Exists`), so no path leads out of
/// `dest`, whatever links the destination holds or a local user swaps in meanwhile: the file
/// is then made in the directory this opened, not by its path.
///
/// # Errors
/// The status and a sentence naming the path relative to `dest`.
pub(crate) fn make_dirs(dest: &DirFd, components: &[&str], made: &mut MadeDirs) -> Result<DirFd, (Status, String)> {
    make_dirs_racing(dest, components, made, &mut |_, _| {})
}

/// [`make_dirs`], calling `meanwhile` with the parent and the name of each directory it made,
/// between making and opening it: where a local user can race it (the tests' seam).
fn make_dirs_racing(
    dest: &DirFd,
    components: &[&str],
    made: &mut MadeDirs,
    meanwhile: &mut dyn FnMut(&DirFd, &str),
) -> Result<DirFd, (Status, String)> {
    use rustix::io::Errno;
    let mut at = dest.clone();
    let mut rel = String::new();
    for c in components {
        if !rel.is_empty() {
            rel.push('/');
        }
        rel.push_str(c);
        let open = || rustix::fs::openat(&at, *c, OFlags::RDONLY | OFlags::DIRECTORY | NOFOLLOW, Mode::empty());
        let link = || Err((Status::BadName, format!("{rel} is a symbolic link on the receiver: not followed")));
        let not_dir = || Err((Status::Exists, format!("{rel} exists and is not a directory")));
        let kind =
            || rustix::fs::statat(&at, *c, AtFlags::SYMLINK_NOFOLLOW).map(|s| FileType::from_raw_mode(s.st_mode));
        let fd = match open() {
            Ok(fd) => fd,
            Err(Errno::LOOP) => return link(),
            Err(Errno::NOTDIR) => return if kind().is_ok_and(|k| k == FileType::Symlink) { link() } else { not_dir() },
            Err(Errno::NOENT) => {
                let created = rustix::fs::mkdirat(&at, *c, DIR_MODE);
                match created {
                    // Made meanwhile by another session: opened as above.
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => {
                        let e = io::Error::from(e);
                        return Err((io_status(&e), format!("making {rel}: {e}")));
                    }
                }
                if created.is_ok() {
                    meanwhile(&at, c);
                }
                match open() {
                    Ok(fd) => {
                        if created.is_ok() && is_fresh_dir(&fd, &at) {
                            made.note(&fd);
                        }
                        fd
                    }
                    Err(Errno::LOOP) => return link(),
                    Err(Errno::NOTDIR) => return not_dir(),
                    Err(e) => {
                        let e = io::Error::from(e);
                        return Err((io_status(&e), format!("{rel}: {e}")));
                    }
                }
            }
            Err(e) => {
                let e = io::Error::from(e);
                return Err((io_status(&e), format!("{rel}: {e}")));
            }
        };
        at = Arc::new(fd);
    }
    Ok(at)
}

/// Whether no user but the receiver's (and root) may put, rename or remove files in `dir`: it
/// is the receiver's user's, and no one else may write it. Only there is a partial kept
/// (where another user may add files, they could move
/// in a file of the receiver's user from elsewhere on the file system under a partial's name,
/// with a received file of their making as its sidecar, have it written, and move it back; a
/// sticky directory stops renaming its files, not renaming files into it). Elsewhere a
/// resumable transfer is served from a plain temporary.
fn keeps_names(dir: &impl AsFd) -> bool {
    rustix::fs::fstat(dir).is_ok_and(|st| st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o022 == 0)
}

/// Whether `dir`, made by `mkdirat` in `parent` and then opened by its name, is the directory
/// that call made: owned by this process's user, with no special bit but the set-group-id bit
/// it inherits from `parent`, and empty. Between
/// the two calls a local user who can write its parent may rename another directory over the
/// new, empty one (a private directory, or one from outside the destination, which would then
/// take a batch entry's mode). One that passes and is not the one made is an empty directory
/// whose old parent that user could write (they moved it out of there): they could have put
/// one of their own in its place, so its taking the entry's mode and time hands them nothing.
fn is_fresh_dir(dir: &impl AsFd, parent: &impl AsFd) -> bool {
    let (Ok(st), Ok(up)) = (rustix::fs::fstat(dir), rustix::fs::fstat(parent)) else { return false };
    // A new directory takes its parent's set-group-id bit, and no other special bit.
    let special = st.st_mode & 0o7000 == up.st_mode & 0o2000;
    let empty = || {
        rustix::fs::Dir::read_from(dir)
            .is_ok_and(|mut entries| entries.all(|e| e.is_ok_and(|e| matches!(e.file_name().to_bytes(), b"." | b".."))))
    };
    st.st_uid == rustix::process::geteuid().as_raw() && special && empty()
}

/// The directories a session made (by device and inode, at most [`MadeDirs::MAX`]): only
/// those take a directory entry's mode and time, so that a sender cannot change those of
/// directories that were there before it (a `.ssh` made world-writable).
#[derive(Debug, Default)]
pub(crate) struct MadeDirs(std::collections::HashSet<(u64, u64)>);

impl MadeDirs {
    /// Directories remembered; those made past it keep the receiver's mode and time. 64 Ki:
    /// about 2 MiB of a session's memory, outside its ring's share (a million, a batch of a
    /// million directory entries, would take about 50 MB a session).
    const MAX: usize = 1 << 16;

    fn note(&mut self, dir: &impl AsFd) {
        if let Ok(st) = rustix::fs::fstat(dir) {
            if self.0.len() < Self::MAX {
                self.0.insert((st.st_dev, st.st_ino));
            }
        }
    }

    fn contains(&self, dir: &impl AsFd) -> bool {
        rustix::fs::fstat(dir).is_ok_and(|st| self.0.contains(&(st.st_dev, st.st_ino)))
    }
}

/// A batch's directory entry `name` in `dir` (its parents made): made unless it is there (a
/// link or a file there is refused as by [`make_dirs`]), then given the entry's mode and
/// time when this session made it. A directory that was there keeps its own, even with
/// overwriting on (overwriting replaces files, it does not open up directories).
///
/// # Errors
/// The status and a sentence naming the path relative to the destination.
pub(crate) fn make_dir_entry(
    dir: &DirFd,
    name: &str,
    e: &crate::wire::Entry,
    made: &mut MadeDirs,
) -> Result<(), (Status, String)> {
    // Its details name the entry by its whole path, not by its last component.
    let whole = |(status, why): (Status, String)| match why.strip_prefix(name) {
        Some(rest) => (status, format!("{}{rest}", e.path)),
        None => (status, why),
    };
    let d = make_dirs(dir, &[name], made).map_err(whole)?;
    if made.contains(&*d) {
        apply_meta(&*d, e).map_err(|err| (io_status(&err), format!("{}: {err}", e.path)))?;
    }
    Ok(())
}

/// The permission bits and modification time an entry asks for (its `flags`), applied to
/// `fd`: the received file before it is renamed into place, or a directory. Only the
/// permission bits (`0o777`) are kept: no set-id or sticky bit comes from a peer.
pub(crate) fn apply_meta(fd: &impl AsFd, e: &crate::wire::Entry) -> io::Result<()> {
    use crate::wire::entry_flags;
    if e.flags & entry_flags::MODE != 0 {
        rustix::fs::fchmod(fd, Mode::from_raw_mode((e.mode & 0o777) as _))?;
    }
    if e.flags & entry_flags::MTIME != 0 {
        let omit = rustix::fs::Timespec { tv_sec: 0, tv_nsec: rustix::fs::UTIME_OMIT };
        let mtime = rustix::fs::Timespec { tv_sec: e.mtime_sec as _, tv_nsec: i64::from(e.mtime_nsec) as _ };
        rustix::fs::futimens(fd, &rustix::fs::Timestamps { last_access: omit, last_modification: mtime })?;
    }
    Ok(())
}

/// Removes the partial of `key` in `dir` unless a session holds it, when its sidecar says it is
/// of the file `rel` of `size` bytes: that file has just been committed by a session that could
/// not use the partial. A partial of another file under the key (a peer that saw the key and
/// sent something else under it) is its owner's and stays. Best effort; whether it was removed.
pub(crate) fn drop_partial(dir: &DirFd, key: u64, rel: &str, size: u64) -> bool {
    let (data_name, meta_name) = partial_names(key);
    read_meta(dir, &meta_name).is_some_and(|m| m.key == key && m.name == rel && m.size == size)
        && remove_partial(dir, &data_name, &meta_name)
}

/// Removes a partial's data and sidecar unless a session holds the data's lock (then `false`).
/// What is at the data's name and is not the process's own file is only unlinked (as a name).
fn remove_partial(dir: &DirFd, data_name: &str, meta_name: &str) -> bool {
    if let Some(f) = open_own(dir, data_name, false) {
        if rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
            return false;
        }
        let _ = rustix::fs::unlinkat(dir, data_name, AtFlags::empty());
    }
    let _ = rustix::fs::unlinkat(dir, meta_name, AtFlags::empty());
    true
}

/// Removes the partial of `key` in `dir` unless a session holds it (a ledger's eviction);
/// whether it did (or it was gone already).
pub(crate) fn remove_partial_of(dir: &DirFd, key: u64) -> bool {
    let (data_name, meta_name) = partial_names(key);
    remove_partial(dir, &data_name, &meta_name)
}

/// Whether the partial of `key` is still in `dir` (its data file).
pub(crate) fn partial_exists(dir: &DirFd, key: u64) -> bool {
    exists(dir, &partial_names(key).0)
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

/// Reads the sidecar `name` in `dir`; `None` when it is missing, not one, or not this
/// process's own file.
fn read_meta(dir: &DirFd, name: &str) -> Option<Meta> {
    let mut f = open_own(dir, name, false)?;
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(&mut f, 4096), &mut text).ok()?;
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
/// Returns the others, oldest first: their key and the bytes their data file holds.
pub(crate) fn sweep_partials(dir: &DirFd, ttl: std::time::Duration) -> Vec<(u64, u64)> {
    let mut left: Vec<(std::time::Duration, u64, u64)> = Vec::new();
    let Ok(entries) = rustix::fs::Dir::read_from(&**dir) else { return Vec::new() };
    let suffix = format!(".part{}", crate::name::TEMP_SUFFIX);
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let Ok(n) = e.file_name().to_str() else { continue };
        let Some(hex) = n.strip_prefix('.').and_then(|n| n.strip_suffix(&suffix)) else { continue };
        let Ok(key) = u64::from_str_radix(hex, 16) else { continue };
        let (data_name, meta_name) = partial_names(key);
        let age = |name: &str| {
            let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(st.st_mtime.max(0) as u64);
            now.duration_since(at).ok()
        };
        let Some(age) = age(&meta_name).or_else(|| age(&data_name)) else { continue };
        if crate::policy::partials::expired(age, ttl) {
            remove_partial(dir, &data_name, &meta_name);
        } else {
            // Only this process's own partials are counted (else names a local user made in a
            // shared directory would each give up one of the receiver's partials at its start),
            // by what they take on disk: a sparse file's length is not (a planted sparse
            // "partial" of a terabyte would make the ledger give up every other partial).
            let st = rustix::fs::statat(dir, &data_name, AtFlags::SYMLINK_NOFOLLOW);
            if let Some(st) = st.ok().filter(is_own_private) {
                left.push((age, key, occupied(&st)));
            }
        }
    }
    // Oldest first: the largest age first.
    left.sort_by_key(|a| std::cmp::Reverse(a.0));
    left.into_iter().map(|(_, key, bytes)| (key, bytes)).collect()
}

/// Opens the destination directory `path` (a link there is followed: it is the
/// administrator's), and proves it can take files: a file made in it, put in place under a
/// second name ([`put_in_place`]), and removed. Run once, when a receiver starts, so that a
/// destination that cannot work fails then, not after a sender's data crossed the wire.
///
/// # Errors
/// A sentence naming the cause: not a directory, not writable ("Read-only file system",
/// "Permission denied"), or a file system that cannot put a file in place without replacing.
pub(crate) fn open_destination(path: &std::path::Path) -> Result<DirFd, String> {
    let shown = path.display();
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("the destination {shown}: {}", io::Error::from(e)))?;
    let dir = Arc::new(fd);
    let nonce: [u8; 8] = super::random_bytes();
    let probe = |n: u8| format!(".probe-{:016x}-{n}{}", u64::from_le_bytes(nonce), crate::name::TEMP_SUFFIX);
    let (a, b) = (probe(0), probe(1));
    create_new(&dir, &a).map_err(|e| format!("the destination {shown} is not writable: {e}"))?;
    let put = put_in_place(&dir, &a, &b);
    let _ = rustix::fs::unlinkat(&dir, &a, AtFlags::empty());
    let _ = rustix::fs::unlinkat(&dir, &b, AtFlags::empty());
    match put {
        Ok(()) => Ok(dir),
        Err(PutError::Unsupported(why)) => Err(format!("the destination {shown}: {why}")),
        Err(PutError::Exists) => Err(format!("the destination {shown}: a fresh probe name was taken")),
        Err(PutError::Io(e)) => Err(format!("the destination {shown}: putting a file in place: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-proto-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn open(d: &Path) -> DirFd {
        open_destination(d).unwrap()
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

    fn resumable(d: &DirFd, name: &str, size: u64, key: u64) -> Result<(Incoming, u64), (Status, String)> {
        Incoming::resumable(d, name, name, size, key, false, Some(DAY))
    }

    #[test]
    fn make_dirs_follows_no_link_and_refuses_a_file() {
        let d = scratch("mkdirs");
        let outside = scratch("mkdirs-outside");
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling")).unwrap();
        std::fs::write(d.join("file"), b"x").unwrap();
        std::fs::create_dir(d.join("there")).unwrap();
        let (fd, mut made) = (open(&d), MadeDirs::default());
        for (path, status) in [
            (&["link", "x"][..], Status::BadName),
            (&["link"][..], Status::BadName),
            (&["dangling", "x"][..], Status::BadName),
            (&["file", "x"][..], Status::Exists),
            (&["file"][..], Status::Exists),
        ] {
            let (s, why) = make_dirs(&fd, path, &mut made).unwrap_err();
            assert_eq!(s, status, "{path:?}: {why}");
            assert!(!why.contains(d.to_str().unwrap()), "{why}: names the receiver's own path");
        }
        assert!(std::fs::read_dir(&outside).unwrap().next().is_none(), "nothing made through the link");
        assert!(!d.join("nowhere").exists(), "nothing made through the dangling link");
        let b = make_dirs(&fd, &["there", "a", "b"], &mut made).unwrap();
        assert!(d.join("there/a/b").is_dir());
        assert!(made.contains(&*b));
        assert_eq!(made.0.len(), 2, "there was not made, a and b were");
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_it_was_opened_leads_nowhere_else() {
        let d = scratch("swap");
        let outside = scratch("swap-outside");
        let fd = open(&d);
        let sub = make_dirs(&fd, &["sub"], &mut MadeDirs::default()).unwrap();
        // A local user moves the directory away and puts a link to elsewhere in its place.
        std::fs::rename(d.join("sub"), d.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("sub")).unwrap();
        let f = Incoming::create(&sub, "f", "sub/f", 1, false).unwrap();
        f.commit(None).unwrap();
        assert!(listing(&outside).is_empty(), "nothing through the link: {:?}", listing(&outside));
        assert_eq!(listing(&d.join("moved")), ["f"], "the file went into the directory opened");
        // The next entry's walk refuses the link.
        assert_eq!(make_dirs(&fd, &["sub"], &mut MadeDirs::default()).unwrap_err().0, Status::BadName);
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    /// At its start the receiver counts only its own private partial files, not every name of
    /// a partial in its destination: a local user's names (in a shared directory) must not each
    /// give up one of its own partials.
    #[test]
    fn the_sweep_counts_only_the_receivers_own_partials() {
        use std::os::unix::fs::FileExt;
        let d = scratch("sweep-own");
        let fd = open(&d);
        let (mut f, _) = resumable(&fd, "f", 10, 1).unwrap();
        f.file.write_all_at(b"0123456789", 0).unwrap();
        assert!(f.keep(10, true));
        drop(f);
        std::fs::write(d.join("other"), b"x").unwrap();
        std::fs::hard_link(d.join("other"), d.join(".0000000000000002.part.rdcp-tmp")).unwrap();
        std::os::unix::fs::symlink(d.join("other"), d.join(".0000000000000003.part.rdcp-tmp")).unwrap();
        std::fs::create_dir(d.join(".0000000000000004.part.rdcp-tmp")).unwrap();
        let keys: Vec<u64> = sweep_partials(&fd, DAY).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, [1], "a hard link, a symbolic link and a directory are not the receiver's partials");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A local user who can write the destination (no sticky bit) moves the temporary away
    /// while it is written and puts a file of their own under its name: the commit fails, and
    /// nothing is under the final name (their file is never put in place with the verdict
    /// `Ok`).
    #[test]
    fn a_temporary_swapped_for_another_file_fails_the_commit_and_leaves_no_file() {
        use std::os::unix::fs::FileExt;
        let d = scratch("swap-temp");
        let fd = open(&d);
        for partial in [false, true] {
            let f = if partial {
                resumable(&fd, "f", 4, 7).unwrap().0
            } else {
                Incoming::create(&fd, "f", "f", 1, false).unwrap()
            };
            f.file.write_all_at(b"sent", 0).unwrap();
            std::fs::rename(d.join(&f.temp), d.join("moved")).unwrap();
            std::fs::write(d.join(&f.temp), b"mine").unwrap();
            let (status, why) = f.commit(None).unwrap_err();
            assert_eq!(status, Status::DiskIo, "{why}");
            assert!(why.contains("replaced meanwhile"), "{why}");
            assert!(!d.join("f").exists(), "partial {partial}: a file under the final name");
            std::fs::remove_file(d.join("moved")).unwrap();
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A local user who can write the destination plants, at every name the receiver makes
    /// for `key`, a symbolic link and then a hard link to a file outside it: nothing is
    /// written through any of them, and the transfer still works.
    #[test]
    fn links_planted_at_every_temporary_partial_and_sidecar_name_are_not_followed() {
        let d = scratch("plant");
        let victim_dir = scratch("plant-victim");
        let victim = victim_dir.join("precious");
        let key = 0x42u64;
        let s = crate::name::TEMP_SUFFIX;
        let names = [
            format!(".{key:016x}.part{s}"),
            format!(".{key:016x}.meta{s}"),
            format!(".{key:016x}.meta-new{s}"),
            format!(".{:016x}-0{s}", 9u64),
        ];
        for hard in [false, true] {
            std::fs::write(&victim, b"keep me").unwrap();
            for n in &names {
                let at = d.join(n);
                let _ = std::fs::remove_file(&at);
                if hard {
                    std::fs::hard_link(&victim, &at).unwrap();
                } else {
                    std::os::unix::fs::symlink(&victim, &at).unwrap();
                }
            }
            let fd = open(&d);
            // A resumable transfer: opened, written, checkpointed, kept, then resumed and committed.
            let (mut a, held) = resumable(&fd, "f", 8, key).unwrap();
            assert_eq!(held, 0, "a planted file vouches for nothing");
            std::os::unix::fs::FileExt::write_all_at(&a.file, b"new data", 0).unwrap();
            a.checkpoint(8).unwrap();
            a.keep(8, true);
            drop(a);
            let (b, held) = resumable(&fd, "f", 8, key).unwrap();
            assert_eq!(held, 8);
            b.commit(None).unwrap();
            // A plain temporary at a planted name takes the next number.
            let c = Incoming::create(&fd, "g", "g", 9, false).unwrap();
            std::io::Write::write_all(&mut &c.file, b"g").unwrap();
            c.commit(None).unwrap();
            assert_eq!(std::fs::read(&victim).unwrap(), b"keep me", "hard link {hard}: the victim was written");
            assert_eq!(std::fs::read(d.join("f")).unwrap(), b"new data");
            assert_eq!(std::fs::read(d.join("g")).unwrap(), b"g");
            for n in ["f", "g"] {
                std::fs::remove_file(d.join(n)).unwrap();
            }
            let _ = std::fs::remove_file(d.join(&names[3]));
        }
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&victim_dir).unwrap();
    }

    /// Where another user may add files, they could move a file
    /// of the receiver's user from elsewhere on the file system in under a partial's name (a
    /// received file of their making as its sidecar), have it written, and move it back; the
    /// sticky bit does not stop renaming a file into a directory. A partial is kept only in a
    /// directory of the receiver's user that others may not write.
    #[test]
    fn partials_are_kept_only_where_no_other_user_may_add_files() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("keepsnames");
        for (mode, kept) in [(0o755, true), (0o700, true), (0o1777, false), (0o777, false), (0o775, false)] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            match resumable(&open(&d), "f", 100, 3) {
                Ok((a, _)) => {
                    assert!(kept, "{mode:o}: a partial in a directory others may write");
                    assert!(a.is_partial());
                }
                Err((status, why)) => {
                    assert!(!kept, "{mode:o}: {why}");
                    assert_eq!(status, Status::Busy, "{why}");
                    assert!(listing(&d).is_empty(), "{mode:o}: {:?}", listing(&d));
                }
            }
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_forged_sidecar_beside_a_planted_data_file_vouches_for_nothing() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("forged");
        let key = 7u64;
        let s = crate::name::TEMP_SUFFIX;
        // Data with two names (not the process's private file) and a sidecar claiming it.
        std::fs::write(d.join("elsewhere"), [9u8; 100]).unwrap();
        std::fs::hard_link(d.join("elsewhere"), d.join(format!(".{key:016x}.part{s}"))).unwrap();
        let meta = format!("{META_MAGIC}\nkey={key:016x}\nsize=100\nheld=100\nname=f\n");
        std::fs::write(d.join(format!(".{key:016x}.meta{s}")), meta).unwrap();
        std::fs::set_permissions(d.join("elsewhere"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let (a, held) = resumable(&open(&d), "f", 100, key).unwrap();
        assert_eq!(held, 0);
        assert_eq!(a.file.metadata().unwrap().len(), 0, "a new data file");
        assert_eq!(std::fs::read(d.join("elsewhere")).unwrap(), [9u8; 100]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Temporaries and partials are their user's alone until they are put in place: made with
    /// the final file's default mode, anyone who may read the destination could read a file
    /// (sent as 0600, say) while it arrived.
    #[test]
    fn a_file_is_its_user_s_alone_until_it_is_put_in_place() {
        let d = scratch("tempmode");
        let fd = open(&d);
        let t = Incoming::create(&fd, "f", "f", 5, false).unwrap();
        let (p, _) = resumable(&fd, "g", 3, 4).unwrap();
        for n in listing(&d) {
            assert_eq!(mode_of(&d.join(&n)), 0o600, "{n} while it arrives");
        }
        t.commit(None).unwrap();
        assert_eq!(mode_of(&d.join("f")), file_mode().as_raw_mode(), "the receiver's own mode once in place");
        let mut e = dir_entry("g", 0o640, 9);
        e.kind = crate::wire::EntryKind::File;
        std::os::unix::fs::FileExt::write_all_at(&p.file, b"abc", 0).unwrap();
        p.commit(Some(&e)).unwrap();
        assert_eq!(mode_of(&d.join("g")), 0o640, "the entry's mode once in place");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn apply_meta_keeps_only_the_permission_bits() {
        let d = scratch("meta");
        let f = std::fs::File::create(d.join("f")).unwrap();
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

    /// A local user renames a directory over the one `make_dirs` has just made, before it is
    /// opened: a batch entry must not give that directory (a private one in the destination,
    /// or one from outside it, moved in and out again) its mode.
    #[test]
    fn a_directory_swapped_in_between_making_and_opening_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("dirswap");
        let (dest, outside) = (d.join("dest"), d.join("outside"));
        std::fs::create_dir_all(&dest).unwrap();
        for (name, mode, file) in [("private", 0o700, true), ("drop", 0o1777, false)] {
            let victim = outside.join(name);
            std::fs::create_dir_all(&victim).unwrap();
            if file {
                std::fs::write(victim.join("secret"), b"x").unwrap();
            }
            std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(mode)).unwrap();
            let (fd, mut made) = (open(&dest), MadeDirs::default());
            let mut swap = |_: &DirFd, c: &str| std::fs::rename(&victim, dest.join(c)).unwrap();
            let x = make_dirs_racing(&fd, &[name], &mut made, &mut swap).unwrap();
            make_dir_entry(&fd, name, &dir_entry(name, 0o777, 7), &mut made).unwrap();
            // The directory it opened is the victim: it keeps its mode.
            assert_eq!(rustix::fs::fstat(&*x).unwrap().st_mode & 0o7777, mode, "{name}");
            std::fs::rename(dest.join(name), &victim).unwrap();
            assert_eq!(mode_of(&victim), mode, "{name}, moved back out");
        }
        // A directory it made itself still takes the entry's mode.
        let (fd, mut made) = (open(&dest), MadeDirs::default());
        make_dirs_racing(&fd, &["mine"], &mut made, &mut |_, _| {}).unwrap();
        make_dir_entry(&fd, "mine", &dir_entry("mine", 0o751, 7), &mut made).unwrap();
        assert_eq!(mode_of(&dest.join("mine")), 0o751);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_entry_sets_the_mode_only_of_a_directory_this_session_made() {
        use std::os::unix::fs::PermissionsExt;
        let d = scratch("direntry");
        std::fs::create_dir(d.join("old")).unwrap();
        std::fs::set_permissions(d.join("old"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("file"), b"x").unwrap();
        let (fd, mut made) = (open(&d), MadeDirs::default());
        // A directory that was there keeps its mode (a sender cannot open up a `.ssh`).
        make_dir_entry(&fd, "old", &dir_entry("old", 0o777, 7), &mut made).unwrap();
        assert_eq!(mode_of(&d.join("old")), 0o700);
        // One made now, or made earlier in the session as a parent, takes the entry's.
        make_dir_entry(&fd, "new", &dir_entry("new", 0o750, 7), &mut made).unwrap();
        assert_eq!(mode_of(&d.join("new")), 0o750);
        let parent = make_dirs(&fd, &["parent"], &mut made).unwrap();
        make_dirs(&parent, &["child"], &mut made).unwrap();
        make_dir_entry(&parent, "child", &dir_entry("parent/child", 0o711, 7), &mut made).unwrap();
        make_dir_entry(&fd, "parent", &dir_entry("parent", 0o751, 7), &mut made).unwrap();
        assert_eq!((mode_of(&d.join("parent/child")), mode_of(&d.join("parent"))), (0o711, 0o751));
        // Another session (overwriting or not) does not change what is there.
        make_dir_entry(&fd, "new", &dir_entry("new", 0o777, 7), &mut MadeDirs::default()).unwrap();
        assert_eq!(mode_of(&d.join("new")), 0o750);
        // A directory entry over a file, or a link, is refused; the file stays.
        let (s, _) = make_dir_entry(&fd, "file", &dir_entry("file", 0o755, 7), &mut made).unwrap_err();
        assert_eq!(s, Status::Exists);
        assert_eq!(std::fs::read(d.join("file")).unwrap(), b"x");
        std::os::unix::fs::symlink(d.join("old"), d.join("l")).unwrap();
        let (s, _) = make_dir_entry(&fd, "l", &dir_entry("l", 0o777, 7), &mut made).unwrap_err();
        assert_eq!(s, Status::BadName);
        assert_eq!(mode_of(&d.join("old")), 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_kept_partial_is_found_again_with_what_it_vouched_for() {
        let d = scratch("keep");
        let fd = open(&d);
        let (mut a, held) = resumable(&fd, "f", 100, 7).unwrap();
        assert_eq!(held, 0);
        std::os::unix::fs::FileExt::write_all_at(&a.file, &[1; 60], 0).unwrap();
        // While a session holds it, another is told Busy.
        assert_eq!(resumable(&fd, "f", 100, 7).unwrap_err().0, Status::Busy);
        a.keep(40, true);
        drop(a);
        assert_eq!(listing(&d), [".0000000000000007.meta.rdcp-tmp", ".0000000000000007.part.rdcp-tmp"]);
        let (b, held) = resumable(&fd, "f", 100, 7).unwrap();
        assert_eq!(held, 40, "the sidecar's count, not the data's length");
        // Another name or size under its key does not take it, nor remove it.
        let mut b = b;
        b.keep(40, true);
        drop(b);
        for (name, size) in [("g", 100), ("f", 101)] {
            assert_eq!(resumable(&fd, name, size, 7).unwrap_err().0, Status::Busy, "{name} {size}");
        }
        assert_eq!(listing(&d), [".0000000000000007.meta.rdcp-tmp", ".0000000000000007.part.rdcp-tmp"]);
        // Nor does committing another file under its key remove it, and it says so, so that
        // the receiver keeps it in its ledger.
        assert!(!drop_partial(&fd, 7, "g", 100), "another name's commit does not remove it");
        assert!(!drop_partial(&fd, 7, "f", 101), "another size's commit does not remove it");
        assert_eq!(listing(&d), [".0000000000000007.meta.rdcp-tmp", ".0000000000000007.part.rdcp-tmp"]);
        let (b, held) = resumable(&fd, "f", 100, 7).unwrap();
        assert_eq!(held, 40, "still whole");
        drop(b); // not kept: removed, sidecar and all
        assert!(listing(&d).is_empty(), "{:?}", listing(&d));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_committed_partial_leaves_only_the_file_cut_to_its_size() {
        let d = scratch("commit");
        let (a, _) = resumable(&open(&d), "f", 10, 9).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&a.file, &[5; 16], 0).unwrap();
        a.checkpoint(10).unwrap();
        a.commit(None).unwrap();
        assert_eq!(listing(&d), ["f"]);
        assert_eq!(std::fs::read(d.join("f")).unwrap(), [5; 10]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn put_in_place_never_replaces_and_the_probe_leaves_nothing() {
        let d = scratch("put");
        let fd = open(&d);
        assert!(listing(&d).is_empty(), "the probe cleaned up: {:?}", listing(&d));
        std::fs::write(d.join("a"), b"a").unwrap();
        std::fs::write(d.join("b"), b"b").unwrap();
        assert!(matches!(put_in_place(&fd, "a", "b"), Err(PutError::Exists)));
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("l")).unwrap();
        assert!(matches!(put_in_place(&fd, "a", "l"), Err(PutError::Exists)), "a dangling link is something");
        put_in_place(&fd, "a", "c").unwrap();
        assert_eq!(listing(&d), ["b", "c", "l"]);
        assert!(!d.join("nowhere").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_file_system_is_named_by_its_mount() {
        let d = scratch("fsname");
        let name = file_system_name(&*open(&d));
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(name != "unknown" && mounts.contains(&format!(" - {name} ")), "{name}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_destination_that_cannot_take_files_fails_at_once_with_its_cause() {
        let d = scratch("dest");
        std::fs::write(d.join("file"), b"x").unwrap();
        let why = open_destination(&d.join("missing")).unwrap_err();
        assert!(why.contains("No such file"), "{why}");
        let why = open_destination(&d.join("file")).unwrap_err();
        assert!(why.contains("Not a directory"), "{why}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_committed_partial_keeps_the_entry_s_mode_and_time_without_set_id_bits() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let d = scratch("meta");
        let (a, _) = resumable(&open(&d), "f", 4, 5).unwrap();
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
        let fd = open(&d);
        let (mut a, _) = resumable(&fd, "f", 10, 1).unwrap();
        a.keep(0, true);
        drop(a);
        let (held, _) = resumable(&fd, "g", 10, 2).unwrap();
        // Whole seconds: a partial written this second is not yet older than nothing.
        std::thread::sleep(Duration::from_millis(1100));
        sweep_partials(&fd, Duration::ZERO);
        assert_eq!(listing(&d), [".0000000000000002.part.rdcp-tmp"], "the held one stays");
        drop(held);
        assert!(listing(&d).is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_sidecar_that_claims_more_than_the_data_holds_is_ignored() {
        let d = scratch("claims");
        let fd = open(&d);
        let (mut a, _) = resumable(&fd, "f", 100, 3).unwrap();
        a.keep(90, true); // nothing was written: the data file is empty
        drop(a);
        let (_b, held) = resumable(&fd, "f", 100, 3).unwrap();
        assert_eq!(held, 0);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
