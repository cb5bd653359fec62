//! `cargo xtask test [--no-vm]`: every test of the project, as CI runs it, step by named step
//! (`scripts/test` installs what is missing, then runs this). See `docs/testing.md`.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{artifacts_of, count, guest_crash};

/// The tests run with the fault-injection hooks (rdma-copy's hidden test flags), the async
/// fronts (feature `tokio` of each library crate), rdma-verbs' `memmap2` buffers and the gRPC
/// and HTTP examples over rdma-stream (`stream-ecosystem`: its `tonic` and `hyper` features)
/// built in; the default build, without them, is linted and documented too.
const TESTED_FEATURES: [&str; 2] =
    ["--features", "rdma-tools/fault-injection,rdma-tools/tokio,rdma-verbs/memmap2,rdma-tools/stream-ecosystem"];

/// The library crates, in publishing order.
const PUBLISHED: [&str; 5] = ["rdma-verbs-sys", "rdma-verbs", "rdma-cm", "rdma-proto", "rdma-stream"];
/// The VM runs keep the guest kernel's console, so that a guest that dies (a panic reboots it
/// at once) leaves its last messages in the command's output (`scripts/softroce`).
const GUEST_CONSOLE: [(&str, &str); 1] = [("SOFTROCE_VERBOSE", "1")];
/// The bound on each of the test command's VM runs, boot to exit: a bound on a hang, not on
/// speed. TCG's speed differs by machine: the 6.1 list takes about 20 minutes on one and over
/// 30 on another, so half an hour is too tight.
const VM_TIMEOUT_S: &str = "3600";

/// The test command's builds keep line tables (a panic's backtrace names files and lines) but
/// no variable or type information, and no incremental caches: a run builds the workspace in
/// several configurations, and with full debug information and incremental caches its target
/// directories outgrow the disk of a CI machine ("No space left on device" at the host tests).
/// Each applies only when the caller's environment does not set it.
/// The device tests' build (`artifacts_of`) takes them too: without them it would build
/// everything a second time (minutes) into binaries of full debug information, each paged in
/// over the guest's 9p root.
const LEAN_BUILDS: [(&str, &str); 2] = [("CARGO_PROFILE_DEV_DEBUG", "line-tables-only"), ("CARGO_INCREMENTAL", "0")];

/// `LEAN_BUILDS` that the caller's environment does not set.
fn lean_builds() -> Vec<(&'static str, &'static str)> {
    LEAN_BUILDS.iter().copied().filter(|(k, _)| std::env::var_os(k).is_none()).collect()
}

/// The kernels the device tests run on, each in a VM boot of its own, one after the other:
/// Debian 12's (6.1) and Debian 13's (6.12, which most new users of the project run; rxe
/// differs between them, docs/testing.md "Two kernels"). Each runs everything: every device
/// test, every bench in its test mode and the zero-copy check.
const KERNELS: [&str; 2] = ["6.1", "6.12"];

struct Run {
    root: PathBuf,
    /// Every test result line goes here too, for the totals.
    results: File,
    results_path: PathBuf,
    /// The guest crash in rxe whose remaining binaries ran again in a fresh boot, when one did
    /// (at most one per run): said again in the summary.
    rxe_rerun: Option<String>,
    /// The guest that died while it booted, before any binary started, and was booted again,
    /// when one did (at most one per run): said again in the summary.
    boot_rerun: Option<String>,
    /// Each step's name and start, for the step times printed as the run goes and at its end.
    steps: Vec<(String, std::time::Instant)>,
}

type Step = Result<(), String>;

/// `cargo xtask newest-deps`: the test command's newest-deps step alone.
pub(crate) fn newest_deps() -> Step {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let results_path = target_dir(&root).join("newest-deps-results.log");
    std::fs::create_dir_all(results_path.parent().expect("a parent")).map_err(|e| e.to_string())?;
    let results = File::create(&results_path).map_err(|e| format!("{}: {e}", results_path.display()))?;
    Run { root, results, results_path, rxe_rerun: None, boot_rerun: None, steps: Vec::new() }.newest_deps()
}

pub(crate) fn test(args: &[String]) -> Step {
    let vm = match args.first().map(String::as_str) {
        None => true,
        Some("--no-vm") => false,
        Some(other) => return Err(format!("test: unknown argument {other} (only --no-vm)")),
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf();
    let results_path = target_dir(&root).join("test-results.log");
    std::fs::create_dir_all(results_path.parent().expect("a parent")).map_err(|e| e.to_string())?;
    let results = File::create(&results_path).map_err(|e| format!("{}: {e}", results_path.display()))?;
    let mut run = Run { root, results, results_path, rxe_rerun: None, boot_rerun: None, steps: Vec::new() };

    let result = run_test(&mut run, vm);
    log(&format!("step times: {}", run.step_times()));
    result
}

/// The test command's steps, in order: the first that fails ends the run.
fn run_test(run: &mut Run, vm: bool) -> Step {
    run.step("fmt", "cargo fmt --check");
    run.cargo(&["fmt", "--all", "--check"], &[])?;

    run.step("lint", "cargo clippy --all-targets -- -D warnings (default, with fault injection, and the rdma-sys feature); MSRV; generated bindings");
    let clippy = ["clippy", "--workspace", "--all-targets", "--locked"];
    run.cargo(&[&clippy[..], &["--", "-D", "warnings"]].concat(), &[])?;
    run.cargo(&[&clippy[..], &TESTED_FEATURES, &["--", "-D", "warnings"]].concat(), &[])?;
    let libclang = rdma_sys_env()?;
    let rdma_sys = [("LIBCLANG_PATH", libclang.as_str())];
    let sys_features = ["-p", "rdma-verbs", "-p", "rdma-cm", "--features", "rdma-verbs/rdma-sys", "--locked"];
    run.cargo(&[&["clippy", "--all-targets"][..], &sys_features, &["--", "-D", "warnings"]].concat(), &rdma_sys)?;
    crate::msrv()?;
    run.sh("scripts/gen-bindings", &["--check"], &[])?;

    run.step(
        "docs",
        "cargo doc (warnings are errors; default and async features), cargo package, the docs as docs.rs builds them",
    );
    let doc = ["doc", "--workspace", "--no-deps", "--locked", "--quiet"];
    run.cargo(&doc, &[("RUSTDOCFLAGS", "-D warnings")])?;
    run.cargo(&[&doc[..], &TESTED_FEATURES].concat(), &[("RUSTDOCFLAGS", "-D warnings")])?;
    run.package()?;
    // docs.rs builds without rdma-core: with DOCS_RS set, and pkg-config finding nothing, the
    // docs must still build (rdma-verbs-sys's build.rs then links nothing).
    let docs_rs = target_dir(&run.root).join("docs-rs");
    let docs_rs = docs_rs.to_str().ok_or("a non-UTF-8 target directory")?;
    let no_libs = [("PKG_CONFIG_LIBDIR", "/nonexistent"), ("PKG_CONFIG_PATH", "")];
    let env = [&no_libs[..], &[("DOCS_RS", "1"), ("CARGO_TARGET_DIR", docs_rs)]].concat();
    let each: Vec<&str> = PUBLISHED.iter().flat_map(|p| ["-p", p]).collect();
    run.cargo(&[&["doc", "--locked", "--quiet", "--no-deps"][..], &each].concat(), &env)?;
    // Only this check reads it: its space goes back to the builds after it.
    let _ = std::fs::remove_dir_all(docs_rs);

    run.step("host-tests", "cargo test --workspace, the rdma-sys feature's unit tests, rdma-proto's core alone");
    let host = [("RDMA_LAYOUT_REQUIRED", "1"), ("RDMA_TEST_REQUIRE_DEVICE", "")];
    run.tee("cargo", &[&["test", "--workspace", "--locked"][..], &TESTED_FEATURES].concat(), &host)
        .map_err(|e| format!("host tests failed: {e}"))?;
    run.tee("cargo", &[&["test", "--lib"][..], &sys_features].concat(), &rdma_sys)
        .map_err(|e| format!("the rdma-sys feature's unit tests failed: {e}"))?;
    // rdma-proto's protocol core alone (codec, state machines): no driver, and no RDMA library
    // at all, as a user of the core builds it.
    let core = ["-p", "rdma-proto", "--no-default-features", "--locked"];
    run.cargo(&[&["clippy", "--all-targets"][..], &core, &["--", "-D", "warnings"]].concat(), &no_libs)?;
    run.tee("cargo", &[&["test"][..], &core].concat(), &no_libs)
        .map_err(|e| format!("rdma-proto's core-only tests failed: {e}"))?;

    run.step(
        "newest-deps",
        "clippy -D warnings and the host tests against the newest semver-compatible version of every dependency (cargo update in a scratch copy; the committed lock stays)",
    );
    run.newest_deps()?;

    let what = |kernel: &str| {
        format!("device tests, every bench once and the zero-copy check, in the Soft-RoCE VM on Linux {kernel}")
    };
    run.step("device-tests", &if vm { what(KERNELS[0]) } else { "device tests on this host".to_owned() });
    let tests = artifacts_of(
        false,
        "device_",
        None,
        &[&["test", "--workspace", "--locked"][..], &TESTED_FEATURES, &["--no-run"]].concat(),
        &lean_builds(),
    )?;
    if tests.is_empty() {
        return Err("no device tests found (tests/device_*.rs)".into());
    }
    // The criterion benches, after the tests in the same VM boot, each once in criterion's test
    // mode (a debug build, as `cargo test --benches` makes: only that every benchmark runs).
    let benches = artifacts_of(
        true,
        "",
        None,
        &[&["test", "--workspace", "--locked"][..], &TESTED_FEATURES, &["--no-run", "--benches"]].concat(),
        &lean_builds(),
    )?;
    if benches.is_empty() {
        return Err("no benches found (benches/*.rs)".into());
    }
    let names = |v: &[(String, String, String)]| v.iter().map(|a| a.2.as_str()).collect::<Vec<_>>().join(" ");
    log(&format!("{} device test binaries: {}", tests.len(), names(&tests)));
    log(&format!("{} benches, in test mode: {}", benches.len(), names(&benches)));
    let mut lines: Vec<String> = tests.iter().map(|(d, e, n)| format!("{d}\t{e}\t{n}")).collect();
    lines.extend(benches.iter().map(|(d, e, n)| format!("{d}\t{e}\t{n}\tbench")));
    // The zero-copy check in the same boot (a boot of its own cost about 40 s).
    if vm {
        let no_alloc = tests
            .iter()
            .find(|(_, _, n)| n == "device_no_alloc")
            .ok_or("no device_no_alloc test for the zero-copy check")?;
        let script = run.root.join("scripts/check-zero-copy");
        let script = script.to_str().ok_or("a non-UTF-8 path")?;
        lines.push(format!("{}\t{script}\tzero-copy\tcheck\t--guest\t{}", no_alloc.0, no_alloc.1));
    }
    // The same list on each kernel; a kernel's run goes ahead when an earlier one failed, so
    // that one run of the command reports every kernel.
    let devices: Vec<(&str, Step)> = if vm {
        let mut results = Vec::new();
        for (i, kernel) in KERNELS.into_iter().enumerate() {
            if i > 0 {
                run.step(&format!("device-tests-{kernel}"), &what(kernel));
            }
            let list = if i == 0 { "device-tests.list".to_owned() } else { format!("device-tests-{kernel}.list") };
            results.push((kernel, run.vm(kernel, &list, &lines)));
        }
        results
    } else {
        let list = write_list(&run.root, "device-tests.list", &lines)?;
        let run_tests = run.root.join("scripts/guest/run-tests");
        let run_tests = run_tests.to_str().ok_or("a non-UTF-8 path")?;
        vec![("", run.tee(run_tests, &[&list], &[("RDMA_TEST_REQUIRE_DEVICE", "1")]))]
    };
    // Every libtest result line and run-tests' bench result lines, leaving out the host's run of
    // the device tests (they skipped there).
    let log_text = std::fs::read_to_string(&run.results_path).map_err(|e| e.to_string())?;
    let (passed, failed) = count(&log_text);
    for (kernel, result) in devices {
        let on = if vm { format!(" on Linux {kernel}") } else { String::new() };
        result.map_err(|e| format!("device tests or benches failed{on}: {e}"))?;
    }

    for note in [&run.boot_rerun, &run.rxe_rerun].into_iter().flatten() {
        log(&format!("NOTE: {note}"));
    }
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// The names of the workspace's integration tests at `root` that are not device tests
/// (`device_*`) or trybuild's compile-fail tests, from `cargo metadata`.
fn host_integration_tests(root: &Path) -> Result<Vec<String>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .map_err(|e| format!("cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let mut names: Vec<String> = m["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| t["kind"] == serde_json::json!(["test"]))
        .filter_map(|t| t["name"].as_str())
        // trybuild's expected compiler output names paths relative to the workspace, which it
        // finds through the target directory: a copy building in the main one is not found.
        // The rules it checks are the compiler's, not the dependencies'.
        .filter(|n| !n.starts_with("device_") && *n != "compile_fail")
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// Copies the tree at `from` into `to`, but `.git`, `target` and `skip` (the target directory,
/// wherever it is); symbolic links stay links.
fn copy_sources(from: &Path, to: &Path, skip: &Path) -> Step {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let (path, name) = (entry.path(), entry.file_name());
        if name == ".git" || name == "target" || path == skip {
            continue;
        }
        let dest = to.join(&name);
        let kind = entry.file_type().map_err(|e| format!("{}: {e}", path.display()))?;
        let copied = if kind.is_symlink() {
            std::fs::read_link(&path).and_then(|target| std::os::unix::fs::symlink(target, &dest))
        } else if kind.is_dir() {
            copy_sources(&path, &dest, skip)?;
            Ok(())
        } else {
            std::fs::copy(&path, &dest).map(drop)
        };
        copied.map_err(|e| format!("copying {}: {e}", path.display()))?;
    }
    Ok(())
}

fn log(line: &str) {
    eprintln!("==> {line}");
}

/// Writes a list for `scripts/guest/run-tests` into the target directory; returns its path.
fn write_list(root: &Path, name: &str, lines: &[String]) -> Result<String, String> {
    let path = target_dir(root).join(name);
    std::fs::write(&path, lines.join("\n") + "\n").map_err(|e| e.to_string())?;
    Ok(path.to_str().ok_or("a non-UTF-8 target directory")?.to_owned())
}

/// `CARGO_TARGET_DIR`, or the workspace's `target`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// The rdma-sys feature's bindgen 0.59 needs libclang 14 or 15 (it cannot parse the headers
/// with 16 and newer): pinned for its builds alone, unless the caller chose one.
/// Returns the `LIBCLANG_PATH` for those builds.
fn rdma_sys_env() -> Result<String, String> {
    if let Some(p) = std::env::var_os("RDMA_SYS_LIBCLANG_PATH") {
        return Ok(p.to_string_lossy().into_owned());
    }
    for v in [14, 15] {
        let dir = format!("/usr/lib/llvm-{v}/lib");
        if Path::new(&dir).join("libclang.so").exists() || Path::new(&dir).join(format!("libclang-{v}.so.1")).exists() {
            return Ok(dir);
        }
    }
    Err("the rdma-sys feature needs libclang 14 or 15 (apt install libclang-14-dev)".into())
}

impl Run {
    fn step(&mut self, name: &str, what: &str) {
        if let Some((last, started)) = self.steps.last() {
            log(&format!("[{last}] took {} s", started.elapsed().as_secs()));
        }
        self.steps.push((name.to_owned(), std::time::Instant::now()));
        log(&format!("[{name}] {what}"));
    }

    /// Every step's time so far, and the whole run's: "fmt 2 s, lint 95 s, ...; 2,100 s in all".
    fn step_times(&self) -> String {
        let now = std::time::Instant::now();
        let ends = self.steps.iter().skip(1).map(|(_, t)| *t).chain(std::iter::once(now));
        let each: Vec<String> = self
            .steps
            .iter()
            .zip(ends)
            .map(|((name, start), end)| format!("{name} {} s", end.duration_since(*start).as_secs()))
            .collect();
        let all = self.steps.first().map_or(0, |(_, t)| now.duration_since(*t).as_secs());
        format!("{}; {all} s in all", each.join(", "))
    }

    fn command(&self, program: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let program = if program.starts_with("scripts/") { self.root.join(program) } else { PathBuf::from(program) };
        let mut c = Command::new(program);
        c.args(args).current_dir(&self.root).env_remove("LIBCLANG_PATH");
        c.envs(lean_builds());
        for &(k, v) in env {
            // An empty value removes the variable (RDMA_TEST_REQUIRE_DEVICE for the host's tests).
            if v.is_empty() && k == "RDMA_TEST_REQUIRE_DEVICE" {
                c.env_remove(k);
            } else {
                c.env(k, v);
            }
        }
        c
    }

    fn cargo(&self, args: &[&str], env: &[(&str, &str)]) -> Step {
        self.sh(&std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()), args, env)
    }

    /// Runs a command with the terminal as its output; an error unless it succeeds.
    fn sh(&self, program: &str, args: &[&str], env: &[(&str, &str)]) -> Step {
        let status = self.command(program, args, env).status().map_err(|e| format!("{program}: {e}"))?;
        if !status.success() {
            return Err(format!("{program} {} failed ({status})", args.join(" ")));
        }
        Ok(())
    }

    /// Runs the `run-tests` list `lines` in the Soft-RoCE VM on `kernel`, with the guest's
    /// console kept. A guest that dies while it boots, before any binary started, boots again
    /// with the whole list; one that dies in an oops that runs through rxe runs the binaries
    /// that had not finished again in a fresh boot. Each happens at most once per run of the
    /// command, loudly; any other crash, or a second one, fails (see `guest_crash`).
    fn vm(&mut self, kernel: &str, list_name: &str, lines: &[String]) -> Step {
        let run_tests = self.root.join("scripts/guest/run-tests");
        let run_tests = run_tests.to_str().ok_or("a non-UTF-8 path")?.to_owned();
        let list = write_list(&self.root, list_name, lines)?;
        let args = ["run", "--kernel", kernel, "--timeout", VM_TIMEOUT_S, "--", &run_tests, &list];
        let (mut result, mut output) = self.tee_output("scripts/softroce", &args, &GUEST_CONSOLE);
        let crashed = |output: &[String]| output.iter().any(|l| l.starts_with("softroce: the guest's whole console"));
        if result.is_err() && crashed(&output) && guest_crash::running(&output).is_none() && self.boot_rerun.is_none() {
            let console = guest_crash::kept_console(&output).ok_or("the kept console's path was not printed")?;
            let text = std::fs::read_to_string(console).map_err(|e| format!("{console}: {e}"))?;
            let oops = guest_crash::oops(&text).unwrap_or_else(|| "no oops in the console".into());
            let first = oops.lines().next().unwrap_or_default();
            let note = format!(
                "the Linux {kernel} guest died while it booted, before any binary started \
                 (docs/testing.md \"Known limits\"): {first}; its console: {console}; it booted again"
            );
            log(&format!("RE-BOOT: {note}"));
            eprintln!("{oops}");
            self.boot_rerun = Some(note);
            (result, output) = self.tee_output("scripts/softroce", &args, &GUEST_CONSOLE);
        }
        if result.is_ok() || !crashed(&output) || self.rxe_rerun.is_some() {
            return result;
        }
        let console = guest_crash::kept_console(&output).ok_or("the kept console's path was not printed")?;
        let text = std::fs::read_to_string(console).map_err(|e| format!("{console}: {e}"))?;
        let Some(oops) = guest_crash::oops(&text).filter(|o| guest_crash::in_rxe(o)) else {
            return result;
        };
        let running = guest_crash::running(&output).ok_or("the guest died before run-tests started a binary")?;
        let rest = guest_crash::remaining(lines, running).ok_or_else(|| format!("{running} is not in {list}"))?;
        let first = oops.lines().next().unwrap_or_default();
        let note = format!(
            "the Linux {kernel} guest crashed in rxe (the kernel's defect, docs/testing.md \"Known limits\") \
             during {running}: {first}; its console: {console}; {running} and the {} binaries after it \
             ran again in a fresh boot",
            rest.len() - 1
        );
        log(&format!("RE-RUN: {note}"));
        eprintln!("{oops}");
        self.rxe_rerun = Some(note);
        let list = write_list(&self.root, &list_name.replace(".list", "-rerun.list"), rest)?;
        let args = ["run", "--kernel", kernel, "--timeout", VM_TIMEOUT_S, "--", &run_tests, &list];
        self.tee_output("scripts/softroce", &args, &GUEST_CONSOLE).0
    }

    /// Runs a command, its stdout and stderr both to the terminal and to the results log.
    fn tee(&mut self, program: &str, args: &[&str], env: &[(&str, &str)]) -> Step {
        self.tee_output(program, args, env).0
    }

    /// [`Run::tee`], returning the command's output lines too.
    fn tee_output(&mut self, program: &str, args: &[&str], env: &[(&str, &str)]) -> (Step, Vec<String>) {
        let mut output = Vec::new();
        let result = self.tee_into(program, args, env, &mut output);
        (result, output)
    }

    fn tee_into(&mut self, program: &str, args: &[&str], env: &[(&str, &str)], output: &mut Vec<String>) -> Step {
        let program = if program == "cargo" {
            std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
        } else {
            program.to_owned()
        };
        let inner = self.command(&program, args, env);
        // Both streams into one pipe, in order: through the shell's `2>&1`.
        let mut c = Command::new("bash");
        c.arg("-c").arg("exec \"$@\" 2>&1").arg("--").arg(inner.get_program()).args(inner.get_args());
        c.current_dir(&self.root).env_remove("LIBCLANG_PATH").stdout(Stdio::piped());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        let mut child = c.spawn().map_err(|e| format!("{program}: {e}"))?;
        let out = child.stdout.take().expect("piped");
        let mut stdout = std::io::stdout();
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| e.to_string())?;
            let _ = writeln!(stdout, "{line}");
            writeln!(self.results, "{line}").map_err(|e| e.to_string())?;
            output.push(line);
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{program} {} ({status})", args.join(" ")));
        }
        Ok(())
    }

    /// The newest-deps step: the workspace's sources (not `target`, not `.git`) copied into the
    /// target directory, their lock updated to the newest semver-compatible version of every
    /// dependency (`cargo update`, which prints each change), then clippy `-D warnings` on every
    /// target and the host tests there: the unit tests, the integration tests that are not
    /// device tests (those only skip on the host: clippy checks them, and building them cost a
    /// minute) or compile-fail tests (see `host_integration_tests`), and the doctests. The builds share the main target directory, so a dependency
    /// the update left alone is not built again. A user who runs `cargo add` gets these
    /// versions, not the lock's: a deprecation or a break in one shows here first. The
    /// committed lock (kept at versions the MSRV builds) is not touched.
    fn newest_deps(&self) -> Step {
        let scratch = target_dir(&self.root).join("newest-deps");
        let _ = std::fs::remove_dir_all(&scratch);
        let src = scratch.join("src");
        copy_sources(&self.root, &src, &target_dir(&self.root))?;
        let target = target_dir(&self.root);
        let target = target.to_str().ok_or("a non-UTF-8 target directory")?.to_owned();
        let env =
            [("CARGO_TARGET_DIR", target.as_str()), ("RDMA_LAYOUT_REQUIRED", "1"), ("RDMA_TEST_REQUIRE_DEVICE", "")];
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let in_copy = |args: &[&str]| -> Step {
            let mut c = self.command(&cargo, args, &env);
            c.current_dir(&src);
            let status = c.status().map_err(|e| format!("{cargo}: {e}"))?;
            if !status.success() {
                return Err(format!("with the newest dependencies, cargo {} failed ({status})", args.join(" ")));
            }
            Ok(())
        };
        in_copy(&["update"])?;
        in_copy(
            &[&["clippy", "--workspace", "--all-targets"][..], &TESTED_FEATURES, &["--", "-D", "warnings"]].concat(),
        )?;
        let host: Vec<String> =
            host_integration_tests(&src)?.into_iter().flat_map(|t| ["--test".to_owned(), t]).collect();
        let host: Vec<&str> = host.iter().map(String::as_str).collect();
        in_copy(&[&["test", "--workspace", "--lib", "--bins"][..], &host, &TESTED_FEATURES].concat())?;
        in_copy(&[&["test", "--workspace", "--doc"][..], &TESTED_FEATURES].concat())?;
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(())
    }

    /// `cargo package` of each library crate, built from its `.crate`.
    ///
    /// Path dependencies between the crates resolve through cargo's temporary local registry,
    /// whose unpacked sources and builds cargo keeps by name and version, so a package check
    /// would compile against an earlier run's crates: both are removed first (the checks build
    /// in a target directory of their own, so the main one stays warm).
    fn package(&self) -> Step {
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .ok_or("neither CARGO_HOME nor HOME is set")?;
        if let Ok(registries) = std::fs::read_dir(cargo_home.join("registry/src")) {
            for registry in registries.flatten() {
                if !registry.file_name().to_string_lossy().starts_with('-') {
                    continue;
                }
                for krate in std::fs::read_dir(registry.path()).into_iter().flatten().flatten() {
                    if krate.file_name().to_string_lossy().starts_with("rdma-") {
                        let _ = std::fs::remove_dir_all(krate.path());
                    }
                }
            }
        }
        let target = target_dir(&self.root).join("package-check");
        let target = target.to_str().ok_or("a non-UTF-8 target directory")?;
        let env = [("CARGO_TARGET_DIR", target)];
        let each: Vec<&str> = PUBLISHED.iter().flat_map(|p| ["-p", p]).collect();
        let _ =
            self.command("cargo", &[&["clean", "--quiet"][..], &each].concat(), &env).stderr(Stdio::null()).status();
        let exclude = ["--exclude", "testkit", "--exclude", "rdma-tools", "--exclude", "xtask"];
        let checked = self.cargo(
            &[&["package", "--workspace"][..], &exclude, &["--locked", "--allow-dirty", "--quiet"]].concat(),
            &env,
        );
        // Only this check reads it (each run cleans it first): its space goes back to the builds.
        let _ = std::fs::remove_dir_all(target);
        checked
    }
}

#[cfg(test)]
mod tests {
    //! `Run::vm`'s handling of a guest that dies, end to end but for the VM: a stand-in
    //! `scripts/softroce` follows a plan (one line per call: `rxe` dies in an oops through rxe
    //! while the list's second binary runs, `other` dies in an oops outside it, `boot` dies
    //! before `run-tests` started anything, `ok` passes),
    //! prints what the real one prints (`run-tests`' "--- device tests: NAME" lines, then the
    //! kept console's line) and exits 125 as it does for a guest that died. The real script's
    //! side (console kept, exit 125) was seen with a real panic (`docs/testing.md`).
    use super::*;

    const STAND_IN: &str = r#"#!/usr/bin/env bash
set -eu
dir=$(cd "$(dirname "$0")/.." && pwd)
list=${!#}
n=$(cat "$dir/calls" 2>/dev/null | wc -l)
echo "$list" >>"$dir/calls"
cp "$list" "$dir/list-$n"
mode=$(sed -n "$((n + 1))p" "$dir/plan")
oops() {
    echo "[ 10.1] BUG: unable to handle page fault for address: ffff9b5a1ca30000"
    echo "[ 10.2] Call Trace:"
    echo "[ 10.3]  $1"
    echo "[ 10.4] Modules linked in: rdma_rxe ib_uverbs ib_core veth"
    echo "[ 10.5] Kernel panic - not syncing: Fatal exception in interrupt"
    echo "[ 10.6] ---[ end Kernel panic - not syncing: Fatal exception in interrupt ]---"
}
case $mode in
ok) cut -f3 "$list" | sed 's/^/--- device tests: /'; exit 0 ;;
rxe) oops "rxe_receiver+0x1cc6/0x2410 [rdma_rxe]" >"$dir/console-$n" ;;
other) oops "ext4_find_entry+0x1/0x2" >"$dir/console-$n" ;;
boot)
    oops "sched_clock_cpu+0x9/0x190" >"$dir/console-$n"
    echo "softroce: the guest's whole console is kept in $dir/console-$n"
    exit 125
    ;;
esac
head -n 2 "$list" | cut -f3 | sed 's/^/--- device tests: /'
echo "softroce: the guest's whole console is kept in $dir/console-$n"
exit 125
"#;

    /// A run whose root holds the stand-in and `plan`; its root.
    fn run_with(name: &str, plan: &str) -> (Run, PathBuf) {
        let root = std::env::temp_dir().join(format!("xtask-vm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("scripts")).unwrap();
        std::fs::create_dir_all(target_dir(&root)).unwrap();
        let softroce = root.join("scripts/softroce");
        std::fs::write(&softroce, STAND_IN).unwrap();
        std::fs::set_permissions(&softroce, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(root.join("plan"), plan).unwrap();
        let results_path = root.join("results.log");
        let results = File::create(&results_path).unwrap();
        (Run { root: root.clone(), results, results_path, rxe_rerun: None, boot_rerun: None, steps: Vec::new() }, root)
    }

    fn list() -> Vec<String> {
        ["a", "b", "c"].iter().map(|n| format!("/dir\t/exe-{n}\t{n}")).collect()
    }

    fn calls(root: &Path) -> usize {
        std::fs::read_to_string(root.join("calls")).map_or(0, |c| c.lines().count())
    }

    #[test]
    fn a_crash_in_rxe_runs_the_crashed_binary_and_the_rest_again_in_a_fresh_boot_once() {
        let (mut run, root) = run_with("rxe", "rxe\nok\nrxe\n");
        run.vm("6.12", "rxe-test.list", &list()).expect("the re-run passed");
        assert_eq!(calls(&root), 2);
        let again = std::fs::read_to_string(root.join("list-1")).unwrap();
        assert_eq!(again, "/dir\t/exe-b\tb\n/dir\t/exe-c\tc\n", "b, which crashed, and c after it");
        let note = run.rxe_rerun.clone().expect("the note for the summary");
        assert!(note.contains("during b") && note.contains("the 1 binaries after it"), "{note}");
        assert!(note.contains("BUG: unable to handle page fault") && note.contains("console-0"), "{note}");
        // Once per run: a second crash in rxe, in a later VM run of the command, fails.
        assert!(run.vm("6.1", "rxe-test-2.list", &list()).is_err());
        assert_eq!(calls(&root), 3);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Runs the list under `plan`: it must fail after `boots` calls of the stand-in, having
    /// noted a re-run only if it made one.
    fn fails_after(name: &str, plan: &str, boots: usize) {
        let (mut run, root) = run_with(name, plan);
        assert!(run.vm("6.12", &format!("{name}-test.list"), &list()).is_err());
        assert_eq!(calls(&root), boots);
        assert_eq!(run.rxe_rerun.is_some(), boots > 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_second_crash_in_the_re_run_fails() {
        fails_after("twice", "rxe\nrxe\n", 2);
    }

    #[test]
    fn a_crash_outside_rxe_fails_without_a_re_run() {
        fails_after("other", "other\nok\n", 1);
    }

    #[test]
    fn a_guest_that_dies_while_it_boots_boots_again_with_the_whole_list_once() {
        let (mut run, root) = run_with("boot", "boot\nok\nboot\n");
        run.vm("6.12", "boot-test.list", &list()).expect("the second boot passed");
        assert_eq!(calls(&root), 2);
        let again = std::fs::read_to_string(root.join("list-1")).unwrap();
        assert_eq!(again, "/dir\t/exe-a\ta\n/dir\t/exe-b\tb\n/dir\t/exe-c\tc\n", "the whole list");
        let note = run.boot_rerun.clone().expect("the note for the summary");
        assert!(note.contains("while it booted") && note.contains("console-0"), "{note}");
        assert!(run.rxe_rerun.is_none());
        // Once per run: a second death at boot, in a later VM run of the command, fails.
        assert!(run.vm("6.1", "boot-test-2.list", &list()).is_err());
        assert_eq!(calls(&root), 3);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_guest_that_dies_at_boot_twice_in_a_row_fails() {
        let (mut run, root) = run_with("boot-twice", "boot\nboot\nok\n");
        assert!(run.vm("6.12", "boot-twice-test.list", &list()).is_err());
        assert_eq!(calls(&root), 2);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_crash_in_rxe_after_a_second_boot_still_gets_its_re_run() {
        let (mut run, root) = run_with("boot-rxe", "boot\nrxe\nok\n");
        run.vm("6.12", "boot-rxe-test.list", &list()).expect("the re-run passed");
        assert_eq!(calls(&root), 3);
        assert!(run.boot_rerun.is_some() && run.rxe_rerun.is_some());
        let _ = std::fs::remove_dir_all(&root);
    }
}
