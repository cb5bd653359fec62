//! Buffers a [`MemoryRegion`](crate::MemoryRegion) can own: [`RegisteredBuffer`] (what any
//! such buffer promises), and [`AlignedBuffer`] (the page-aligned anonymous mapping
//! `alloc_mr` and slot pools register).
//!
//! What registers in one safe call, without an `unsafe impl` of the user's: `Vec<u8>`,
//! `Box<[u8]>`, [`AlignedBuffer`] (at any power-of-two alignment), and, with the feature
//! `memmap2`, a [`memmap2::MmapMut`](https://docs.rs/memmap2/0.9/memmap2/struct.MmapMut.html).

use std::ptr::NonNull;

use crate::error::{Error, Result};

/// A buffer a [`MemoryRegion`](crate::MemoryRegion) can own.
///
/// # Safety
/// `as_mut_ptr()` must return the same pointer, valid for reads and writes of `len()` bytes,
/// from the moment the buffer is registered until it is given back by `into_inner()` or
/// dropped, however the buffer value itself is moved.
pub unsafe trait RegisteredBuffer {
    /// The start of the bytes.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// How many bytes there are.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec value moves, and is not reallocated
// because the region never grows or shrinks it.
unsafe impl RegisteredBuffer for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap buffer does not move when the box moves.
unsafe impl RegisteredBuffer for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: an `MmapMut` owns its mapping, which stays at one address until the value is dropped
// (munmap), however the value moves; the region owns the value, so no `remap`, `flush` or
// `make_read_only` can run while it is registered. memmap2 hands the mapping out as `&mut [u8]`
// through safe `DerefMut`, so it already holds the bytes valid for reads and writes for the
// mapping's life: an anonymous map (`map_anon`, safe) always; a file map because its
// constructors are `unsafe`, and their caller promised that the file is not truncated or changed
// underneath it (docs/safety.md, "Your own memory"). Registering one relies on nothing more.
#[cfg(feature = "memmap2")]
unsafe impl RegisteredBuffer for memmap2::MmapMut {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A zeroed, aligned buffer of its own anonymous mapping: what
/// [`ProtectionDomain::alloc_mr`](crate::ProtectionDomain::alloc_mr) registers (page-aligned,
/// [`zeroed`](Self::zeroed)), or aligned to any power of two ([`with_alignment`](Self::with_alignment)).
///
/// The kernel zero-fills its pages when they are first touched (`ibv_reg_mr` pinning them
/// does that in one pass), so no user-space pass writes zeros over a buffer about to be
/// registered and then overwritten. Measured in the Soft-RoCE VM: zeroing 16 MiB through the
/// allocator cost 0.28-0.30 s before its registration.
#[derive(Debug)]
pub struct AlignedBuffer {
    /// The first byte of the buffer, inside the mapping.
    ptr: NonNull<u8>,
    len: usize,
    /// The whole mapping, unmapped on drop: larger than the buffer when an alignment over a
    /// page was asked for.
    _map: Mapping,
}

// SAFETY: it owns its mapping exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: `&AlignedBuffer` reads the bytes (`as_slice`), as `&[u8]` does, which is sound from
// any thread. While a `MemoryRegion` owns the buffer (and the NIC may write it) no
// `&AlignedBuffer` is handed out: it is reachable again only after deregistration.
unsafe impl Sync for AlignedBuffer {}

/// The alignment of [`AlignedBuffer::zeroed`]: a page.
pub const PAGE_SIZE: usize = 4096;

impl AlignedBuffer {
    /// Maps `len` zeroed bytes aligned to [`PAGE_SIZE`] (at least): `mmap(MAP_PRIVATE |
    /// MAP_ANONYMOUS)`. `None` if `len` is 0, too large, or the mapping fails.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    #[doc(alias = "mmap")]
    pub fn zeroed(len: usize) -> Option<Self> {
        Self::with_alignment(len, PAGE_SIZE)
    }

    /// Maps `len` zeroed bytes whose first byte is aligned to `align`, a power of two: a page
    /// or less comes with any mapping; a larger alignment (say 2 MiB, so that transparent huge
    /// pages can back the buffer) maps `align - PAGE_SIZE` bytes more and starts the buffer at
    /// the first aligned address in it, then unmaps the pages before and after the buffer's.
    /// `None` if `len` is 0, `align` is not
    /// a power of two, the sizes are too large, or the mapping fails.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    #[doc(alias = "mmap")]
    #[doc(alias = "posix_memalign")]
    pub fn with_alignment(len: usize, align: usize) -> Option<Self> {
        if len == 0 || !align.is_power_of_two() {
            return None;
        }
        let map_len = len.checked_add(align.saturating_sub(PAGE_SIZE))?;
        let map = Mapping::anonymous(map_len, 0).ok()?;
        let base = map.ptr.as_ptr();
        // A mapping starts on a page, so the first multiple of `align` at or after it is at
        // most `align - PAGE_SIZE` bytes in, and `len` bytes from there are inside it.
        let offset = (base as usize).wrapping_neg() & (align - 1);
        debug_assert!(offset + len <= map_len);
        // The padding before and after the buffer's pages goes back to the kernel: it would
        // count against a strict overcommit limit (`vm.overcommit_memory=2`) for nothing.
        let map = map.keep(offset, len);
        Some(AlignedBuffer { ptr: map.ptr, len, _map: map })
    }

    /// The bytes. Only reachable once the buffer is no longer registered.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes of the mapping `self` owns.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the mapping never moves and lives until the value is dropped; `ptr..ptr + len` is
// inside it.
unsafe impl RegisteredBuffer for AlignedBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A private anonymous mapping of our own, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    /// The length given to mmap, which munmap is given back.
    len: usize,
}

impl Mapping {
    /// `mmap(MAP_PRIVATE | MAP_ANONYMOUS | flags)` of `len` zeroed, readable and writable bytes;
    /// the `errno` when it fails.
    fn anonymous(len: usize, flags: libc::c_int) -> std::result::Result<Self, i32> {
        if len > isize::MAX as usize {
            return Err(libc::ENOMEM);
        }
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
        // no existing memory. Its pages read as zero (mmap(2)).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENOMEM));
        }
        let ptr = NonNull::new(p.cast()).ok_or(libc::ENOMEM)?;
        Ok(Mapping { ptr, len })
    }
}

impl Mapping {
    /// The whole pages holding `len` bytes from `offset` (a multiple of the page size), the rest
    /// of the mapping unmapped.
    fn keep(self, offset: usize, len: usize) -> Mapping {
        let pages = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let (start, end) = (offset, (offset + pages).min(self.len));
        let this = std::mem::ManuallyDrop::new(self);
        let base = this.ptr.as_ptr();
        // SAFETY: `[0, start)` and `[end, len)` are page-aligned ranges inside the mapping this
        // value owns (`offset` is a multiple of the page size, as is `end` unless it is the
        // mapping's end), and nothing refers to them: the buffer is `[start, start + len)`.
        unsafe {
            if start > 0 {
                libc::munmap(base.cast(), start);
            }
            if end < this.len {
                libc::munmap(base.add(end).cast(), this.len - end);
            }
        }
        // SAFETY: `start < end <= len`: inside the mapping, so not null.
        let ptr = unsafe { NonNull::new_unchecked(base.add(start)) };
        Mapping { ptr, len: end - start }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `anonymous`, with its length; nothing refers to it after
        // the drop (its owner is being dropped). munmap cannot fail for a whole mapping of our
        // own (a huge-page mapping's length is a multiple of its page size).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The size of the pages of a [`HugePageBuffer`]: the two sizes of x86-64 (`MAP_HUGE_2MB`,
/// `MAP_HUGE_1GB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HugePageSize {
    /// 2 MiB pages: the kernel's default huge-page size on x86-64.
    #[default]
    Size2MiB,
    /// 1 GiB pages: reserved at boot as a rule (`hugepagesz=1G hugepages=N`), as memory that
    /// large is rarely free later.
    Size1GiB,
}

impl HugePageSize {
    /// The page size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            HugePageSize::Size2MiB => 2 << 20,
            HugePageSize::Size1GiB => 1 << 30,
        }
    }

    /// The kernel's directory of this size's pool, e.g.
    /// `/sys/kernel/mm/hugepages/hugepages-2048kB` (its `nr_hugepages` reserves pages, its
    /// `free_hugepages` counts those free).
    pub fn sysfs_dir(self) -> String {
        format!("/sys/kernel/mm/hugepages/hugepages-{}kB", self.bytes() >> 10)
    }

    /// The size as `hugeadm` names it (`2MB`, `1GB`).
    pub(crate) fn hugeadm_name(self) -> &'static str {
        match self {
            HugePageSize::Size2MiB => "2MB",
            HugePageSize::Size1GiB => "1GB",
        }
    }

    /// `MAP_HUGETLB` with the page size encoded (`MAP_HUGE_2MB`, `MAP_HUGE_1GB`).
    fn map_flags(self) -> libc::c_int {
        libc::MAP_HUGETLB | ((self.bytes().trailing_zeros() as libc::c_int) << libc::MAP_HUGE_SHIFT)
    }
}

impl std::fmt::Display for HugePageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HugePageSize::Size2MiB => f.write_str("2 MiB"),
            HugePageSize::Size1GiB => f.write_str("1 GiB"),
        }
    }
}

/// A zeroed buffer in huge pages: an anonymous `mmap(MAP_HUGETLB)` of pages from the kernel's
/// reserved pool, unmapped on drop.
///
/// A region over huge pages takes one translation entry per 2 MiB (or 1 GiB) on the NIC and the
/// CPU instead of one per 4 KiB. The pages come from the pool reserved beforehand
/// (`/proc/sys/vm/nr_hugepages`, or per size under `/sys/kernel/mm/hugepages/`, or
/// `hugeadm --pool-pages-min 2MB:N`); the mapping reserves them at once, so a pool too small
/// is an [`Error::HugePages`](crate::Error::HugePages) from [`new`](Self::new), not a fault
/// later. A cgroup's hugetlb limit or a NUMA binding is not seen by the reservation: past it,
/// the first touch of a page is a `SIGBUS` (docs/safety.md, "Your own memory"). The mapping is the length rounded up to whole pages; the buffer is the `len` bytes
/// asked for, at its start.
///
/// ```no_run
/// use rdma_verbs::*;
/// # fn main() -> rdma_verbs::Result<()> {
/// let ctx = Context::open("rxe0")?;
/// let pd = ctx.alloc_pd()?;
/// let mr = pd.register(HugePageBuffer::new(4 << 20)?, AccessFlags::LOCAL_WRITE)?;
/// # Ok(()) }
/// ```
///
/// # References
/// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html), `MAP_HUGETLB`
/// - [HugeTLB Pages](https://docs.kernel.org/admin-guide/mm/hugetlbpage.html)
#[derive(Debug)]
pub struct HugePageBuffer {
    map: Mapping,
    len: usize,
    page_size: HugePageSize,
}

// SAFETY: it owns its mapping exclusively, like a Box<[u8]>.
unsafe impl Send for HugePageBuffer {}
// SAFETY: as for `AlignedBuffer`: `&HugePageBuffer` only reads the bytes, and no
// `&HugePageBuffer` is reachable while a `MemoryRegion` owns it.
unsafe impl Sync for HugePageBuffer {}

impl HugePageBuffer {
    /// Maps `len` zeroed bytes in 2 MiB huge pages: `mmap(MAP_PRIVATE | MAP_ANONYMOUS |
    /// MAP_HUGETLB | MAP_HUGE_2MB)`.
    ///
    /// # Errors
    /// [`Error::HugePages`](crate::Error::HugePages): `ENOMEM` when the pool has fewer free
    /// pages than the buffer needs (none are reserved, as on a default install; the message
    /// says how to reserve them), `EINVAL` for an empty buffer, or the `errno` of another
    /// refusal.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    #[doc(alias = "mmap")]
    #[doc(alias = "MAP_HUGETLB")]
    pub fn new(len: usize) -> Result<Self> {
        Self::with_page_size(len, HugePageSize::default())
    }

    /// Maps `len` zeroed bytes in huge pages of `page_size`.
    ///
    /// # Errors
    /// As [`new`](Self::new); `EINVAL` also when the kernel has no pool of that size (no
    /// [`sysfs_dir`](HugePageSize::sysfs_dir)).
    #[doc(alias = "mmap")]
    pub fn with_page_size(len: usize, page_size: HugePageSize) -> Result<Self> {
        let refused = |errno| Error::HugePages { len, page_size, errno };
        if len == 0 {
            return Err(refused(libc::EINVAL));
        }
        let pages = len.div_ceil(page_size.bytes());
        let mapped = pages.checked_mul(page_size.bytes()).ok_or(refused(libc::ENOMEM))?;
        let map = Mapping::anonymous(mapped, page_size.map_flags()).map_err(refused)?;
        Ok(HugePageBuffer { map, len, page_size })
    }

    /// The size of its pages.
    pub fn page_size(&self) -> HugePageSize {
        self.page_size
    }

    /// The bytes. Only reachable once the buffer is no longer registered.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is valid for at least `len` initialised (zeroed) bytes, owned by
        // `self`.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: the mapping never moves and lives until the value is dropped; it holds at least
// `len` bytes. Its pages were reserved by the mmap itself (no MAP_NORESERVE), so touching them,
// by the CPU or by `ibv_reg_mr`'s pinning, cannot fail for want of a page.
unsafe impl RegisteredBuffer for HugePageBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_is_page_aligned_and_zeroed() {
        let mut b = AlignedBuffer::zeroed(10_000).unwrap();
        assert_eq!(b.as_mut_ptr() as usize % PAGE_SIZE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(b.as_slice().len(), 10_000);
        b.as_mut_slice()[9_999] = 1;
        assert_eq!(b.as_slice()[9_999], 1);
        assert!(AlignedBuffer::zeroed(0).is_none());
        // More than an address space holds: refused, not a panic.
        assert!(AlignedBuffer::zeroed(usize::MAX).is_none());
        assert!(AlignedBuffer::zeroed(1 << 62).is_none());
    }

    #[test]
    fn aligned_buffer_takes_any_power_of_two() {
        for align in [1, 64, PAGE_SIZE, 64 << 10, 2 << 20] {
            let mut b = AlignedBuffer::with_alignment(5_000, align).unwrap();
            let at = b.as_mut_ptr() as usize;
            assert_eq!(at % align, 0, "{align}");
            assert_eq!(at % PAGE_SIZE, 0, "{align}: a page at least");
            assert_eq!(b.len(), 5_000);
            assert!(b.as_slice().iter().all(|&x| x == 0), "{align}");
            b.as_mut_slice()[4_999] = 9;
            assert_eq!(b.as_slice()[4_999], 9);
        }
        assert!(AlignedBuffer::with_alignment(4096, 3 << 20).is_none(), "not a power of two");
        assert!(AlignedBuffer::with_alignment(4096, 0).is_none());
        assert!(AlignedBuffer::with_alignment(0, 64).is_none());
        assert!(AlignedBuffer::with_alignment(usize::MAX - 100, 1 << 20).is_none(), "no overflow");
        assert!(AlignedBuffer::with_alignment(1 << 20, 1 << 62).is_none(), "more than a mapping can hold");
    }

    #[test]
    fn an_empty_huge_page_buffer_is_refused_before_mmap() {
        match HugePageBuffer::new(0) {
            Err(e @ Error::HugePages { len: 0, errno: libc::EINVAL, .. }) => {
                assert_eq!(e.to_string(), "mmap(MAP_HUGETLB) of 0 bytes in 2 MiB pages: a buffer cannot be empty");
            }
            other => panic!("{other:?}"),
        }
        // Beyond any address space: refused, not a panic or an overflow.
        let e = HugePageBuffer::with_page_size(usize::MAX, HugePageSize::Size1GiB).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENOMEM), "{e}");
    }

    #[test]
    fn huge_page_sizes_name_their_pools() {
        assert_eq!(HugePageSize::default().bytes(), 2 << 20);
        assert_eq!(HugePageSize::Size2MiB.sysfs_dir(), "/sys/kernel/mm/hugepages/hugepages-2048kB");
        assert_eq!(HugePageSize::Size1GiB.sysfs_dir(), "/sys/kernel/mm/hugepages/hugepages-1048576kB");
        // The kernel's encoding of the size in the flags (MAP_HUGE_2MB, MAP_HUGE_1GB).
        assert_eq!(HugePageSize::Size2MiB.map_flags(), libc::MAP_HUGETLB | (21 << 26));
        assert_eq!(HugePageSize::Size1GiB.map_flags(), libc::MAP_HUGETLB | (30 << 26));
    }

    #[cfg(feature = "memmap2")]
    #[test]
    fn an_anonymous_mmap_keeps_its_bytes_where_they_were_when_moved() {
        let mut map = memmap2::MmapMut::map_anon(3 * PAGE_SIZE).unwrap();
        let at = RegisteredBuffer::as_mut_ptr(&mut map);
        map[PAGE_SIZE] = 7;
        let mut moved = Box::new(map);
        assert_eq!(RegisteredBuffer::as_mut_ptr(&mut *moved), at);
        assert_eq!(RegisteredBuffer::len(&*moved), 3 * PAGE_SIZE);
        // SAFETY: `at` is the mapping's first byte, valid while `moved` lives.
        assert_eq!(unsafe { at.add(PAGE_SIZE).read() }, 7);
    }
}
