//! File names a receiver accepts: one path component, nothing that could escape its directory.

use crate::wire::{MAX_NAME_LEN, MAX_PATH_LEN};

/// The suffix of a receiver's temporary files (`.SESSION-N.rdcp-tmp`), which no name may end with,
/// so that no sender can name another session's temporary.
pub const TEMP_SUFFIX: &str = ".rdcp-tmp";

/// Checks that `name` is one safe path component: not empty, at most [`MAX_NAME_LEN`] bytes,
/// not `.` or `..`, no `/`, no NUL and no control characters, not ending with [`TEMP_SUFFIX`].
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("name of {} bytes, at most {MAX_NAME_LEN}", name.len()));
    }
    if name == "." || name == ".." {
        return Err(format!("{name:?} is not a file name"));
    }
    if let Some(c) = name.chars().find(|&c| c == '/' || c == '\\' || c.is_control()) {
        return Err(format!("name contains {c:?}"));
    }
    if name.ends_with(TEMP_SUFFIX) {
        return Err(format!("names ending with {TEMP_SUFFIX:?} are reserved for the receiver's temporaries"));
    }
    Ok(())
}

/// Checks that `path` is a relative path under the destination: `/`-separated components,
/// each a valid name ([`check`]: no `..`, no `.`, no empty component, so no absolute path and
/// no doubled or trailing `/`), at most [`MAX_PATH_LEN`] bytes. Returns the components.
///
/// # Errors
/// A sentence saying what is wrong.
pub fn check_path(path: &str) -> Result<Vec<&str>, String> {
    if path.len() > MAX_PATH_LEN {
        return Err(format!("path of {} bytes, at most {MAX_PATH_LEN}", path.len()));
    }
    if path.starts_with('/') {
        return Err("an absolute path".into());
    }
    path.split('/').map(|c| check(c).map(|()| c).map_err(|why| format!("path {path:?}: {why}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::{check, check_path};

    #[test]
    fn only_relative_paths_of_valid_names_pass() {
        for good in ["a", "a/b", "d/e/f.bin", "..x/y"] {
            assert!(check_path(good).is_ok(), "{good:?}");
        }
        for bad in ["", "/a", "a/", "a//b", "./a", "a/./b", "../a", "a/../b", "a/..", "a\\b", "a/.0.rdcp-tmp"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a/".repeat(481)).is_err(), "over the limit");
    }

    #[test]
    fn only_single_components_pass() {
        for good in ["a", "file.bin", "..hidden", "a..b", "é", &"x".repeat(255)] {
            assert!(check(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/etc",
            "../x",
            "a\0b",
            "a\nb",
            "a\\b",
            "\u{7f}",
            &"x".repeat(256),
            ".0123456789abcdef.rdcp-tmp",
            "a.rdcp-tmp",
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
