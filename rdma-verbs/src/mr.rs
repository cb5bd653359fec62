//! Memory regions: [`MemoryRegion`], [`AccessFlags`], [`RemoteRegion`], [`Sge`]; the buffers
//! they own are in `buffer.rs` ([`AlignedBuffer`], [`HugePageBuffer`], [`RegisteredBuffer`]).
//!
//! # The memory model
//! A registered region is memory the NIC may read and write at any time a work request (or, with
//! remote access, a peer) lets it. Rust must never hold a `&[u8]` or `&mut [u8]` to bytes that
//! may change under it, so:
//! - a `MemoryRegion` **owns** its buffer; it is never handed out as a plain slice while the
//!   NIC may write it;
//! - [`MemoryRegion::read_at`] and [`MemoryRegion::write_at`] copy through raw pointers and are
//!   always sound, even while work requests run;
//! - [`MemoryRegion::as_mut_slice`] gives a plain slice only for a region no peer can write
//!   (no `REMOTE_WRITE` or `REMOTE_ATOMIC`) and only through `&mut self`, which proves no safe
//!   posting scope still uses it (scopes borrow the region until its requests complete);
//! - dropping a region deregisters it first, which revokes the NIC's access before the memory
//!   is freed: a request still in flight then fails, it cannot write freed memory;
//! - [`MemoryRegion::into_inner`] deregisters and gives the buffer back as a plain value.
//!
//! The [crate docs](crate#safety-model) summarise the whole safety model.

pub use crate::buffer::{AlignedBuffer, HugePageBuffer, HugePageSize, RegisteredBuffer, PAGE_SIZE};
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::ptr::NonNull;

use crate::ffi;

use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;

bitflags::bitflags! {
    /// What the NIC may do with a memory region (`enum ibv_access_flags`).
    ///
    /// The NIC may always read a region for local requests (sends, the source of a write).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The NIC may write it for local requests: receives, the destination of a READ or of
        /// an atomic's old value (`IBV_ACCESS_LOCAL_WRITE`).
        const LOCAL_WRITE = 1;
        /// A peer may RDMA WRITE into it (`IBV_ACCESS_REMOTE_WRITE`; needs `LOCAL_WRITE`).
        const REMOTE_WRITE = 1 << 1;
        /// A peer may RDMA READ from it (`IBV_ACCESS_REMOTE_READ`).
        const REMOTE_READ = 1 << 2;
        /// A peer may run atomics on it (`IBV_ACCESS_REMOTE_ATOMIC`; needs `LOCAL_WRITE`).
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to it (`IBV_ACCESS_MW_BIND`). A window may grant a peer
        /// write access, so such a region counts as [remotely writable](Self::remotely_writable).
        const MW_BIND = 1 << 4;
        /// On-demand paging (`IBV_ACCESS_ON_DEMAND`): the device faults pages in as it uses
        /// them instead of pinning them at registration. Refused with
        /// [`Error::Unsupported`](crate::Error::Unsupported) on a device without ODP.
        const ON_DEMAND = 1 << 6;
        /// Relaxed PCIe ordering, where supported (`IBV_ACCESS_RELAXED_ORDERING`).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// Whether a peer can change the region's bytes: directly, or through a memory window.
    pub fn remotely_writable(self) -> bool {
        self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC | AccessFlags::MW_BIND)
    }
}

/// A registered memory region (`struct ibv_mr`) owning its buffer; deregistered on drop.
///
/// It borrows its [`ProtectionDomain`], so it cannot outlive it:
///
/// ```compile_fail
/// # use rdma_verbs::{AccessFlags, Context};
/// let ctx = Context::open("rxe0").unwrap();
/// let mr = {
///     let pd = ctx.alloc_pd().unwrap();
///     pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap()
/// }; // error: `pd` does not live long enough
/// ```
///
/// # References
/// - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
#[doc(alias = "ibv_mr")]
#[must_use = "dropping it at once releases what was just made"]
pub struct MemoryRegion<'pd, B: RegisteredBuffer = AlignedBuffer> {
    raw: NonNull<ffi::ibv_mr>,
    /// Owned, and reached only through `ptr` while registered.
    buf: Option<B>,
    ptr: *mut u8,
    len: usize,
    access: AccessFlags,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
}

// SAFETY: the region owns its buffer; the NIC's accesses are not Rust accesses; every method
// that touches the bytes through `&self` copies through raw pointers (see the module docs).
//
// Not `Sync`, like `Cell`: `read_at` and `write_at` copy through `&self` without
// synchronisation, so two threads sharing `&MemoryRegion` would race on the bytes. A region
// moves to another thread whole, or is shared behind a lock.
unsafe impl<B: RegisteredBuffer + Send> Send for MemoryRegion<'_, B> {}

impl<B: RegisteredBuffer> std::fmt::Debug for MemoryRegion<'_, B> {
    /// The registration, never the bytes: a peer or a request may be writing them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.ptr as usize))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it: `ibv_reg_mr()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length, a length over the device's `max_mr_size`, or
    /// remote access without `LOCAL_WRITE`; [`Error::Verb`] when the registration fails.
    #[doc(alias = "ibv_reg_mr")]
    pub fn alloc_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion<'_, AlignedBuffer>> {
        MemoryRegion::alloc(self, len, access)
    }

    /// Registers a buffer the caller made, taking ownership of it: `ibv_reg_mr()`.
    ///
    /// `Vec<u8>`, `Box<[u8]>`, [`AlignedBuffer`], [`HugePageBuffer`] and, with the feature
    /// `memmap2`, a `memmap2::MmapMut` can be registered; get the buffer back with
    /// [`MemoryRegion::into_inner`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty buffer, one over the device's `max_mr_size`,
    /// remote atomics on a buffer not 8-byte aligned, or remote access without `LOCAL_WRITE`;
    /// [`Error::Verb`] when the registration fails.
    ///
    /// # References
    /// - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_mr")]
    pub fn register<B: RegisteredBuffer>(&self, buf: B, access: AccessFlags) -> Result<MemoryRegion<'_, B>> {
        MemoryRegion::register(self, buf, access)
    }

    fn check_mr_len(&self, len: usize) -> Result<()> {
        let max = self.context().attr().max_mr_size;
        if len == 0 {
            return Err(Error::invalid("ibv_reg_mr", Some(self.context().name()), "a memory region cannot be empty"));
        }
        if len as u64 > max {
            return Err(Error::invalid(
                "ibv_reg_mr",
                Some(self.context().name()),
                format!("{len} bytes is over the device's max_mr_size of {max}"),
            ));
        }
        Ok(())
    }
}

/// A part of a memory region as the peer must name it: address, remote key and length.
///
/// Plain data to send to a peer, which then targets it with RDMA WRITE, READ or atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The virtual address of the first byte.
    pub addr: u64,
    /// The remote key.
    pub rkey: u32,
    /// The number of bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// The part of this region from `offset` on, `len` bytes long; `None` if it does not fit.
    ///
    /// Sound on any numbers a peer sent: no arithmetic overflows or wraps.
    pub fn slice(&self, offset: u64, len: u64) -> Option<RemoteRegion> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        let addr = self.addr.checked_add(offset)?;
        addr.checked_add(len)?;
        Some(RemoteRegion { addr, rkey: self.rkey, len })
    }
}

/// A scatter/gather entry (`struct ibv_sge`): a part of a registered region that a work request
/// reads or writes. It borrows the region.
#[doc(alias = "ibv_sge")]
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Sge<'mr> {
    raw: ffi::ibv_sge,
    _mr: PhantomData<&'mr ()>,
}

/// An SGE for `range` of a region of `region_len` bytes at `addr` with `lkey`, borrowing the
/// region for `'a`.
pub(crate) fn region_sge<'a>(
    what: &'static str,
    addr: u64,
    lkey: u32,
    region_len: usize,
    range: impl RangeBounds<usize>,
) -> Result<Sge<'a>> {
    let asked = (range.start_bound().cloned(), range.end_bound().cloned());
    let (start, end) = bounds(asked, region_len).ok_or_else(|| {
        let start = match asked.0 {
            Bound::Included(s) => s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match asked.1 {
            Bound::Included(e) => e.saturating_add(1),
            Bound::Excluded(e) => e,
            Bound::Unbounded => region_len,
        };
        Error::OutOfBounds { what, offset: start, len: end.saturating_sub(start), region_len }
    })?;
    let length = u32::try_from(end - start).map_err(|_| Error::OutOfBounds {
        what: "one SGE covers at most 4 GiB",
        offset: start,
        len: end - start,
        region_len: u32::MAX as usize,
    })?;
    Ok(Sge { raw: ffi::ibv_sge { addr: addr + start as u64, length, lkey }, _mr: PhantomData })
}

impl std::fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sge {{ addr: {:#x}, len: {}, lkey: {:#x} }}", self.raw.addr, self.raw.length, self.raw.lkey)
    }
}

impl Sge<'_> {
    /// An SGE of `len` bytes naming no memory, for tests of request checks that never post.
    #[cfg(test)]
    pub(crate) fn unregistered(len: u32) -> Sge<'static> {
        Sge { raw: ffi::ibv_sge { addr: 0x2000, length: len, lkey: 1 }, _mr: PhantomData }
    }

    /// The address of the first byte.
    pub fn addr(&self) -> u64 {
        self.raw.addr
    }
    /// The number of bytes.
    pub fn len(&self) -> u32 {
        self.raw.length
    }
    /// Whether it covers no byte.
    pub fn is_empty(&self) -> bool {
        self.raw.length == 0
    }
    /// The local key of the region.
    pub fn lkey(&self) -> u32 {
        self.raw.lkey
    }
    /// The `struct ibv_sge`.
    pub fn as_raw(&self) -> ffi::ibv_sge {
        self.raw
    }
}

pub(crate) fn bounds(range: impl RangeBounds<usize>, len: usize) -> Option<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1)?,
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    (start <= end && end <= len).then_some((start, end))
}

impl<'pd> MemoryRegion<'pd, AlignedBuffer> {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers it with `pd`,
    /// borrowed or shared (see [`Parent`]): `ibv_reg_mr()`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mr`].
    ///
    /// # References
    /// - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_mr")]
    pub fn alloc(pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>, len: usize, access: AccessFlags) -> Result<Self> {
        let pd = pd.into();
        pd.check_mr_len(len)?;
        let buf = AlignedBuffer::zeroed(len)
            .ok_or_else(|| Error::invalid("ibv_reg_mr", Some(pd.context().name()), "cannot allocate the buffer"))?;
        MemoryRegion::register(pd, buf, access)
    }
}

impl<'pd, B: RegisteredBuffer> MemoryRegion<'pd, B> {
    /// Registers `buf` with `pd`, borrowed or shared (see [`Parent`]), taking ownership of the
    /// buffer: `ibv_reg_mr()`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::register`].
    ///
    /// # References
    /// - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html)
    #[doc(alias = "ibv_reg_mr")]
    pub fn register(
        pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>,
        mut buf: B,
        access: AccessFlags,
    ) -> Result<Self> {
        let pd = pd.into();
        let dev = Some(pd.context().name());
        let len = buf.len();
        pd.check_mr_len(len)?;
        let ptr = buf.as_mut_ptr();
        if access.contains(AccessFlags::REMOTE_ATOMIC) && ptr as usize % 8 != 0 {
            return Err(Error::invalid("ibv_reg_mr", dev, "remote atomics need an 8-byte aligned buffer"));
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(Error::invalid("ibv_reg_mr", dev, "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE"));
        }
        crate::odp::check_on_demand(pd.context(), access, "ibv_reg_mr")?;
        // SAFETY: `ptr` is valid for `len` bytes for as long as `buf` lives, which the region
        // owns until it deregisters (RegisteredBuffer's contract); the PD is held by `pd`.
        let raw = unsafe { ffi::ibv_reg_mr(pd.as_raw(), ptr.cast(), len, access.bits() as libc::c_int) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_reg_mr", dev))?;
        pd.context().registry().add(crate::registry::Kind::Mr, raw.as_ptr());
        Ok(MemoryRegion { raw, buf: Some(buf), ptr, len, access, pd })
    }

    /// The protection domain the region is registered with.
    pub fn pd(&self) -> &ProtectionDomain<'pd> {
        &self.pd
    }

    /// The local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` is a registered region until drop.
        unsafe { self.raw.as_ref().lkey }
    }

    /// The remote key, for peers.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.raw.as_ref().rkey }
    }

    /// The virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an empty region cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access the region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The whole region as a peer must name it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), rkey: self.rkey(), len: self.len as u64 }
    }

    /// A scatter/gather entry for `range` of the region.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range is outside the region or over 4 GiB.
    pub fn sge(&self, range: impl RangeBounds<usize>) -> Result<Sge<'_>> {
        region_sge("MemoryRegion::sge", self.addr(), self.lkey(), self.len, range)
    }

    /// Copies `dst.len()` bytes from `offset` of the region into `dst`.
    ///
    /// Always sound, even while the NIC writes the region: the bytes are read through raw
    /// pointers, never through a reference. What they hold while a write is in flight is the
    /// protocol's business (wait for its completion, or the peer's message saying it is done).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range is outside the region.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let (start, _) = self.range_of("MemoryRegion::read_at", offset, dst.len())?;
        // SAFETY: `start..start + dst.len()` is inside the registered buffer, which lives as
        // long as `self`; `dst` is a distinct Rust allocation. u8 has no invalid values, and the
        // NIC's DMA is not a Rust access, so a concurrent write yields some bytes, not UB.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(start), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// Sound for the same reasons as [`read_at`](Self::read_at); a send that reads these bytes
    /// while they are copied may carry old or new bytes.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range is outside the region.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        let (start, _) = self.range_of("MemoryRegion::write_at", offset, src.len())?;
        // SAFETY: as in `read_at`; no Rust reference to the region's bytes exists while `&self`
        // is shared (plain slices need `&mut self`).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(start), src.len()) };
        Ok(())
    }

    /// The region's bytes as a plain slice, for a region no peer can write.
    ///
    /// `&mut self` proves that no safe posting scope is using the region (scopes borrow it until
    /// its requests completed), and without `REMOTE_WRITE`/`REMOTE_ATOMIC`/`MW_BIND` no peer can change it.
    /// Requests posted with the `unsafe` raw post functions are the caller's to finish first.
    ///
    /// # Errors
    /// [`Error::RemotelyWritable`] for a remotely writable region: use [`read_at`](Self::read_at),
    /// or [`as_mut_slice_unchecked`](Self::as_mut_slice_unchecked).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        if self.access.remotely_writable() {
            return Err(Error::RemotelyWritable { what: "MemoryRegion::as_mut_slice" });
        }
        // SAFETY: see above; `&mut self` is exclusive for the slice's lifetime.
        Ok(unsafe { self.as_mut_slice_unchecked() })
    }

    /// The region's bytes as a plain slice, whatever its access flags.
    ///
    /// # Safety
    /// For as long as the slice lives, neither a work request nor a peer may write the region:
    /// every request posted on it has completed, and no peer holding its rkey will write (for
    /// example the protocol told the peer it is done, and the peer is trusted).
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> &mut [u8] {
        // SAFETY: the buffer is valid for `len` bytes; the caller rules out concurrent writers.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Deregisters the region (`ibv_dereg_mr`) and gives the buffer back.
    ///
    /// Once this returns, the NIC can no longer reach the memory: requests still in flight on it
    /// fail instead.
    ///
    /// # Errors
    /// [`Error::Verb`] when deregistration fails (e.g. `EBUSY` while a memory window is bound);
    /// the region is then dropped, which tries again.
    #[doc(alias = "ibv_dereg_mr")]
    pub fn into_inner(mut self) -> Result<B> {
        // SAFETY: `raw` is registered; after success it is never used again (`buf` is taken,
        // and drop skips deregistration when `buf` is `None`).
        let rc =
            self.pd.context().registry().release(self.raw.as_ptr(), || unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) });
        Error::check("ibv_dereg_mr", Some(self.pd.context().name()), rc)?;
        Ok(self.buf.take().expect("buffer present until into_inner"))
    }

    /// The first byte, for a pool carving the region into slots.
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The raw `struct ibv_mr *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_mr {
        self.raw.as_ptr()
    }

    fn range_of(&self, what: &'static str, offset: usize, len: usize) -> Result<(usize, usize)> {
        bounds(offset..offset.saturating_add(len), self.len).ok_or(Error::OutOfBounds {
            what,
            offset,
            len,
            region_len: self.len,
        })
    }
}

impl<B: RegisteredBuffer> Drop for MemoryRegion<'_, B> {
    fn drop(&mut self) {
        if self.buf.is_some() {
            // SAFETY: registered and not yet deregistered. Deregistration revokes the NIC's
            // access before `buf` (dropped after this) frees the memory.
            let rc = self
                .pd
                .context()
                .registry()
                .release(self.raw.as_ptr(), || unsafe { ffi::ibv_dereg_mr(self.raw.as_ptr()) });
            if rc != 0 {
                // The NIC may still reach the buffer: leak it rather than free memory it could write.
                std::mem::forget(self.buf.take());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_reject_ranges_outside() {
        assert_eq!(bounds(.., 10), Some((0, 10)));
        assert_eq!(bounds(2..5, 10), Some((2, 5)));
        assert_eq!(bounds(2..=9, 10), Some((2, 10)));
        assert_eq!(bounds(2..=10, 10), None);
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = 5..2;
        assert_eq!(bounds(reversed, 10), None);
        assert_eq!(bounds(0..usize::MAX, 10), None);
    }

    #[test]
    fn remote_region_slices_within() {
        let r = RemoteRegion { addr: 0x1000, rkey: 7, len: 100 };
        assert_eq!(r.slice(10, 90), Some(RemoteRegion { addr: 0x100a, rkey: 7, len: 90 }));
        assert_eq!(r.slice(10, 91), None);
        assert_eq!(r.slice(u64::MAX, 2), None);
        // A peer's address near the top of the address space: no overflow, no wrap.
        let high = RemoteRegion { addr: u64::MAX - 4, rkey: 7, len: 100 };
        assert_eq!(high.slice(10, 10), None);
    }

    #[test]
    fn remote_write_and_atomic_are_remotely_writable() {
        assert!(AccessFlags::REMOTE_WRITE.remotely_writable());
        assert!(AccessFlags::REMOTE_ATOMIC.remotely_writable());
        assert!(AccessFlags::MW_BIND.remotely_writable());
        assert!(!(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ).remotely_writable());
    }
}
