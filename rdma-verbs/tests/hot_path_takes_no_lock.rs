//! The per-request hot path takes no lock: the modules that post, poll and recycle buffers
//! hold no lock type and call no `lock()`.
//!
//! They do not need one: every hot-path method takes `&mut self` (the borrow checker gives
//! exclusive access), and the pool's free-slot bitmap is updated with atomic compare-exchange.
//! The only lock of the crate, the resource registry's, is taken when a resource is created or
//! destroyed. Allocation on the same path is checked at run time by `device_no_alloc.rs`.
//! This check reads the sources, so a lock added later fails it here rather than in a profile.

use std::path::Path;

/// The files whose code runs per work request: building it, posting it, polling its
/// completion, and taking and returning its buffer.
const HOT_PATH: &[&str] =
    &["src/send_queue.rs", "src/recv_ring.rs", "src/pool.rs", "src/wr.rs", "src/wc.rs", "src/scope.rs", "src/cq.rs"];

/// What a lock looks like in this code base.
const LOCKS: &[&str] = &["Mutex", "RwLock", "parking_lot", "Condvar", ".lock()", ".read()", ".write()"];

#[test]
fn the_hot_path_modules_hold_no_lock() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for file in HOT_PATH {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for lock in LOCKS {
                if code.contains(lock) {
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "locks on the per-request path:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_a_lock_when_there_is_one() {
    // The check above must be able to fail: the registry, which does lock, is caught by it.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/registry.rs")).unwrap();
    assert!(LOCKS.iter().any(|l| text.lines().any(|line| line.split("//").next().unwrap_or("").contains(l))));
}
