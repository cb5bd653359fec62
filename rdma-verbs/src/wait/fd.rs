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

/// Waits until `fd` is readable or `deadline` passes (then `Timeout { after: timeout }`).
pub(crate) fn wait_readable(
    fd: BorrowedFd<'_>,
    deadline: Deadline,
    timeout: Duration,
    what: &'static str,
    device: &str,
) -> Result<()> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut pfd, deadline.poll_timeout().as_ref()) {
            Ok(1..) => return Ok(()),
            Ok(0) if deadline.has_passed() => return Err(Error::Timeout { what, after: timeout }),
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            // poll(2) failed while waiting for the verb `what`'s event: report it as `what`'s.
            Err(e) => return Err(Error::from_errno(what, Some(device), e.raw_os_error())),
        }
    }
}
