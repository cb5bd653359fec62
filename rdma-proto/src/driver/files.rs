//! The receiver's files: a temporary in the destination directory, renamed into place only
//! after the digest matched and the data is synced; removed on every failure.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
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
}

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
                    return Ok(Incoming { file, temp, target, name: name.to_owned(), overwrite, committed: false })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < MAX_TEMP_TRIES => n += 1,
                Err(e) => return Err((io_status(&e), format!("creating the temporary {temp_name}: {e}"))),
            }
        }
    }

    /// Syncs the data and renames the temporary into place (without replacing an existing file
    /// unless `overwrite`), then syncs the directory.
    ///
    /// # Errors
    /// The status and a sentence; the temporary is then removed when `self` drops.
    pub(crate) fn commit(mut self) -> Result<(), (Status, String)> {
        let io = |what: &str, e: io::Error| (io_status(&e), format!("{what}: {e}"));
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
        if !self.committed {
            let _ = std::fs::remove_file(&self.temp);
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
