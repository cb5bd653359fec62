//! Blocking waits on a verbs file descriptor (a completion channel's, the async-event fd) and
//! the flag every such descriptor gets.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::wait::deadline::Deadline;

/// Makes a verbs file descriptor non-blocking (`FIONBIO`, the same flag as `O_NONBLOCK`).
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, verb: &'static str, device: &str) -> Result<()> {
    rustix::io::ioctl_fionbio(fd, true).map_err(|e| Error::from_errno(verb, Some(device), e.raw_os_error()))
}

/// Waits until `fd` is readable (`true`; also when `poll(2)` reports it hung up or in error,
/// which a read then tells) or `until` passes (`false`): `poll(2)`, again after `EINTR`. How every blocking wait of this crate and of `rdma-cm` sleeps on one verbs or CM fd
/// (a completion channel read directly, the async-event fd, a CM event channel).
///
/// # Errors
/// `poll(2)`'s, but `EINTR`.
///
/// # References
/// - [`poll(2)`](https://man7.org/linux/man-pages/man2/poll.2.html)
#[doc(alias = "poll")]
pub fn poll_readable(fd: BorrowedFd<'_>, until: Deadline) -> std::io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut pfd, until.poll_timeout().as_ref()) {
            Ok(1..) => return Ok(true),
            Ok(0) if until.has_passed() => return Ok(false),
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// [`poll_readable`], with this crate's errors: `Timeout { after: timeout }` when `deadline` passes.
pub(crate) fn wait_readable(
    fd: BorrowedFd<'_>,
    deadline: Deadline,
    timeout: Duration,
    what: &'static str,
    device: &str,
) -> Result<()> {
    match poll_readable(fd, deadline) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Timeout { what, after: timeout }),
        // poll(2) failed while waiting for the verb `what`'s event: report it as `what`'s.
        Err(e) => Err(Error::from_errno(what, Some(device), e.raw_os_error().unwrap_or(libc::EIO))),
    }
}
