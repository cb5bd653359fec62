//! The README's first program is `examples/loopback.rs`, which CI builds (and clippy checks):
//! this fails when the README's code block and that file's code differ, so the program a new
//! user copies from the README compiles as it is.

use std::path::Path;

/// The contents of the first ```` ```rust ```` block of `text`.
fn first_rust_block(text: &str) -> Option<&str> {
    let start = text.find("```rust\n")? + "```rust\n".len();
    let len = text[start..].find("```\n")?;
    Some(&text[start..start + len])
}

#[test]
fn the_readme_shows_the_loopback_example_as_it_is() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/loopback.rs")).unwrap();
    // The example's code: everything after its `//!` header and the blank line that ends it.
    let code: String = example.lines().skip_while(|l| l.starts_with("//!")).skip(1).map(|l| format!("{l}\n")).collect();
    let shown = first_rust_block(&readme).expect("README.md has a ```rust block");
    assert_eq!(shown, code, "README.md's first program is not examples/loopback.rs's code");
}
