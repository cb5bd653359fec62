//! Registered buffers that travel to the NIC and back: [`SlotPool`] and [`Slot`].
//!
//! A pool is one memory region carved into equal slots. [`SlotPool::try_take`] hands a slot out
//! to the application, which then has it alone: a plain `&mut [u8]` for a pool no peer can
//! write. Posting a request through a [`SendQueue`](crate::SendQueue) or
//! [`RecvRing`](crate::RecvRing) *moves* the slot into the request, so no Rust code can touch it
//! while the NIC may; the request's completion gives it back. Dropping a slot returns it to the
//! pool.
//!
//! ```text
//!            try_take                      push/submit                  poll (completion)
//! SlotPool ───────────▶ Slot (app: &mut [u8]) ───────────▶ SendQueue ───────────────────▶ Slot
//!     ▲                   │ drop                                                          │
//!     └───────────────────┴───────────────────────────────────────────────────────────────┘
//! ```
//!
//! # Why forgetting is sound
//! A slot holds a reference count on the pool's memory, and the pool's bit for the slot stays
//! "taken" until the slot value is dropped. Forgetting a slot (or anything that holds posted
//! slots: a `SendQueue`, a `RecvRing`) therefore leaks the slot and the pool's memory; it
//! never frees memory the device may still reach, and never hands the slot out again.
//!
//! # File I/O without a copy
//! [`Slot::read_file`] and [`Slot::write_file`] call `pread(2)` and `pwrite(2)` on the slot's
//! own registered bytes: the kernel copies between the page cache and the slot, and no Rust
//! reference to the bytes is made (so this works on a remotely writable pool too, whose bytes a
//! peer may change at any moment).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mr::{AccessFlags, AlignedBuffer, MemoryRegion, RemoteRegion};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;

/// A registered memory region carved into `count` slots of `slot_size` bytes.
///
/// Cheap to clone (a reference count); slots taken from it keep its memory alive. `Send` and
/// `Sync`: threads may take slots from one pool. Taking and returning a slot is lock-free and
/// allocates nothing.
#[derive(Clone)]
#[must_use = "dropping it at once releases what was just made"]
pub struct SlotPool<'pd> {
    shared: Arc<PoolShared<'pd>>,
}

pub(crate) struct PoolShared<'pd> {
    mr: MemoryRegion<'pd, AlignedBuffer>,
    base: *mut u8,
    slot_size: usize,
    count: u32,
    free: FreeSet,
}

// SAFETY: the bytes are reached only through `Slot`s, each the only handle to its slot's bytes
// (the `free` bitmap hands a slot to one owner at a time); the region itself is only asked for
// its keys and address, which are plain data.
unsafe impl Send for PoolShared<'_> {}
// SAFETY: as above; the bitmap is atomic.
unsafe impl Sync for PoolShared<'_> {}

impl fmt::Debug for SlotPool<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPool")
            .field("region", &self.shared.mr)
            .field("slot_size", &self.shared.slot_size)
            .field("count", &self.shared.count)
            .field("available", &self.available())
            .finish()
    }
}

impl<'pd> SlotPool<'pd> {
    /// Allocates and registers `count * slot_size` zeroed, page-aligned bytes with `pd`
    /// (borrowed or shared, see [`Parent`]) and carves them into `count` slots: one
    /// `ibv_reg_mr()`.
    ///
    /// Slots of a multiple of 4096 bytes are page-aligned, as `O_DIRECT` file I/O wants.
    /// `access` must hold `LOCAL_WRITE` for slots that receive or are READ into; with
    /// `REMOTE_WRITE` peers may write the slots, which are then never handed out as slices.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero `slot_size` or `count`, slots over 4 GiB, or a
    /// total over the device's limit; what [`MemoryRegion::alloc`] returns.
    #[doc(alias = "ibv_reg_mr")]
    pub fn new(
        pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>,
        slot_size: usize,
        count: usize,
        access: AccessFlags,
    ) -> Result<Self> {
        let pd = pd.into();
        let bad = |reason: String| Err(Error::invalid("ibv_reg_mr", Some(pd.context().name()), reason));
        let Ok(count) = u32::try_from(count) else {
            return bad(format!("{count} slots: a pool holds at most {}", u32::MAX));
        };
        if slot_size == 0 || count == 0 {
            return bad(format!("a pool of {count} slots of {slot_size} bytes is empty"));
        }
        if u32::try_from(slot_size).is_err() {
            return bad(format!("slots of {slot_size} bytes: one request carries at most 4 GiB - 1"));
        }
        let Some(total) = slot_size.checked_mul(count as usize) else {
            return bad(format!("{count} slots of {slot_size} bytes overflow the address space"));
        };
        let Some(free) = FreeSet::full(count) else {
            return bad(format!("cannot allocate the free list of {count} slots"));
        };
        let mr = MemoryRegion::alloc(pd, total, access)?;
        let base = mr.base_ptr();
        Ok(SlotPool { shared: Arc::new(PoolShared { mr, base, slot_size, count, free }) })
    }

    /// Takes a free slot, or `None` when every slot is out (with the application or the NIC).
    /// Lock-free; allocates nothing.
    #[inline]
    pub fn try_take(&self) -> Option<Slot<'pd>> {
        let index = self.shared.free.take()?;
        Some(Slot { pool: Arc::clone(&self.shared), index })
    }

    /// How many slots are in the pool right now.
    pub fn available(&self) -> usize {
        self.shared.free.len()
    }

    /// The size of each slot in bytes.
    pub fn slot_size(&self) -> usize {
        self.shared.slot_size
    }

    /// The number of slots.
    pub fn capacity(&self) -> usize {
        self.shared.count as usize
    }

    /// [`capacity`](Self::capacity) as the slots' indices count it.
    pub(crate) fn count(&self) -> u32 {
        self.shared.count
    }

    /// The access the pool's region was registered with.
    pub fn access(&self) -> AccessFlags {
        self.shared.mr.access()
    }

    /// The whole region as a peer names it (address, rkey, length).
    pub fn remote(&self) -> RemoteRegion {
        self.shared.mr.remote()
    }

    /// The protection domain the pool is registered with.
    pub fn pd(&self) -> &ProtectionDomain<'pd> {
        self.shared.mr.pd()
    }

    /// Whether `self` and `other` are handles to the same pool.
    pub fn same_pool(&self, other: &SlotPool<'_>) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.shared).cast::<u8>(), Arc::as_ptr(&other.shared).cast::<u8>())
    }
}

/// One slot of a [`SlotPool`], owned by whoever holds this value: the application, or a
/// request in flight. Dropping it returns it to the pool.
///
/// While the application holds it, nothing else can reach its bytes: no request (posting moves
/// the slot into the request) and, for a pool without `REMOTE_WRITE`/`REMOTE_ATOMIC`, no peer.
/// So [`as_mut_slice`](Self::as_mut_slice) gives a plain slice. A slot of a remotely writable
/// pool is only copied from ([`read_at`](Self::read_at), [`write_file`](Self::write_file)).
pub struct Slot<'pd> {
    pool: Arc<PoolShared<'pd>>,
    index: u32,
}

impl fmt::Debug for Slot<'_> {
    /// The slot's place, never its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("index", &self.index)
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl Drop for Slot<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pool.free.give_back(self.index);
    }
}

impl<'pd> Slot<'pd> {
    /// The slot's number in its pool, `0..count`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The slot's size in bytes (the pool's slot size).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.pool.slot_size
    }

    /// The virtual address of the slot's first byte.
    pub fn addr(&self) -> u64 {
        self.ptr() as u64
    }

    /// The local key of the pool's region.
    pub fn lkey(&self) -> u32 {
        self.pool.mr.lkey()
    }

    /// The slot as a peer names it: address, the region's rkey, the slot's length. Meaningful
    /// for a pool registered with remote access.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { addr: self.addr(), rkey: self.pool.mr.rkey(), len: self.len() as u64 }
    }

    /// Whether a peer may write the slot's bytes (the pool has `REMOTE_WRITE` or `REMOTE_ATOMIC`).
    pub fn remotely_writable(&self) -> bool {
        self.pool.mr.access().remotely_writable()
    }

    /// Whether the slot belongs to `pool`.
    pub fn is_from(&self, pool: &SlotPool<'_>) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.pool).cast::<u8>(), Arc::as_ptr(&pool.shared).cast::<u8>())
    }

    pub(crate) fn access(&self) -> AccessFlags {
        self.pool.mr.access()
    }

    pub(crate) fn pd_raw(&self) -> *mut crate::ffi::ibv_pd {
        self.pool.mr.pd().as_raw()
    }

    #[inline]
    fn ptr(&self) -> *mut u8 {
        // In bounds: index < count, and the region is count * slot_size bytes.
        self.pool.base.wrapping_add(self.index as usize * self.pool.slot_size)
    }

    /// The slot's bytes, for a pool no peer can write.
    ///
    /// # Errors
    /// [`Error::RemotelyWritable`] for a slot of a remotely writable pool.
    pub fn as_slice(&self) -> Result<&[u8]> {
        self.check_private("Slot::as_slice")?;
        // SAFETY: the slot's bytes lie inside the pool's live region; holding the `Slot` means
        // no request is using them (posting moves the slot) and no peer can write them
        // (checked above); `&self` rules out a `&mut` made through this slot meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr(), self.len()) })
    }

    /// The slot's bytes, mutably, for a pool no peer can write.
    ///
    /// # Errors
    /// [`Error::RemotelyWritable`] for a slot of a remotely writable pool.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        self.check_private("Slot::as_mut_slice")?;
        // SAFETY: as in `as_slice`, and `&mut self` is exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len()) })
    }

    fn check_private(&self, what: &'static str) -> Result<()> {
        if self.remotely_writable() {
            return Err(Error::RemotelyWritable { what });
        }
        Ok(())
    }

    fn range(&self, what: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(Error::OutOfBounds { what, offset, len, region_len: self.len() }),
        }
    }

    /// Copies `dst.len()` bytes from `offset` of the slot into `dst`. Sound on any pool: the
    /// bytes are read through raw pointers.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] outside the slot.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range("Slot::read_at", offset, dst.len())?;
        // SAFETY: in bounds (checked); `dst` is a distinct allocation; a peer's concurrent DMA is
        // not a Rust access, so at worst the bytes are mixed, never UB.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `src` into the slot at `offset`. Sound on any pool, as [`read_at`](Self::read_at).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] outside the slot.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.range("Slot::write_at", offset, src.len())?;
        // SAFETY: as in `read_at`; `&mut self` means no slice of this slot is alive.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Reads up to `len` bytes of `file` from `file_offset` into the start of the slot with
    /// `pread(2)` (repeated until `len` bytes or end of file): the kernel writes the registered
    /// bytes directly, with no intermediate buffer. Returns how many bytes were read (less than
    /// `len` only at end of file).
    ///
    /// # Errors
    /// `InvalidInput` when `len` exceeds the slot; the `pread` error otherwise (`EINTR` is
    /// retried).
    ///
    /// # References
    /// - [`pread(2)`](https://man7.org/linux/man-pages/man2/pread.2.html)
    #[doc(alias = "pread")]
    pub fn read_file(&mut self, file: &impl AsFd, file_offset: u64, len: usize) -> io::Result<usize> {
        let ptr = self.ptr();
        // SAFETY: `ptr` .. `ptr + len` lies inside the slot (checked by `positional_io`);
        // `&mut self` means no Rust reference to it is alive, and the slot is not posted
        // (posting moves it), so the kernel is the only writer.
        self.positional_io(file, file_offset, len, |fd, done, left, off| unsafe {
            libc::pread(fd, ptr.add(done).cast(), left, off)
        })
    }

    /// Writes the first `len` bytes of the slot to `file` at `file_offset` with `pwrite(2)`
    /// (repeated until all are written): the kernel reads the registered bytes directly. Sound
    /// on a remotely writable pool: no Rust reference to the bytes is made.
    ///
    /// # Errors
    /// `InvalidInput` when `len` exceeds the slot; `WriteZero` when the file takes no more;
    /// the `pwrite` error otherwise (`EINTR` is retried).
    ///
    /// # References
    /// - [`pwrite(2)`](https://man7.org/linux/man-pages/man2/pwrite.2.html)
    #[doc(alias = "pwrite")]
    pub fn write_file(&self, file: &impl AsFd, file_offset: u64, len: usize) -> io::Result<()> {
        let ptr = self.ptr();
        // SAFETY: `ptr` .. `ptr + len` lies inside the slot's live region (checked by
        // `positional_io`); the kernel only reads it.
        let done = self.positional_io(file, file_offset, len, |fd, done, left, off| unsafe {
            libc::pwrite(fd, ptr.add(done).cast(), left, off)
        })?;
        if done < len {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "pwrite wrote nothing"));
        }
        Ok(())
    }

    /// Calls `call(fd, done, left, file_offset + done)` until `len` bytes are done or it returns
    /// 0, retrying `EINTR`; returns the bytes done. `len` is checked against the slot first.
    fn positional_io(
        &self,
        file: &impl AsFd,
        file_offset: u64,
        len: usize,
        mut call: impl FnMut(libc::c_int, usize, usize, libc::off_t) -> isize,
    ) -> io::Result<usize> {
        if len > self.len() {
            let reason = format!("{len} bytes do not fit a slot of {}", self.len());
            return Err(io::Error::new(io::ErrorKind::InvalidInput, reason));
        }
        let fd = file.as_fd().as_raw_fd();
        let mut done = 0usize;
        while done < len {
            match call(fd, done, len - done, offset_of(file_offset, done)?) {
                0 => break,
                n @ 1.. => done += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(done)
    }
}

fn offset_of(base: u64, done: usize) -> io::Result<libc::off_t> {
    base.checked_add(done as u64)
        .and_then(|o| libc::off_t::try_from(o).ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "file offset past the largest off_t"))
}

/// A lock-free set of free slot numbers: one bit per slot, set while the slot is free.
pub(crate) struct FreeSet {
    words: Box<[AtomicU64]>,
}

impl FreeSet {
    /// Every slot free; `None` if the bitmap cannot be allocated.
    fn full(count: u32) -> Option<Self> {
        let n = (count as usize).div_ceil(64);
        let mut words = Vec::new();
        words.try_reserve_exact(n).ok()?;
        words.extend((0..n).map(|w| {
            let in_word = (count as usize - w * 64).min(64);
            AtomicU64::new(if in_word == 64 { u64::MAX } else { (1u64 << in_word) - 1 })
        }));
        Some(FreeSet { words: words.into_boxed_slice() })
    }

    #[inline]
    fn take(&self) -> Option<u32> {
        for (w, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let bit = bits.trailing_zeros();
                match word.compare_exchange_weak(bits, bits & !(1 << bit), Ordering::Acquire, Ordering::Relaxed) {
                    Ok(_) => return Some(w as u32 * 64 + bit),
                    Err(now) => bits = now,
                }
            }
        }
        None
    }

    #[inline]
    fn give_back(&self, index: u32) {
        let word = &self.words[index as usize / 64];
        let was = word.fetch_or(1 << (index % 64), Ordering::Release);
        debug_assert_eq!(was & (1 << (index % 64)), 0, "slot {index} returned twice");
    }

    fn len(&self) -> usize {
        self.words.iter().map(|w| w.load(Ordering::Relaxed).count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_handed_out_once_until_given_back() {
        for count in [1u32, 63, 64, 65, 200] {
            let set = FreeSet::full(count).unwrap();
            assert_eq!(set.len(), count as usize);
            let mut got: Vec<u32> = std::iter::from_fn(|| set.take()).collect();
            got.sort_unstable();
            assert_eq!(got, (0..count).collect::<Vec<_>>(), "count {count}");
            assert_eq!(set.take(), None);
            set.give_back(count / 2);
            assert_eq!(set.take(), Some(count / 2));
            assert_eq!(set.len(), 0);
        }
    }

    #[test]
    fn threads_never_get_the_same_slot() {
        let set = Arc::new(FreeSet::full(128).unwrap());
        let seen: Vec<Vec<u32>> = (0..4)
            .map(|_| {
                let set = set.clone();
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    for _ in 0..10_000 {
                        if let Some(i) = set.take() {
                            mine.push(i);
                            if mine.len() > 8 {
                                set.give_back(mine.remove(0));
                            }
                        }
                    }
                    mine
                })
            })
            .map(|t| t.join().unwrap())
            .collect();
        let mut held: Vec<u32> = seen.into_iter().flatten().collect();
        let n = held.len();
        held.sort_unstable();
        held.dedup();
        assert_eq!(held.len(), n, "two threads held the same slot");
        assert_eq!(set.len() + n, 128);
    }
}
