//! Buffers a [`MemoryRegion`](crate::MemoryRegion) can own: [`RegisteredBuffer`] (what any
//! such buffer promises), and [`AlignedBuffer`] (the page-aligned anonymous mapping
//! `alloc_mr` and slot pools register).
//!
//! What registers in one safe call, without an `unsafe impl` of the user's: `Vec<u8>`,
//! `Box<[u8]>`, [`AlignedBuffer`] (at any power-of-two alignment), and, with the feature
//! `memmap2`, a [`memmap2::MmapMut`](https://docs.rs/memmap2/0.9/memmap2/struct.MmapMut.html).

use std::ptr::NonNull;

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

/// A zeroed, page-aligned buffer of its own anonymous mapping: what
/// [`ProtectionDomain::alloc_mr`](crate::ProtectionDomain::alloc_mr) registers.
///
/// The kernel zero-fills its pages when they are first touched (`ibv_reg_mr` pinning them
/// does that in one pass), so no user-space pass writes zeros over a buffer about to be
/// registered and then overwritten. Measured in the Soft-RoCE VM: zeroing 16 MiB through the
/// allocator cost 0.28-0.30 s before its registration.
#[derive(Debug)]
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: it owns its mapping exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuffer {}
// SAFETY: `&AlignedBuffer` reads the bytes (`as_slice`), as `&[u8]` does, which is sound from
// any thread. While a `MemoryRegion` owns the buffer (and the NIC may write it) no
// `&AlignedBuffer` is handed out: it is reachable again only after deregistration.
unsafe impl Sync for AlignedBuffer {}

/// The alignment of [`AlignedBuffer`]: a page.
pub const PAGE_SIZE: usize = 4096;

impl AlignedBuffer {
    /// Maps `len` zeroed bytes aligned to [`PAGE_SIZE`] (at least): `mmap(MAP_PRIVATE |
    /// MAP_ANONYMOUS)`. `None` if `len` is 0, too large, or the mapping fails.
    ///
    /// # References
    /// - [`mmap(2)`](https://man7.org/linux/man-pages/man2/mmap.2.html)
    pub fn zeroed(len: usize) -> Option<Self> {
        if len == 0 || len > isize::MAX as usize - PAGE_SIZE {
            return None;
        }
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it aliases
        // no existing memory. Its pages read as zero (mmap(2)).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        Some(AlignedBuffer { ptr: NonNull::new(p.cast())?, len })
    }

    /// The bytes. Only reachable once the buffer is no longer registered.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len` initialised (zeroed) bytes, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, with its length; nothing refers to it after
        // the drop. munmap cannot fail for a whole mapping of our own.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping never moves and lives until the value is dropped.
unsafe impl RegisteredBuffer for AlignedBuffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
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
