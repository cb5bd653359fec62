//! Device tests: the memory users really have registers in one safe call, with no `unsafe
//! impl` of theirs, and a peer's RDMA WRITE lands in it: `Vec<u8>`, `Box<[u8]>`,
//! `AlignedBuffer` at any alignment, `memmap2::MmapMut` (feature `memmap2`; anonymous and
//! file-backed), `HugePageBuffer`. Each buffer is read back through its owner after
//! `into_inner`. A pool without the huge pages asked for is a typed error that says how to
//! reserve them (that test runs on the host too).

mod common;

use std::sync::Mutex;

use common::*;
use rdma_verbs::*;

/// What the peer needs to write into a region.
const LANDING: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

/// The tests that read or change the kernel's huge-page pools, one at a time.
static HUGE_POOLS: Mutex<()> = Mutex::new(());

/// Registers `buf` with `b`'s protection domain (one safe call), has `a` RDMA WRITE `data` into
/// it at `at`, from the other device, and gives the buffer back, deregistered.
fn written_into<B: RegisteredBuffer>(a: &End<'_>, b: &End<'_>, buf: B, at: usize, data: &[u8]) -> B {
    let region = b.pd.register(buf, LANDING).unwrap();
    let to = region.remote().slice(at as u64, data.len() as u64).expect("the write fits the buffer");
    a.mr.write_at(0, data).unwrap();
    a.qp.scope(T, |s| {
        let src = [a.mr.sge(..data.len())?];
        s.post_send(&mut [SendRequest::write(1, &src, to)])?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, T)?[0].ok()?;
        Ok::<_, Error>(())
    })
    .unwrap();
    region.into_inner().unwrap()
}

/// Checks that `bytes` hold `data` at `at` and zeros elsewhere.
fn landed(what: &str, bytes: &[u8], at: usize, data: &[u8]) {
    assert_eq!(&bytes[at..at + data.len()], data, "{what}: the peer's write");
    let around = bytes[..at].iter().chain(&bytes[at + data.len()..]);
    assert!(around.copied().all(|x| x == 0), "{what}: nothing written outside the write");
}

/// Runs `f` with an RC pair from the client's device to the server's: the peer (`a`) writes
/// into what the owner (`b`) registers.
fn across_the_wire(f: impl FnOnce(&End<'_>, &End<'_>)) {
    let topo = testkit::require_topology!();
    with_rc_pair(&topo, &topo.client.device, &topo.server.device, ALL, f);
}

#[test]
fn a_vec_and_a_boxed_slice_take_a_peers_write() {
    across_the_wire(|a, b| {
        let data = pattern(MR_LEN, 1);
        let v = written_into(a, b, vec![0u8; 256 << 10], 100_003, &data);
        landed("Vec<u8>", &v, 100_003, &data);
        let boxed = written_into(a, b, vec![0u8; 200_000].into_boxed_slice(), 7, &data[..5000]);
        landed("Box<[u8]>", &boxed, 7, &data[..5000]);
    });
}

#[test]
fn aligned_buffers_take_a_peers_write() {
    across_the_wire(|a, b| {
        let data = pattern(MR_LEN, 2);
        for align in [64, mr::PAGE_SIZE, 2 << 20] {
            let buf = AlignedBuffer::with_alignment(1 << 20, align).unwrap();
            let mut buf = written_into(a, b, buf, 4095, &data);
            assert_eq!(buf.as_mut_ptr() as usize % align, 0);
            landed(&format!("AlignedBuffer aligned to {align}"), buf.as_slice(), 4095, &data);
        }
    });
}

#[cfg(feature = "memmap2")]
#[test]
fn an_anonymous_and_a_file_backed_mmap_take_a_peers_write() {
    use rdma_verbs::memmap2::MmapMut;
    across_the_wire(|a, b| {
        let data = pattern(MR_LEN, 3);
        let map = written_into(a, b, MmapMut::map_anon(1 << 20).unwrap(), 12_345, &data);
        landed("MmapMut::map_anon", &map, 12_345, &data);

        // A file of this test's own, in the guest's tmpfs: the write reaches the file.
        let path = std::env::temp_dir().join(format!("device_own_memory.{}", std::process::id()));
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        // SAFETY: the file is this test's own, new, and nothing else truncates or writes it
        // while it is mapped.
        let map = unsafe { MmapMut::map_mut(&file) }.unwrap();
        let map = written_into(a, b, map, 300_000, &data);
        landed("MmapMut::map_mut", &map, 300_000, &data);
        map.flush().unwrap();
        drop(map);
        let on_disk = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        landed("the mapped file", &on_disk, 300_000, &data);
    });
}

/// A count of `size`'s huge-page pool (`free_hugepages`, `nr_hugepages`, ...); `None` when the
/// kernel has no such pool.
fn pool(size: HugePageSize, what: &str) -> Option<usize> {
    let text = std::fs::read_to_string(format!("{}/{what}", size.sysfs_dir())).ok()?;
    Some(text.trim().parse().expect("a count"))
}

/// Asks for one huge page more than the pool of `size` could give (free, and the surplus it may
/// still allocate) and checks the typed error: what a kernel with none reserved, the default,
/// always answers.
fn more_than_the_pool_holds_is_refused(size: HugePageSize) {
    let Some(free) = pool(size, "free_hugepages") else {
        // No pool of this size at all: mmap refuses the size.
        let e = HugePageBuffer::with_page_size(size.bytes(), size).unwrap_err();
        assert!(matches!(e, Error::HugePages { errno: libc::EINVAL, .. }), "{size}: {e:?}");
        return;
    };
    let overcommit = pool(size, "nr_overcommit_hugepages").unwrap_or(0);
    let pages = free.saturating_add(overcommit).saturating_add(1);
    let len = pages.saturating_mul(size.bytes());
    match HugePageBuffer::with_page_size(len, size) {
        Err(e @ Error::HugePages { errno: libc::ENOMEM, .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("fewer than {pages} huge page(s) of {size} are free")), "{text}");
            assert!(text.contains(&format!("echo N > {}/nr_hugepages", size.sysfs_dir())), "{text}");
            assert!(text.contains("hugeadm --pool-pages-min"), "{text}");
        }
        other => panic!("{pages} pages of {size}, {free} free: {other:?}"),
    }
}

#[test]
fn more_huge_pages_than_the_pool_holds_are_a_typed_error() {
    let _pools = HUGE_POOLS.lock().unwrap_or_else(|e| e.into_inner());
    more_than_the_pool_holds_is_refused(HugePageSize::Size2MiB);
    more_than_the_pool_holds_is_refused(HugePageSize::Size1GiB);
}

/// Huge pages of a pool reserved for a test, and the pool's size given back on drop.
struct Reserved {
    size: HugePageSize,
    /// `nr_hugepages` before, when the test raised it.
    was: Option<usize>,
}

impl Reserved {
    /// At least `pages` free pages of `size`: those already free, or raises the pool (root).
    fn at_least(pages: usize, size: HugePageSize) -> Reserved {
        let free = pool(size, "free_hugepages").unwrap_or_else(|| panic!("the kernel has no {size} huge pages"));
        if free >= pages {
            return Reserved { size, was: None };
        }
        let nr = pool(size, "nr_hugepages").unwrap();
        let path = format!("{}/nr_hugepages", size.sysfs_dir());
        std::fs::write(&path, (nr + pages - free).to_string())
            .unwrap_or_else(|e| panic!("reserving {pages} huge pages of {size} in {path}: {e} (run as root)"));
        let reserved = Reserved { size, was: Some(nr) };
        let now = pool(size, "free_hugepages").unwrap();
        assert!(now >= pages, "the kernel reserved {now} free huge pages of {size}, not {pages}");
        reserved
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(nr) = self.was {
            let path = format!("{}/nr_hugepages", self.size.sysfs_dir());
            if let Err(e) = std::fs::write(&path, nr.to_string()) {
                eprintln!("restoring {path} to {nr}: {e}");
            }
        }
    }
}

#[test]
fn huge_pages_take_a_peers_write_once_reserved() {
    across_the_wire(|a, b| {
        let _pools = HUGE_POOLS.lock().unwrap_or_else(|e| e.into_inner());
        let size = HugePageSize::Size2MiB;
        // Before: none to spare (the guest reserves none).
        more_than_the_pool_holds_is_refused(size);
        {
            let _reserved = Reserved::at_least(2, size);
            let free = pool(size, "free_hugepages").unwrap();
            // Two pages, the second partly: the write crosses from the first into it.
            let mut buf = HugePageBuffer::new((4 << 20) - 4096).unwrap();
            assert_eq!((buf.page_size(), buf.as_mut_ptr() as usize % size.bytes()), (size, 0));
            let data = pattern(MR_LEN, 4);
            let at = (2 << 20) - 1000;
            let buf = written_into(a, b, buf, at, &data);
            landed("HugePageBuffer", buf.as_slice(), at, &data);
            // The registration faulted the buffer's pages in: two pages of the pool are in use.
            assert_eq!(pool(size, "free_hugepages"), Some(free - 2), "the buffer's pages came from the pool");
            drop(buf);
            assert_eq!(pool(size, "free_hugepages"), Some(free), "unmapped: its pages are back");
        }
        // After: the pool is as it was, and refuses again.
        more_than_the_pool_holds_is_refused(size);
    });
}
