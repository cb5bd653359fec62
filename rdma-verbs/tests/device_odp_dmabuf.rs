//! Device tests: on-demand paging and DMA-BUF regions on rxe, which has neither (Linux 6.1
//! and 6.12): the typed refusals, with the raw verbs' own answers as the evidence.

use std::os::fd::{FromRawFd, OwnedFd};

use rdma_verbs::*;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn on_demand_regions_are_refused_on_a_device_without_odp() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let odp = ctx.query_device_ex().unwrap().odp;
    assert!(!odp.supported, "rxe on the harness's kernels has no ODP: {odp:?}");
    let pd = ctx.alloc_pd().unwrap();
    let e = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).unwrap_err();
    assert!(matches!(e, Error::Unsupported { errno: None, .. }), "{e}");
    // The evidence: the verb itself refuses ODP on rxe.
    let mut buf = vec![0u8; 4096];
    let access = (AccessFlags::LOCAL_WRITE | AccessFlags::ON_DEMAND).bits() as libc::c_int;
    // SAFETY: a live PD and a buffer that outlives the (failed, or at once deregistered) region.
    let raw = unsafe { ffi::ibv_reg_mr(pd.as_raw(), buf.as_mut_ptr().cast(), buf.len(), access) };
    let err = errno();
    if !raw.is_null() {
        // SAFETY: registered just now, not used after.
        unsafe { ffi::ibv_dereg_mr(raw) };
    }
    assert!(raw.is_null(), "rxe registered an ODP region");
    // 6.1's rxe calls it an invalid argument, 6.12's an unsupported one: the crate's check
    // before the verb gives one typed error for both.
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let expected = if kernel.starts_with("6.1.") { libc::EINVAL } else { libc::EOPNOTSUPP };
    assert_eq!(err, expected, "kernel {kernel}: rxe's refusal of IBV_ACCESS_ON_DEMAND");
}

#[test]
fn advice_is_refused_by_a_provider_that_takes_none() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    for advice in [MrAdvice::Prefetch, MrAdvice::PrefetchWrite, MrAdvice::PrefetchNoFault] {
        let e = mr.advise(advice, ..4096).unwrap_err();
        assert!(matches!(e, Error::Unsupported { errno: Some(libc::EOPNOTSUPP), .. }), "{advice:?}: {e}");
    }
    let e = mr.advise(MrAdvice::Prefetch, 4096..16384).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
}

/// A memfd of `len` bytes (sealed against shrinking, as udmabuf requires).
fn memfd(len: usize) -> OwnedFd {
    // SAFETY: plain syscalls on a fd this function owns.
    unsafe {
        let fd = libc::memfd_create(c"rdma-verbs-test".as_ptr(), libc::MFD_ALLOW_SEALING);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        assert_eq!(libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&fd), len as libc::off_t), 0);
        assert_eq!(libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        fd
    }
}

/// `struct udmabuf_create` (`include/uapi/linux/udmabuf.h`).
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// A DMA-BUF of `len` bytes from `/dev/udmabuf` (`UDMABUF_CREATE`), if the kernel has it.
fn udmabuf(len: usize) -> Option<OwnedFd> {
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/udmabuf").ok()?;
    let mem = memfd(len);
    let create = UdmabufCreate {
        memfd: std::os::fd::AsRawFd::as_raw_fd(&mem) as u32,
        flags: 0x01, // UDMABUF_FLAGS_CLOEXEC
        offset: 0,
        size: len as u64,
    };
    // _IOW('u', 0x42, struct udmabuf_create)
    const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
    // SAFETY: the ioctl reads `create`, which outlives the call, and returns a new fd.
    let fd = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&dev), UDMABUF_CREATE, &create) };
    assert!(fd >= 0, "UDMABUF_CREATE: {}", std::io::Error::last_os_error());
    // SAFETY: a new fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[test]
fn dma_buf_regions_are_refused_by_rxe() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let len = 64 * 1024;
    let fd = match udmabuf(len) {
        Some(fd) => fd,
        None => {
            // 6.1's Debian kernel has no udmabuf: a plain memfd shows the same refusal, which
            // comes before the descriptor is looked at.
            assert!(kernel.starts_with("6.1."), "kernel {kernel}: /dev/udmabuf is missing");
            memfd(len)
        }
    };
    let e = pd.reg_dmabuf_mr(fd, 0, len, 0, AccessFlags::LOCAL_WRITE).unwrap_err();
    assert!(matches!(e, Error::Unsupported { errno: Some(libc::EOPNOTSUPP), .. }), "kernel {kernel}: {e}");
    let e = pd.reg_dmabuf_mr(memfd(len), 0, 0, 0, AccessFlags::LOCAL_WRITE).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}
