//! Fixtures for the workspace's device tests (not published).
//!
//! Device tests need RDMA devices. [`topology`] describes the ones they use and decides what a
//! test does when they are missing:
//! - inside the harness (`scripts/test`, `scripts/softroce run`), `RDMA_TEST_REQUIRE_DEVICE=1` is
//!   set and a missing device **fails** the test, naming what is missing;
//! - anywhere else (a plain `cargo test` on a host without RDMA) the test returns early and the
//!   test binary prints one line saying it skipped its device tests and why.
//!
//! The defaults are the harness's topology (see `scripts/guest/topology`); on a host with real
//! RDMA devices, point the tests at them with the variables below.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `RDMA_TEST_SERVER_DEVICE` | `rxe0` | device of the passive side |
//! | `RDMA_TEST_CLIENT_DEVICE` | `rxe1` | device of the active side (may equal the server's) |
//! | `RDMA_TEST_SERVER_ADDR` | `10.77.0.1` | IPv4 address of the server device's netdev |
//! | `RDMA_TEST_CLIENT_ADDR` | `10.77.0.2` | IPv4 address of the client device's netdev |
//! | `RDMA_TEST_GID_INDEX` | `1` | GID index of the RoCE v2 GID of those addresses |
//! | `RDMA_TEST_MTU` | `4096` | the ports' expected active MTU, in bytes |
//! | `RDMA_TEST_PORT` | `1` | the port number on both devices |
//! | `RDMA_TEST_PLAIN_ADDR` | `10.78.0.1` | a local IPv4 address on an interface **without** an RDMA device |
//! | `RDMA_TEST_PLAIN_PEER` | `10.78.0.2` | a neighbour reached through that interface (no RDMA device) |
//! | `RDMA_TEST_EXAMPLES` | the test binary's `../../examples` | where the examples the tests start are ([`example`]) |

#![allow(missing_docs)]

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Once;

/// Set by the harness: a missing device is a failure, not a skip.
pub const REQUIRE_DEVICE_ENV: &str = "RDMA_TEST_REQUIRE_DEVICE";

/// The example binary `name` that a device test starts: in `RDMA_TEST_EXAMPLES` when it is
/// set (the VM's `run-tests` copies the examples into the guest's tmpfs and sets it: every
/// start from the 9p root paged the binary in again), else where `cargo test` builds it, next
/// to the test's own binary (`target/debug/examples`).
pub fn example(name: &str) -> std::path::PathBuf {
    match std::env::var_os("RDMA_TEST_EXAMPLES") {
        Some(dir) => std::path::PathBuf::from(dir).join(name),
        None => {
            let exe = std::env::current_exe().expect("the test's own path");
            exe.parent().and_then(Path::parent).expect("target/debug/deps").join("examples").join(name)
        }
    }
}

/// One end of the test topology.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The RDMA device's name, e.g. `rxe0`.
    pub device: String,
    /// The IPv4 address of its network interface.
    pub addr: Ipv4Addr,
}

/// The devices and addresses device tests run on.
#[derive(Debug, Clone)]
pub struct Topology {
    pub server: Endpoint,
    pub client: Endpoint,
    pub port: u8,
    pub gid_index: u8,
    pub mtu: u32,
    /// A local address on an interface without an RDMA device (errors tests).
    pub plain_addr: Ipv4Addr,
    /// An address reached through that interface.
    pub plain_peer: Ipv4Addr,
}

impl Topology {
    /// Both endpoints, server first.
    pub fn endpoints(&self) -> [&Endpoint; 2] {
        [&self.server, &self.client]
    }
}

fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
        Err(_) => default,
    }
}

/// Whether the harness said devices must exist.
pub fn device_required() -> bool {
    std::env::var(REQUIRE_DEVICE_ENV).is_ok_and(|v| v == "1")
}

/// The topology as configured (defaults: the harness's), without checking that it exists.
pub fn configured() -> Topology {
    let server = Endpoint {
        device: var("RDMA_TEST_SERVER_DEVICE", "rxe0".to_string()),
        addr: var("RDMA_TEST_SERVER_ADDR", Ipv4Addr::new(10, 77, 0, 1)),
    };
    let client = Endpoint {
        device: var("RDMA_TEST_CLIENT_DEVICE", "rxe1".to_string()),
        addr: var("RDMA_TEST_CLIENT_ADDR", Ipv4Addr::new(10, 77, 0, 2)),
    };
    Topology {
        server,
        client,
        port: var("RDMA_TEST_PORT", 1),
        gid_index: var("RDMA_TEST_GID_INDEX", 1),
        mtu: var("RDMA_TEST_MTU", 4096),
        plain_addr: var("RDMA_TEST_PLAIN_ADDR", Ipv4Addr::new(10, 78, 0, 1)),
        plain_peer: var("RDMA_TEST_PLAIN_PEER", Ipv4Addr::new(10, 78, 0, 2)),
    }
}

/// The names of the RDMA devices the kernel has (`/sys/class/infiniband`).
pub fn present_devices() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|dir| dir.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The topology, if its devices exist.
///
/// Returns `None` (after printing one line per test binary) when a device is missing outside
/// the harness; panics with what is missing inside it.
pub fn topology() -> Option<Topology> {
    let topo = configured();
    let missing: Vec<&str> = topo
        .endpoints()
        .iter()
        .map(|e| e.device.as_str())
        .filter(|d| !Path::new("/sys/class/infiniband").join(d).exists())
        .collect();
    if missing.is_empty() {
        return Some(topo);
    }
    let present = present_devices();
    let present = if present.is_empty() { "none".to_string() } else { present.join(", ") };
    if device_required() {
        panic!(
            "RDMA device(s) missing: {} (the tests expect {} = {} and {} = {}; devices present: {present})",
            missing.join(", "),
            topo.server.device,
            topo.server.addr,
            topo.client.device,
            topo.client.addr,
        );
    }
    static SKIP_LINE: Once = Once::new();
    SKIP_LINE.call_once(|| {
        let binary = std::env::args().next().unwrap_or_default();
        let binary = Path::new(&binary).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // Written to the stream itself, not through eprintln!, which the test harness captures.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: device tests of {binary}: no RDMA device {} (present: {present}); \
             `scripts/test` runs them in the Soft-RoCE VM, or set {REQUIRE_DEVICE_ENV}=1 and RDMA_TEST_* on an RDMA host",
            missing.join("/"),
        );
    });
    None
}

/// The topology, or return from the calling test (see [`topology`]).
#[macro_export]
macro_rules! require_topology {
    () => {
        match $crate::topology() {
            Some(topology) => topology,
            None => return,
        }
    };
}

/// The kernel's count of each verbs and CM resource of `device`, as `rdma resource show`
/// (iproute2) prints it: `0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0`.
///
/// # Panics
/// When the command fails or does not list `device` (this runs inside device tests).
pub fn resource_counts(device: &str) -> Vec<(String, u64)> {
    let out =
        std::process::Command::new("rdma").args(["resource", "show"]).output().expect("running `rdma resource show`");
    assert!(out.status.success(), "rdma resource show: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{device}:")))
        .unwrap_or_else(|| panic!("{device} not in `rdma resource show`:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    words.chunks(2).map(|kv| (kv[0].to_string(), kv[1].parse().unwrap_or(u64::MAX))).collect()
}

/// One resource's count from [`resource_counts`] (e.g. `"qp"`, `"cm_id"`).
///
/// # Panics
/// When `what` is not listed.
pub fn resource_count(device: &str, what: &str) -> u64 {
    resource_counts(device)
        .into_iter()
        .find(|(k, _)| k == what)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("`rdma resource show` has no {what} count for {device}"))
}

/// How many file descriptors this process has open (entries of `/proc/self/fd`).
///
/// # Panics
/// When `/proc/self/fd` cannot be read.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("reading /proc/self/fd").count()
}

/// `len` pseudo-random bytes from `seed` (xorshift64*): the same bytes for the same seed, and
/// no two 8-byte words of one call alike in practice, so that data stored at a wrong offset
/// never compares equal.
///
/// Built optimized in test builds (the workspace's `[profile.dev.package.testkit]`): the device
/// tests make gigabytes of it, which an unoptimized loop made at a few MiB/s under TCG.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = vec![0u8; len.next_multiple_of(8)];
    for word in data.chunks_exact_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        word.copy_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    data.truncate(len);
    data
}

#[cfg(test)]
mod tests {
    use super::random_bytes;

    #[test]
    fn random_bytes_are_reproducible_and_no_word_repeats() {
        let a = random_bytes(8 << 20, 7);
        assert_eq!(a, random_bytes(8 << 20, 7), "the same seed, the same bytes");
        assert_eq!(&a[..1001], &random_bytes(1001, 7)[..], "a shorter call is a prefix");
        assert_ne!(a[..64], random_bytes(64, 8)[..], "another seed, other bytes");
        // Data stored at a wrong offset must not compare equal: no 8-byte word comes twice.
        let mut words: Vec<&[u8]> = a.chunks_exact(8).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), a.len() / 8);
    }
}
