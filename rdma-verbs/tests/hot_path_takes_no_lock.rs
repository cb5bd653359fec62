//! The per-request hot path takes no lock: no module of the crate holds a lock type or calls
//! `lock()`, but for the few that create or destroy resources, named below with why.
//!
//! The data path does not need one: every hot-path method takes `&mut self` (the borrow checker
//! gives exclusive access), and the pool's free-slot bitmap is updated with atomic
//! compare-exchange. Allocation on the same path is checked at run time by
//! `device_no_alloc.rs`. This check reads the sources, every `.rs` file under `src/`, so a lock
//! added later, in a file that exists now or not, fails it here rather than in a profile.

use std::path::{Path, PathBuf};

/// The files that may lock, and why none of it is per request.
const MAY_LOCK: &[(&str, &str)] = &[
    ("src/registry.rs", "the resource registry, taken when a verbs object is created or destroyed"),
    ("src/mw/mod.rs", "a memory window's verbs object and the type 2 windows a QP keeps: taken when a window is allocated, bound, invalidated or deallocated, and when its QP is destroyed (binds are grants, not per-message requests)"),
    ("src/qp/multicast.rs", "a UD QP's multicast attachments, taken when it attaches to a group, detaches, or is destroyed"),
    ("src/srq.rs", "the slots a dropped ring left posted on an SRQ, taken when the ring or the SRQ goes"),
    ("src/wait/sleepers.rs", "the threads asleep on a channel: taken on the way into and out of a sleep (a system call anyway), and when a foreign event wakes them"),
];

/// What a lock looks like in this code base: its types, and taking one (a method called on a
/// field or variable; `.read()` after a call or cast is a raw pointer's read, not a lock's).
const LOCK_TYPES: &[&str] = &["Mutex", "RwLock", "parking_lot", "Condvar"];
const LOCK_CALLS: &[&str] = &[".lock()", ".read()", ".write()"];

fn takes_lock(code: &str) -> bool {
    LOCK_TYPES.iter().any(|t| code.contains(t))
        || LOCK_CALLS.iter().any(|call| {
            code.match_indices(call)
                .any(|(i, _)| code[..i].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_'))
        })
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn locks_in(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if takes_lock(code) {
            found.push((n + 1, line.trim().to_owned()));
        }
    }
    found
}

#[test]
fn no_module_but_the_resource_lifecycle_holds_a_lock() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(files.len() > 20, "the sources were not found: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        if MAY_LOCK.iter().any(|(f, _)| *f == rel) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{rel}: {e}"));
        found.extend(locks_in(&text).into_iter().map(|(n, line)| format!("{rel}:{n}: {line}")));
    }
    assert!(found.is_empty(), "locks outside the resource lifecycle:\n{}", found.join("\n"));
}

#[test]
fn the_check_tells_a_lock_from_a_pointer_read() {
    assert!(takes_lock("let g = self.orphans.lock().unwrap();"));
    assert!(takes_lock("let g = table.read();"));
    assert!(takes_lock("struct S { m: Mutex<u8> }"));
    assert!(!takes_lock("let v = std::ptr::addr_of!((*p).x).cast::<u32>().read();"));
}

#[test]
fn the_check_sees_a_lock_when_there_is_one() {
    // The check above must be able to fail: every file allowed to lock does lock.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (file, why) in MAY_LOCK {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(!locks_in(&text).is_empty(), "{file} is allowed a lock ({why}) but holds none");
    }
}
