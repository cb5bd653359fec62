//! The crate's one error type.

use std::fmt;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `rdma-verbs`.
///
/// Errors from libibverbs carry the verb that failed and its `errno`; errors found before any verb
/// is called (bad arguments) say which argument and why. Match on the variant, or use
/// [`Error::errno`] and [`Error::verb`] for logging.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb returned an error.
    #[error("{verb}{}: {}", OnDevice(.device), std::io::Error::from_raw_os_error(*.errno))]
    Verb {
        /// The libibverbs function that failed, e.g. `"ibv_query_port"`.
        verb: &'static str,
        /// The device the verb was called on, when there was one.
        device: Option<String>,
        /// The `errno` it reported.
        errno: i32,
    },
    /// No RDMA device was found, or none with the requested name.
    #[error("{}", no_device_message(.name.as_deref(), .available))]
    NoDevice {
        /// The name asked for; `None` when any device would have done.
        name: Option<String>,
        /// The names of the devices that do exist.
        available: Vec<String>,
    },
    /// `ibv_post_send` / `ibv_post_recv` / `ibv_post_srq_recv` refused a request of a chain;
    /// those before it were posted.
    #[error("{verb}{}: {} (the first {posted} request(s) of the chain may have been posted)", OnDevice(.device), PostErrno(*.errno))]
    PostFailed {
        /// The verb.
        verb: &'static str,
        /// The device.
        device: Option<String>,
        /// The `errno` it returned (`ENOMEM`: the queue is full).
        errno: i32,
        /// How many requests of the chain (counted from 0, in slice order) may have been
        /// posted: those before the refused one, or all of them when the provider did not say
        /// which it refused.
        posted: usize,
    },
    /// A wait ran out of time.
    #[error("{what}: timed out after {after:?}")]
    Timeout {
        /// What was waited for, e.g. `"ibv_get_cq_event"` or `"draining a posting scope"`.
        what: &'static str,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// A wait for completions or messages that nothing can end: nothing is in flight, posted or
    /// outstanding that could complete (a send queue with no request in flight, a receive ring
    /// with no receive posted, a posting scope asked for more completions than it has requests
    /// outstanding). Returned at once, whatever the timeout.
    #[error("{what}: nothing is outstanding, so nothing can arrive")]
    NothingToWaitFor {
        /// What was waited for, e.g. `"send completions"` or `"a received message"`.
        what: &'static str,
    },
    /// An async wait was called outside a tokio runtime (feature `tokio`).
    #[error("{what}: an async wait needs a tokio runtime (none is running on this thread)")]
    NoRuntime {
        /// What was waited for.
        what: &'static str,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {status:?} (vendor error {vendor_err:#x})")]
    WorkCompletion {
        /// The failed request's `wr_id`.
        wr_id: u64,
        /// Why it failed.
        status: crate::WcStatus,
        /// The provider's own error code.
        vendor_err: u32,
    },
    /// A queue has no room for more requests: the QP's send or receive queue, or a completion
    /// queue that could not hold their completions. Nothing was posted.
    #[error("posting{}: the {queue} is full ({outstanding} of {capacity} entries in use)", OnDevice(.device))]
    QueueFull {
        /// The device.
        device: Option<String>,
        /// Which queue: `"send queue"`, `"receive queue"`, `"completion queue"`, ...
        queue: &'static str,
        /// How many entries it holds.
        capacity: u32,
        /// How many were in use.
        outstanding: u32,
    },
    /// A completion queue (or an SRQ) is owned already, by a posting scope, a
    /// [`SendQueue`](crate::SendQueue) or a [`RecvRing`](crate::RecvRing): a second owner, or a
    /// direct poll, would take completions the owner waits for.
    #[error("{what}{}: already owned by {}", OnDevice(.device), Holder(.holder))]
    Busy {
        /// What was refused, e.g. `"ibv_poll_cq"` or `"QueuePair::scope"`.
        what: &'static str,
        /// Who holds it (`None`: a thread polling the CQ directly did not stop).
        holder: Option<crate::CqHolder>,
        /// The device.
        device: Option<String>,
    },
    /// A range of a memory region outside it (or an SGE over 4 GiB). No verb was called.
    #[error("{what}: {len} bytes at offset {offset} do not fit the {region_len}-byte region")]
    OutOfBounds {
        /// The method, e.g. `"MemoryRegion::read_at"`.
        what: &'static str,
        /// The first byte asked for.
        offset: usize,
        /// How many bytes.
        len: usize,
        /// The region's (or, for an SGE, the 4 GiB limit's) length.
        region_len: usize,
    },
    /// A plain slice of a region a peer may write at any time (`REMOTE_WRITE`, `REMOTE_ATOMIC`
    /// or `MW_BIND`) was asked for: copy with `read_at` instead.
    #[error("{what}: a peer may write this region at any time (it has remote write access)")]
    RemotelyWritable {
        /// The method, e.g. `"MemoryRegion::as_mut_slice"`.
        what: &'static str,
    },
    /// The device does not do what was asked: it does not advertise the capability (no verb
    /// was called, `errno` is `None`), or the verb refused it as unsupported (`EOPNOTSUPP`,
    /// `ENOSYS`, or what the provider returns instead, in `errno`).
    #[error("{verb}{}: not supported: {reason}", OnDevice(.device))]
    Unsupported {
        /// The verb that was, or would have been, called.
        verb: &'static str,
        /// The device.
        device: Option<String>,
        /// What is missing, and the evidence (capability bit, errno).
        reason: String,
        /// The `errno` the verb reported, when it was called.
        errno: Option<i32>,
    },
    /// Huge pages could not be mapped for a [`HugePageBuffer`](crate::HugePageBuffer):
    /// `mmap(MAP_HUGETLB)` failed, or was not called for an empty buffer (`EINVAL`). `ENOMEM`:
    /// the kernel's pool of that page size has fewer free pages than the buffer needs, as when
    /// none are reserved; the message says how to reserve them.
    #[error("mmap(MAP_HUGETLB) of {len} bytes in {page_size} pages: {}", HugePagesReason { errno: *.errno, len: *.len, page_size: *.page_size })]
    HugePages {
        /// The length asked for.
        len: usize,
        /// The page size asked for.
        page_size: crate::HugePageSize,
        /// The `errno` of `mmap`.
        errno: i32,
    },
    /// An argument was rejected before any verb was called.
    #[error("{verb}{}: invalid argument: {reason}", OnDevice(.device))]
    InvalidArgument {
        /// The verb that would have been called.
        verb: &'static str,
        /// The device it would have been called on, when there was one.
        device: Option<String>,
        /// What is wrong with the argument.
        reason: String,
    },
}

impl Error {
    /// The `errno` a verb (or, for [`Error::HugePages`], `mmap`) reported, if this error came
    /// from one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { errno, .. } | Error::PostFailed { errno, .. } | Error::HugePages { errno, .. } => {
                Some(*errno)
            }
            Error::Unsupported { errno, .. } => *errno,
            _ => None,
        }
    }

    /// The verb that failed or would have been called, if any.
    pub fn verb(&self) -> Option<&'static str> {
        match self {
            Error::Verb { verb, .. }
            | Error::InvalidArgument { verb, .. }
            | Error::PostFailed { verb, .. }
            | Error::Unsupported { verb, .. } => Some(verb),
            Error::NoDevice { .. }
            | Error::OutOfBounds { .. }
            | Error::RemotelyWritable { .. }
            | Error::Timeout { .. }
            | Error::NothingToWaitFor { .. }
            | Error::NoRuntime { .. }
            | Error::WorkCompletion { .. }
            | Error::Busy { .. }
            | Error::QueueFull { .. }
            | Error::HugePages { .. } => None,
        }
    }

    /// An error from `verb`, with the calling thread's current `errno`.
    pub(crate) fn last_os_error(verb: &'static str, device: Option<&str>) -> Self {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        Self::from_errno(verb, device, errno)
    }

    /// `Ok` for a verb's return code of 0, else the error of `verb` with that code as `errno`
    /// (for verbs that return it rather than set it).
    pub(crate) fn check(verb: &'static str, device: Option<&str>, rc: libc::c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(Self::from_errno(verb, device, rc))
    }

    /// An error from `verb` with an explicit `errno` (verbs that return it rather than set it).
    pub(crate) fn from_errno(verb: &'static str, device: Option<&str>, errno: i32) -> Self {
        Error::Verb { verb, device: device.map(str::to_owned), errno }
    }

    /// A post verb's refusal: `errno` as it returned it, and how many of the caller's requests
    /// were posted before the one it refused.
    pub(crate) fn post_failed(verb: &'static str, device: &str, errno: i32, posted: usize) -> Self {
        Error::PostFailed { verb, device: Some(device.to_owned()), errno, posted }
    }

    /// The device lacks what `verb` needs (a capability it does not advertise); no verb called.
    pub(crate) fn unsupported(verb: &'static str, device: Option<&str>, reason: impl Into<String>) -> Self {
        Error::Unsupported { verb, device: device.map(str::to_owned), reason: reason.into(), errno: None }
    }

    pub(crate) fn invalid(verb: &'static str, device: Option<&str>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { verb, device: device.map(str::to_owned), reason: reason.into() }
    }
}

/// Why huge pages could not be mapped, and what to do about it.
struct HugePagesReason {
    errno: i32,
    len: usize,
    page_size: crate::HugePageSize,
}

impl fmt::Display for HugePagesReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.page_size.sysfs_dir();
        match self.errno {
            libc::EINVAL if self.len == 0 => write!(f, "a buffer cannot be empty"),
            libc::ENOMEM => {
                let pages = self.len.div_ceil(self.page_size.bytes());
                write!(
                    f,
                    "{}: fewer than {pages} huge page(s) of {} are free ({dir}/free_hugepages; a kernel \
                     reserves none by default); as root, reserve them with `echo N > {dir}/nr_hugepages`",
                    std::io::Error::from_raw_os_error(self.errno),
                    self.page_size,
                )?;
                if self.page_size == crate::HugePageSize::default() {
                    write!(f, " (or /proc/sys/vm/nr_hugepages)")?;
                }
                write!(f, " or `hugeadm --pool-pages-min {}:N`", self.page_size.hugeadm_name())
            }
            libc::EINVAL => write!(
                f,
                "{}: the kernel may have no huge pages of {} (is there a {dir}?)",
                std::io::Error::from_raw_os_error(self.errno),
                self.page_size
            ),
            errno => write!(f, "{}", std::io::Error::from_raw_os_error(errno)),
        }
    }
}

/// An errno as text, saying so plainly when the queue is full.
struct PostErrno(i32);

impl fmt::Display for PostErrno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == libc::ENOMEM {
            write!(f, "the queue is full (ENOMEM)")
        } else {
            write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
        }
    }
}

struct Holder<'a>(&'a Option<crate::CqHolder>);

impl fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(h) => write!(f, "{h}"),
            None => write!(f, "a thread polling it"),
        }
    }
}

struct OnDevice<'a>(&'a Option<String>);

impl fmt::Display for OnDevice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(device) => write!(f, " on {device}"),
            None => Ok(()),
        }
    }
}

fn no_device_message<'a>(name: Option<&'a str>, available: &'a [String]) -> NoDeviceMessage<'a> {
    NoDeviceMessage { name, available }
}

struct NoDeviceMessage<'a> {
    name: Option<&'a str>,
    available: &'a [String],
}

impl fmt::Display for NoDeviceMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "no RDMA device named {name:?}")?,
            None => write!(f, "no RDMA device found")?,
        }
        if self.available.is_empty() {
            write!(f, " (no devices at all: is an RDMA driver loaded? `ibv_devices` lists them)")
        } else {
            write!(f, " (available: {})", self.available.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verb_error_names_verb_device_and_errno() {
        let e = Error::from_errno("ibv_query_port", Some("rxe0"), libc::EINVAL);
        let text = e.to_string();
        assert!(text.starts_with("ibv_query_port on rxe0: "), "{text}");
        assert!(text.contains("os error 22"), "{text}");
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert_eq!(e.verb(), Some("ibv_query_port"));
    }

    #[test]
    fn converts_with_question_mark_into_boxed_errors() {
        fn boxed() -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
            Err(Error::from_errno("ibv_alloc_pd", Some("rxe0"), libc::ENOMEM))?;
            Ok(())
        }
        let e = boxed().unwrap_err();
        assert!(e.to_string().starts_with("ibv_alloc_pd on rxe0: "), "{e}");
        assert!(e.downcast_ref::<Error>().is_some_and(|e| e.errno() == Some(libc::ENOMEM)));
    }

    #[test]
    fn a_full_queue_says_so() {
        let e =
            Error::PostFailed { verb: "ibv_post_send", device: Some("rxe0".into()), errno: libc::ENOMEM, posted: 3 };
        assert_eq!(
            e.to_string(),
            "ibv_post_send on rxe0: the queue is full (ENOMEM) (the first 3 request(s) of the chain may have been posted)"
        );
        let e = Error::QueueFull { device: None, queue: "send queue", capacity: 64, outstanding: 64 };
        assert_eq!(e.to_string(), "posting: the send queue is full (64 of 64 entries in use)");
    }

    #[test]
    fn missing_huge_pages_say_how_to_reserve_them() {
        let e = Error::HugePages { len: 5 << 20, page_size: crate::HugePageSize::Size2MiB, errno: libc::ENOMEM };
        let text = e.to_string();
        assert!(text.starts_with("mmap(MAP_HUGETLB) of 5242880 bytes in 2 MiB pages: "), "{text}");
        assert!(text.contains("os error 12"), "{text}");
        assert!(text.contains("fewer than 3 huge page(s) of 2 MiB are free"), "{text}");
        assert!(text.contains("echo N > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"), "{text}");
        assert!(text.contains("/proc/sys/vm/nr_hugepages"), "{text}");
        assert!(text.contains("hugeadm --pool-pages-min 2MB:N"), "{text}");
        assert_eq!((e.errno(), e.verb()), (Some(libc::ENOMEM), None));
        // 1 GiB pages: their own pool, not the default one of /proc/sys/vm/nr_hugepages.
        let e = Error::HugePages { len: 1, page_size: crate::HugePageSize::Size1GiB, errno: libc::ENOMEM };
        let text = e.to_string();
        assert!(text.contains("hugepages-1048576kB/nr_hugepages"), "{text}");
        assert!(!text.contains("/proc/sys/vm/nr_hugepages"), "{text}");
        assert!(text.contains("1GB:N"), "{text}");
        let e = Error::HugePages { len: 1, page_size: crate::HugePageSize::Size1GiB, errno: libc::EINVAL };
        assert!(e.to_string().contains("no huge pages of 1 GiB"), "{e}");
    }

    #[test]
    fn no_device_lists_what_exists() {
        let e = Error::NoDevice { name: Some("mlx5_0".into()), available: vec!["rxe0".into(), "rxe1".into()] };
        assert_eq!(e.to_string(), "no RDMA device named \"mlx5_0\" (available: rxe0, rxe1)");
        let e = Error::NoDevice { name: None, available: vec![] };
        assert!(e.to_string().starts_with("no RDMA device found (no devices at all"), "{e}");
        assert_eq!(e.errno(), None);
    }
}
