//! The registration of a verbs file descriptor with the tokio reactor (feature `tokio`): the
//! completion channel's and the async-event fd's. One rule for all of them: registered by the
//! first async wait, with that wait's runtime, and deregistered before the fd is closed.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Mutex, OnceLock};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::error::{Error, Result};

/// A file descriptor owned by a verbs object; the reactor only watches it.
#[derive(Debug)]
pub(crate) struct WatchedFd(RawFd);

impl AsRawFd for WatchedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A verbs fd's registration, made once, on first use.
#[derive(Debug, Default)]
pub(crate) struct Registration {
    fd: OnceLock<AsyncFd<WatchedFd>>,
    /// Held while registering: two registrations of one fd would be one too many (dropping
    /// the second would deregister the first).
    registering: Mutex<()>,
}

impl Registration {
    /// The registration of `fd` (a non-blocking descriptor the caller owns for as long as
    /// `self`), made now with the current runtime if not yet.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime; [`Error::Verb`] (`what`, with the
    /// `errno`) when the reactor refuses the fd.
    ///
    /// # Panics
    /// As tokio's own IO types: in a runtime built without IO (`enable_io`).
    pub(crate) fn get_or_register(&self, fd: RawFd, what: &'static str, device: &str) -> Result<&AsyncFd<WatchedFd>> {
        if let Some(r) = self.fd.get() {
            return Ok(r);
        }
        let _one_at_a_time = self.registering.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = self.fd.get() {
            return Ok(r);
        }
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what });
        }
        let r = AsyncFd::with_interest(WatchedFd(fd), Interest::READABLE).map_err(|e| io_error(what, device, &e))?;
        Ok(self.fd.get_or_init(|| r))
    }

    /// Ends the registration, if any: call before the fd is closed.
    pub(crate) fn deregister(&mut self) {
        drop(self.fd.take());
    }
}

/// An error of the reactor while waiting for `what`.
pub(crate) fn io_error(what: &'static str, device: &str, e: &std::io::Error) -> Error {
    Error::from_errno(what, Some(device), e.raw_os_error().unwrap_or(libc::EIO))
}

/// Drops `value` on tokio's blocking pool and awaits it: for drops that wait for the device.
pub(crate) async fn drop_off_runtime<T: Send + 'static>(value: T) -> Result<()> {
    // A join error is a panic in the drop, which the pool caught: report it as one would
    // have been reported in place.
    tokio::task::spawn_blocking(move || drop(value)).await.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic())
        } else {
            Error::NoRuntime { what: "drop" }
        }
    })
}
