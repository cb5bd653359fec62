//! Blocking waits on file descriptors: [`poll_fds`], the one function that calls `poll(2)`,
//! and the flag every verbs descriptor gets.
//!
//! Every blocking sleep of this crate, of `rdma-cm` and of `rdma-proto`'s driver (a completion
//! channel, the async-event fd, a CM event channel, a thread's wake-up `eventfd`, the driver's
//! flags) is one call of [`poll_fds`]: one place decides how a deadline becomes `poll(2)`'s
//! timeout, what `EINTR` and an early return mean, and which descriptors were ready.

use std::os::fd::BorrowedFd;

use crate::error::{Error, Result};
use crate::wait::deadline::Deadline;

/// Makes a verbs file descriptor non-blocking (`FIONBIO`, the same flag as `O_NONBLOCK`).
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, verb: &'static str, device: &str) -> Result<()> {
    rustix::io::ioctl_fionbio(fd, true).map_err(|e| Error::from_errno(verb, Some(device), e.raw_os_error()))
}

/// Descriptors one [`poll_fds`] watches without allocating.
const IN_PLACE: usize = 8;

/// Sleeps until one of `fds` is readable (`Ok(true)`; also when `poll(2)` reports one hung up
/// or in error, which a read then tells) or `until` passes (`Ok(false)`): `poll(2)` for
/// readability, again after `EINTR` and after a return before the deadline with nothing ready.
/// `readable[i]` is set to whether `fds[i]` was ready (for the `i` that `readable` has room
/// for). [`Deadline::never`] sleeps until a descriptor is ready; a passed deadline looks once.
/// No descriptor and no deadline is refused at once (`InvalidInput`): nothing could end it.
///
/// Every blocking fd wait of this crate, `rdma-cm` and `rdma-proto` is a call of this function.
/// Up to eight descriptors are watched without allocating.
///
/// ```
/// use rdma_verbs::wait::{poll_fds, Deadline};
/// use std::os::fd::AsFd;
/// use std::time::Duration;
///
/// let (quiet, _w1) = std::os::unix::net::UnixStream::pair().unwrap();
/// let (loud, w2) = std::os::unix::net::UnixStream::pair().unwrap();
/// std::io::Write::write_all(&mut &w2, b"x").unwrap();
/// let mut readable = [false; 2];
/// let woke = poll_fds(&[quiet.as_fd(), loud.as_fd()], Deadline::after(Duration::from_secs(5)), &mut readable);
/// assert!(woke.unwrap());
/// assert_eq!(readable, [false, true]);
/// assert!(!poll_fds(&[quiet.as_fd()], Deadline::after(Duration::ZERO), &mut []).unwrap());
/// ```
///
/// # Errors
/// `poll(2)`'s, but `EINTR`; [`InvalidInput`](std::io::ErrorKind::InvalidInput) for an empty
/// `fds` with [`Deadline::never`].
///
/// # References
/// - [`poll(2)`](https://man7.org/linux/man-pages/man2/poll.2.html)
#[doc(alias = "poll")]
#[doc(alias = "ppoll")]
pub fn poll_fds<'fd>(fds: &[BorrowedFd<'fd>], until: Deadline, readable: &mut [bool]) -> std::io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags};
    if fds.is_empty() && until.instant().is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a wait on no file descriptor without a deadline would never end",
        ));
    }
    let watch = |fd: &BorrowedFd<'fd>| PollFd::from_borrowed_fd(*fd, PollFlags::IN);
    let (mut few, mut more);
    let pfds: &mut [PollFd<'fd>] = match fds.first() {
        None => &mut [],
        Some(first) if fds.len() <= IN_PLACE => {
            few = [*first; IN_PLACE].map(|fd| watch(&fd));
            for (pfd, fd) in few.iter_mut().zip(fds).skip(1) {
                *pfd = watch(fd);
            }
            &mut few[..fds.len()]
        }
        Some(_) => {
            more = fds.iter().map(watch).collect::<Vec<_>>();
            &mut more
        }
    };
    loop {
        match poll(pfds, until.poll_timeout().as_ref()) {
            Ok(1..) => {
                for (flag, pfd) in readable.iter_mut().zip(pfds.iter()) {
                    *flag = !pfd.revents().is_empty();
                }
                return Ok(true);
            }
            Ok(_) if until.has_passed() => {
                readable.iter_mut().for_each(|flag| *flag = false);
                return Ok(false);
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until `fd` is readable (`true`; also when `poll(2)` reports it hung up or in error,
/// which a read then tells) or `until` passes (`false`): [`poll_fds`] on one descriptor.
///
/// # Errors
/// `poll(2)`'s, but `EINTR`.
///
/// # References
/// - [`poll(2)`](https://man7.org/linux/man-pages/man2/poll.2.html)
#[doc(alias = "poll")]
pub fn poll_readable(fd: BorrowedFd<'_>, until: Deadline) -> std::io::Result<bool> {
    poll_fds(&[fd], until, &mut [])
}

/// [`poll_readable`], with this crate's errors: `Timeout` (`what`, the deadline's timeout) when
/// `until` passes.
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, until: Deadline, what: &'static str, device: &str) -> Result<()> {
    match poll_readable(fd, until) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Timeout { what, after: until.timeout() }),
        // poll(2) failed while waiting for the verb `what`'s event: report it as `what`'s.
        Err(e) => Err(Error::from_errno(what, Some(device), e.raw_os_error().unwrap_or(libc::EIO))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::time::Duration;

    /// More descriptors than fit in place are watched all the same, each reported.
    #[test]
    fn many_descriptors_are_watched_and_each_reported() {
        let pairs: Vec<_> = (0..IN_PLACE + 3).map(|_| std::os::unix::net::UnixStream::pair().unwrap()).collect();
        std::io::Write::write_all(&mut &pairs[IN_PLACE + 1].1, b"x").unwrap();
        let fds: Vec<_> = pairs.iter().map(|(r, _)| r.as_fd()).collect();
        let mut readable = vec![false; fds.len()];
        assert!(poll_fds(&fds, Deadline::after(Duration::from_secs(5)), &mut readable).unwrap());
        let ready: Vec<_> = readable.iter().enumerate().filter(|(_, r)| **r).map(|(i, _)| i).collect();
        assert_eq!(ready, [IN_PLACE + 1]);
        let start = std::time::Instant::now();
        assert!(!poll_fds(&fds[..2], Deadline::after(Duration::from_millis(20)), &mut readable).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(20), "slept to the deadline");
        assert!(readable.iter().all(|r| !r), "nothing ready at the deadline");
    }

    /// A wait over no descriptor and without a deadline could never end: refused at once.
    #[test]
    fn no_descriptor_and_no_deadline_is_refused_at_once() {
        let err = poll_fds(&[], Deadline::never(), &mut []).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }

    /// A wait over no descriptor sleeps to its deadline.
    #[test]
    fn no_descriptor_sleeps_to_the_deadline() {
        let start = std::time::Instant::now();
        assert!(!poll_fds(&[], Deadline::after(Duration::from_millis(10)), &mut []).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(10));
    }

    /// The timeout error of a fd wait is built where the deadline passed, with the timeout the
    /// deadline was made from.
    #[test]
    fn a_fd_wait_times_out_with_the_deadlines_timeout() {
        let (quiet, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        let until = Deadline::after(Duration::from_millis(15));
        let e = wait_readable(quiet.as_fd(), until, "ibv_get_async_event", "rxe0").unwrap_err();
        assert!(
            matches!(e, Error::Timeout { what: "ibv_get_async_event", after } if after == Duration::from_millis(15)),
            "{e:?}"
        );
    }
}
