//! Memory regions over DMA-BUF file descriptors: [`DmaBufRegion`] (`ibv_reg_dmabuf_mr`).
//!
//! A DMA-BUF is memory another driver exports as a file descriptor: a GPU's or an
//! accelerator's, or, without either, `udmabuf`'s view of a memfd. The region owns the
//! descriptor, so the buffer lives at least as long as the registration. The CPU has no mapping
//! of it here: the region gives its keys and [`remote`](DmaBufRegion::remote) for peers, never
//! slices, and no [`Sge`](crate::Sge) either: an SGE's address is read as CPU memory by a
//! request made inline (`SendRequest::inline`), and a DMA-BUF's is an I/O virtual address.
//!
//! # References
//! - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html) (`ibv_reg_dmabuf_mr`)

use std::fmt;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::ffi;

use crate::error::{Error, Result};
use crate::mr::{AccessFlags, RemoteRegion};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;

/// A memory region over a DMA-BUF (`ibv_reg_dmabuf_mr`); deregistered on drop, then its file
/// descriptor is closed.
///
/// The address in [`remote`](Self::remote) is an I/O virtual address: the `iova` it was
/// registered at.
#[doc(alias = "ibv_reg_dmabuf_mr")]
#[must_use = "dropping it at once releases what was just made"]
pub struct DmaBufRegion<'pd> {
    raw: NonNull<ffi::ibv_mr>,
    len: usize,
    iova: u64,
    access: AccessFlags,
    /// Dropped after the region is deregistered (fields drop after `Drop::drop`).
    _fd: OwnedFd,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
}

// SAFETY: the region is used only through verbs and plain reads of its keys; the CPU never
// touches the buffer through it.
unsafe impl Send for DmaBufRegion<'_> {}
// SAFETY: as above.
unsafe impl Sync for DmaBufRegion<'_> {}

impl fmt::Debug for DmaBufRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBufRegion").field("iova", &self.iova).field("len", &self.len).finish()
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// Registers `len` bytes of the DMA-BUF `fd` from `offset`, at I/O virtual address `iova`,
    /// with `access`: `ibv_reg_dmabuf_mr()`. The region owns `fd`.
    ///
    /// # Errors
    /// As [`DmaBufRegion::register`].
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn reg_dmabuf_mr(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DmaBufRegion<'_>> {
        DmaBufRegion::register(self, fd, offset, len, iova, access)
    }
}

impl<'pd> DmaBufRegion<'pd> {
    /// Registers `len` bytes of the DMA-BUF `fd` from `offset` with `pd`, borrowed or shared
    /// (see [`Parent`]): `ibv_reg_dmabuf_mr()`. The region owns `fd`; on error it is closed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length, remote write or atomic access without
    /// `LOCAL_WRITE`, or `MW_BIND`/`ON_DEMAND` (not for DMA-BUF regions here);
    /// [`Error::Unsupported`] when the device takes no DMA-BUF (`EOPNOTSUPP`: rxe on Linux 6.1
    /// and 6.12); [`Error::Verb`] otherwise (`EINVAL` for a descriptor that is no DMA-BUF or a
    /// range outside it).
    #[doc(alias = "ibv_reg_dmabuf_mr")]
    pub fn register(
        pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<Self> {
        const VERB: &str = "ibv_reg_dmabuf_mr";
        let pd = pd.into();
        let device = Some(pd.context().name());
        if len == 0 {
            return Err(Error::invalid(VERB, device, "a region of zero bytes"));
        }
        if access.intersects(AccessFlags::MW_BIND | AccessFlags::ON_DEMAND) {
            return Err(Error::invalid(VERB, device, "MW_BIND and ON_DEMAND are not taken for DMA-BUF regions"));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::invalid(VERB, device, "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"));
        }
        // SAFETY: a live PD; the kernel checks the descriptor and the range and takes its own
        // reference to the buffer; no CPU memory of ours is named.
        let raw = unsafe {
            ffi::ibv_reg_dmabuf_mr(pd.as_raw(), offset, len, iova, fd.as_raw_fd(), access.bits() as libc::c_int)
        };
        let Some(raw) = NonNull::new(raw) else {
            let e = Error::last_os_error(VERB, device);
            return Err(match e.errno() {
                Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                    verb: VERB,
                    device: device.map(str::to_owned),
                    reason: "the device registers no DMA-BUF memory".into(),
                    errno: Some(errno),
                },
                _ => e,
            });
        };
        pd.context().registry().add(crate::registry::Kind::Mr, raw.as_ptr());
        Ok(DmaBufRegion { raw, len, iova, access, _fd: fd, pd })
    }

    /// The local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        // SAFETY: registered until drop.
        unsafe { self.raw.as_ref().lkey }
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: registered until drop.
        unsafe { self.raw.as_ref().rkey }
    }

    /// The I/O virtual address of its first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: registration refuses zero bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its access flags.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The whole region as a peer names it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.iova, rkey: self.rkey(), len: self.len as u64 }
    }

    /// The raw `struct ibv_mr *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for DmaBufRegion<'_> {
    #[doc(alias = "ibv_dereg_mr")]
    fn drop(&mut self) {
        // SAFETY: registered, deregistered only here. The descriptor closes after this; the
        // kernel keeps its own reference to the buffer for as long as it needs it.
        let _ =
            self.pd.context().registry().release(self.raw.as_ptr(), || unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) });
    }
}
