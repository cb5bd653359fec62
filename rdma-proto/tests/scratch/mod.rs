//! What the driver's device tests share: scratch directories and seeded test files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A directory of the guest's own /tmp, removed at the end.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rdma-proto-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A file of `len` pseudo-random bytes (seeded) at `path`.
pub fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let bytes = testkit::random_bytes(len, seed);
    std::fs::write(path, &bytes).unwrap();
    bytes
}
