//! docs/architecture.md keeps a table of every source file of the library crates: this fails
//! when a file is missing from its crate's table, or the table names a file that is gone.

use std::collections::BTreeSet;
use std::path::Path;

/// The `.rs` files under `dir`, relative to it.
fn sources(dir: &Path, under: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, under, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.insert(path.strip_prefix(under).unwrap().to_string_lossy().into_owned());
        }
    }
}

/// The files the first column of the tables in `crate_name`'s section names.
fn tabled(doc: &str, crate_name: &str) -> BTreeSet<String> {
    let heading = format!("## {crate_name}:");
    let section = doc.split("\n## ").find(|s| format!("## {s}").starts_with(&heading));
    let section = section.unwrap_or_else(|| panic!("docs/architecture.md has no section {heading}"));
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split('|').nth(1).unwrap_or("");
        for name in first.split('`').skip(1).step_by(2).filter(|n| n.ends_with(".rs")) {
            names.insert(name.to_owned());
        }
    }
    names
}

#[test]
fn every_library_source_file_is_in_the_architecture_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut problems = Vec::new();
    for crate_name in ["rdma-verbs", "rdma-cm", "rdma-proto", "rdma-stream"] {
        let src = root.join(crate_name).join("src");
        let mut files = BTreeSet::new();
        sources(&src, &src, &mut files);
        let named = tabled(&doc, crate_name);
        for missing in files.difference(&named) {
            problems.push(format!("{crate_name}/src/{missing} is in no row of the table"));
        }
        for gone in named.difference(&files) {
            problems.push(format!("the table names {crate_name}/src/{gone}, which does not exist"));
        }
    }
    assert!(problems.is_empty(), "docs/architecture.md:\n{}", problems.join("\n"));
}
