//! `cargo xtask`: what the test command needs beyond cargo itself, in one place.
//!
//! ```text
//! cargo xtask artifacts tests|benches [--prefix P] [--name N] [--paths] -- CARGO-ARGS...
//!     runs `cargo CARGO-ARGS --message-format=json` and lists the test (or bench) executables
//!     it built whose target name starts with P (or is N), sorted by name: one line each,
//!     "CRATE-DIR<TAB>EXECUTABLE<TAB>NAME" (benches add "<TAB>bench"), or only the path with
//!     --paths. This is the list scripts/guest/run-tests reads.
//! cargo xtask msrv
//!     checks the stated MSRV (`rust-version`) against every locked normal and build dependency
//!     of the library crates (`cargo metadata`).
//! cargo xtask newest-deps
//!     clippy -D warnings and the host tests against the newest semver-compatible version of
//!     every dependency: a scratch copy of the workspace under the target directory, `cargo
//!     update` there (the committed lock stays), removed after.
//! cargo xtask test [--no-vm]
//!     every test of the project, step by named step (fmt, lint, docs, host-tests, newest-deps,
//!     device-tests on Linux 6.1, device-tests-6.12: every device test, bench and the zero-copy
//!     check on each kernel), as scripts/test (which installs what is missing first) and CI run it.
//! cargo xtask totals FILE
//!     sums the libtest and bench result lines of a test run's log, leaving out the host's runs of
//!     device tests (they skip there), and prints "N passed, M failed".
//! ```

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use serde_json::Value;

mod guest_crash;
mod test;

/// The crates users build: the MSRV applies to them and everything they pull in.
const LIBRARY_CRATES: &[&str] = &["rdma-verbs-sys", "rdma-verbs", "rdma-cm", "rdma-proto", "rdma-stream"];

/// Locked dependencies of the library crates that need a newer Rust than the MSRV, with the
/// version of each that builds with the MSRV and meets every library crate's requirement. Only
/// rdma-stream's `tonic` feature reaches them (h2 and tower ask for `indexmap = "2"`); the lock
/// holds the newer ones because the workspace's dev tools need them (proptest through borsh's
/// proc-macro-crate, trybuild through toml, ask for indexmap >= 2.14), and one lock holds one
/// indexmap 2.x. A user on the MSRV gets the older ones from cargo's MSRV-aware resolver, or
/// with `cargo update -p indexmap --precise 2.11.4`.
const MSRV_EXEMPT: &[(&str, &str)] =
    &[("indexmap", "2.11.4 (Rust 1.63)"), ("hashbrown", "the one indexmap 2.11.4 takes")];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("artifacts") => artifacts(&args[1..]),
        Some("test") => test::test(&args[1..]),
        Some("msrv") => msrv(),
        Some("newest-deps") => test::newest_deps(),
        Some("totals") => match args.get(1) {
            Some(file) => totals(Path::new(file)),
            None => Err("totals: give the log file".into()),
        },
        _ => Err(usage()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> String {
    let doc = include_str!("main.rs");
    let text: Vec<&str> = doc
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").strip_prefix(' ').unwrap_or(""))
        .filter(|l| !l.starts_with("```"))
        .collect();
    format!("usage:\n{}", text.join("\n"))
}

/// `cargo xtask artifacts`: see the module docs.
fn artifacts(args: &[String]) -> Result<(), String> {
    let (ours, cargo_args) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => return Err("artifacts: CARGO-ARGS follow `--`".into()),
    };
    let benches = match ours.first().map(String::as_str) {
        Some("tests") => false,
        Some("benches") => true,
        _ => return Err("artifacts: tests or benches".into()),
    };
    let mut prefix = "";
    let mut name = None;
    let mut paths = false;
    let mut it = ours[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--prefix" => prefix = it.next().ok_or("--prefix needs a value")?,
            "--name" => name = Some(it.next().ok_or("--name needs a value")?.as_str()),
            "--paths" => paths = true,
            other => return Err(format!("artifacts: unknown option {other}")),
        }
    }
    let found = artifacts_of(benches, prefix, name, &cargo_args.iter().map(String::as_str).collect::<Vec<_>>(), &[])?;
    for (dir, exe, target) in found {
        match (paths, benches) {
            (true, _) => println!("{exe}"),
            (false, false) => println!("{dir}\t{exe}\t{target}"),
            (false, true) => println!("{dir}\t{exe}\t{target}\tbench"),
        }
    }
    Ok(())
}

/// Runs `cargo CARGO-ARGS --message-format=json` and returns the (crate directory, executable,
/// target name) of each test (or bench) executable it built that the filters take, by name.
/// `env` is set for cargo: the test command passes its build settings, so that these builds
/// are the ones its host tests made, not a second build of everything.
pub(crate) fn artifacts_of(
    benches: bool,
    prefix: &str,
    name: Option<&str>,
    cargo_args: &[&str],
    env: &[(&str, &str)],
) -> Result<Vec<(String, String, String)>, String> {
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(cargo_args)
        .envs(env.iter().copied())
        .arg("--message-format=json")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cargo: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut found = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let Ok(m) = serde_json::from_str::<Value>(&line) else { continue };
        if let Some(a) = artifact(&m, benches, prefix, name) {
            found.push(a);
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("cargo {} failed ({status})", cargo_args.join(" ")));
    }
    found.sort_by(|a, b| a.2.cmp(&b.2));
    found.dedup();
    Ok(found)
}

/// The (crate directory, executable, target name) of one of cargo's JSON messages, if it built
/// a test (or bench) executable whose target the filters take.
fn artifact(m: &Value, benches: bool, prefix: &str, name: Option<&str>) -> Option<(String, String, String)> {
    if m["reason"] != "compiler-artifact" {
        return None;
    }
    let exe = m["executable"].as_str()?;
    let target = &m["target"];
    let kind = if benches { "bench" } else { "test" };
    if target["kind"] != serde_json::json!([kind]) || (!benches && m["profile"]["test"] != true) {
        return None;
    }
    let target_name = target["name"].as_str()?;
    if !target_name.starts_with(prefix) || name.is_some_and(|n| n != target_name) {
        return None;
    }
    let dir = Path::new(m["manifest_path"].as_str()?).parent()?.display().to_string();
    Some((dir, exe.to_owned(), target_name.to_owned()))
}

/// `cargo xtask msrv`: see the module docs.
pub(crate) fn msrv() -> Result<(), String> {
    // Every optional feature (tokio, rdma-sys) counts; dependencies behind a `cfg` the host's
    // build does not set (tokio's `tokio_taskdump`) do not.
    let host = host_triple()?;
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--locked", "--all-features", "--filter-platform", &host])
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let m: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let packages = m["packages"].as_array().ok_or("no packages")?;
    let nodes = m["resolve"]["nodes"].as_array().ok_or("no resolve graph")?;
    let members: Vec<&str> =
        m["workspace_members"].as_array().ok_or("no members")?.iter().filter_map(Value::as_str).collect();
    let package = |id: &str| packages.iter().find(|p| p["id"] == id);
    let version = |p: &Value| -> Vec<u64> {
        p["rust_version"].as_str().unwrap_or("0").split('.').map(|x| x.parse().unwrap_or(0)).collect()
    };
    let root = |name: &str| members.iter().copied().find(|id| package(id).is_some_and(|p| p["name"] == name));
    let msrv = version(package(root("rdma-verbs").ok_or("no rdma-verbs")?).ok_or("no rdma-verbs")?);
    let mut bad = Vec::new();
    let mut exempt = Vec::new();
    for name in LIBRARY_CRATES {
        let mut seen: Vec<&str> = Vec::new();
        let mut stack = vec![root(name).ok_or(format!("no workspace crate {name}"))?];
        while let Some(id) = stack.pop() {
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            let Some(node) = nodes.iter().find(|n| n["id"] == id) else { continue };
            for dep in node["deps"].as_array().into_iter().flatten() {
                let normal_or_build = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null() || k["kind"] == "build");
                if normal_or_build {
                    stack.extend(dep["pkg"].as_str());
                }
            }
        }
        for id in seen {
            let p = package(id).ok_or("a dependency missing from the metadata")?;
            if version(p) > msrv {
                let line = format!("{name} -> {} {} needs Rust {}", p["name"], p["version"], p["rust_version"]);
                match MSRV_EXEMPT.iter().find(|(n, _)| p["name"] == *n) {
                    Some((_, older)) => exempt.push(format!("{line}; with the MSRV: {older}")),
                    None => bad.push(line),
                }
            }
        }
    }
    let want: Vec<String> = msrv.iter().map(u64::to_string).collect();
    if !bad.is_empty() {
        bad.sort();
        bad.dedup();
        return Err(format!("MSRV {} is not met by the locked dependencies:\n  {}", want.join("."), bad.join("\n  ")));
    }
    exempt.sort();
    exempt.dedup();
    for line in exempt {
        println!("exempt (MSRV_EXEMPT): {line}");
    }
    println!("MSRV {}: every locked dependency of {} allows it", want.join("."), LIBRARY_CRATES.join(", "));
    Ok(())
}

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> Result<String, String> {
    let out = Command::new("rustc").arg("-vV").output().map_err(|e| format!("rustc -vV: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| "rustc -vV named no host".into())
}

/// `cargo xtask totals`: see the module docs.
fn totals(file: &Path) -> Result<(), String> {
    let log = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let (passed, failed) = count(&log);
    println!("{passed} passed, {failed} failed");
    Ok(())
}

/// Sums `test result:` and `bench result:` lines, skipping what the host ran of device tests.
pub(crate) fn count(log: &str) -> (u64, u64) {
    let (mut passed, mut failed, mut skip) = (0, 0, false);
    for line in log.lines() {
        let t = line.trim_start();
        if t.starts_with("Running ") && t.contains("tests/device_") {
            skip = true;
            continue;
        }
        if t.starts_with("Running ")
            || t.starts_with("Doc-tests ")
            || line.starts_with("--- device tests: ")
            || line.starts_with("--- bench ")
        {
            skip = false;
        }
        if skip || !(line.starts_with("test result: ") || line.starts_with("bench result: ")) {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        for w in words.windows(2) {
            let n: u64 = w[0].parse().unwrap_or(0);
            if w[1].starts_with("passed") {
                passed += n;
            } else if w[1].starts_with("failed") {
                failed += n;
            }
        }
    }
    (passed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_leave_out_the_hosts_skipped_device_tests() {
        let log = "\
     Running unittests src/lib.rs (target/debug/deps/x-1)
test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s
     Running tests/device_rc.rs (target/debug/deps/device_rc-2)
test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
   Doc-tests rdma_verbs
test result: ok. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s
--- device tests: device_rc
test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.4s
--- bench (criterion test mode): verbs
bench result: ok. 9 passed; 0 failed
";
        assert_eq!(count(log), (22, 1));
    }

    #[test]
    fn only_test_executables_of_the_wanted_targets_are_listed() {
        let m = |kind: &str, name: &str, test: bool| {
            serde_json::json!({"reason": "compiler-artifact", "executable": format!("/t/{name}"),
                "manifest_path": "/w/c/Cargo.toml", "profile": {"test": test},
                "target": {"kind": [kind], "name": name}})
        };
        let got = artifact(&m("test", "device_rc", true), false, "device_", None);
        assert_eq!(got, Some(("/w/c".into(), "/t/device_rc".into(), "device_rc".into())));
        assert_eq!(artifact(&m("test", "codec", true), false, "device_", None), None, "prefix");
        assert_eq!(artifact(&m("lib", "device_x", true), false, "", None), None, "kind");
        assert_eq!(artifact(&m("test", "device_rc", false), false, "", None), None, "not a test build");
        assert!(artifact(&m("bench", "verbs", false), true, "", None).is_some());
        assert_eq!(artifact(&m("test", "device_rc", true), false, "", Some("device_no_alloc")), None, "name");
    }
}
