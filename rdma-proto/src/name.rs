//! File names a receiver accepts: one path component, nothing that could escape its directory.

use crate::wire::MAX_NAME_LEN;

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

#[cfg(test)]
mod tests {
    use super::check;

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
