//! Device tests: the receiver touches nothing outside its destination, whatever a local user
//! plants in it, and works on file systems without `RENAME_NOREPLACE`.
//! `rdma-copy recv` as documented, a local user acting between two sends as an attacker would.

mod cli;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::*;

/// Leaves a partial of `file` at the receiver `rx` (port `port`, storing in `dst`): the sender
/// is killed once 4 MiB are kept, and the receiver's session has ended (its report line
/// printed: it writes the partial's last checkpoint after it saw the sender go, so a name
/// planted before then could meet its own writes). Returns the partial's key.
fn leave_partial(topo: &testkit::Topology, rx: &Receiver, port: u16, file: &Path, dst: &Path) -> String {
    let mut sender = spawn_send_reporting(topo, port, file, &[]);
    wait_for_partial(dst, 4 << 20);
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(dst, "f");
    let t = Instant::now();
    while rx.reports_so_far().lines().count() == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the killed sender's session never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    let part = listing(dst).into_iter().find(|n| n.ends_with(".part.rdcp-tmp")).expect("a partial was kept");
    part.trim_start_matches('.').split('.').next().unwrap().to_owned()
}

#[test]
fn links_planted_at_a_partial_s_names_are_not_followed_and_the_file_arrives() {
    let topo = testkit::require_topology!();
    let (src, dst, outside) = (scratch("plant-src"), scratch("plant-dst"), scratch("plant-out"));
    let data = random_file(&src.join("f"), 24 << 20, 33);
    let (victim, victim_meta) = (outside.join("root-only"), outside.join("root-only-2"));
    for v in [&victim, &victim_meta] {
        std::fs::write(v, b"precious").unwrap();
        std::fs::set_permissions(v, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    // The local user here is root: a partial is kept only in a directory no other user may
    // write (where one may, transfers are served from plain temporaries).
    let dir = dst.to_str().unwrap();
    let rx =
        Receiver::start(&topo, 7640, &["--dir", dir, "--count", "2", "--timeout", "5", "--checkpoint-every", "2M"]);
    let key = leave_partial(&topo, &rx, 7640, &src.join("f"), &dst);
    // The local user replaces the partial's data and the sidecar's new name by links.
    let (part, meta_new) = (dst.join(format!(".{key}.part.rdcp-tmp")), dst.join(format!(".{key}.meta-new.rdcp-tmp")));
    std::fs::remove_file(&part).unwrap();
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    std::os::unix::fs::symlink(&victim_meta, &meta_new).unwrap();
    let out = spawn_send_reporting(&topo, 7640, &src.join("f"), &[]).wait_with_output().unwrap();
    let (code, lines) = rx.finish(Duration::from_secs(60));
    assert!(out.status.success(), "{}{lines}", text(&out.stderr));
    assert!(matches!(code, 0 | 9), "{lines}");
    for v in [&victim, &victim_meta] {
        let now = std::fs::read(v).unwrap();
        assert!(now == b"precious", "{}: written through a planted link ({} bytes now)", v.display(), now.len());
    }
    let stored = dst.join("f");
    assert!(stored.symlink_metadata().unwrap().file_type().is_file(), "the file is a file, not the planted link");
    assert!(std::fs::read(&stored).unwrap() == data, "the verdict was Ok: the file is the sender's");
    assert!(listing(&dst).iter().all(|n| !n.ends_with(".rdcp-tmp")), "{:?}", listing(&dst));
}

#[test]
fn a_hard_link_planted_at_a_partial_s_name_is_not_written_through() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hard-src"), scratch("hard-dst"));
    let data = random_file(&src.join("f"), 24 << 20, 34);
    let dir = dst.to_str().unwrap();
    let rx =
        Receiver::start(&topo, 7641, &["--dir", dir, "--count", "2", "--timeout", "5", "--checkpoint-every", "2M"]);
    let key = leave_partial(&topo, &rx, 7641, &src.join("f"), &dst);
    // The victim lives in the destination's file system (a hard link cannot leave it).
    let victim = dst.join("victim-file");
    std::fs::write(&victim, b"precious").unwrap();
    let part = dst.join(format!(".{key}.part.rdcp-tmp"));
    std::fs::remove_file(&part).unwrap();
    std::fs::hard_link(&victim, &part).unwrap();
    let out = spawn_send_reporting(&topo, 7641, &src.join("f"), &[]).wait_with_output().unwrap();
    let (code, lines) = rx.finish(Duration::from_secs(60));
    assert!(out.status.success() && matches!(code, 0 | 9), "{}{lines}", text(&out.stderr));
    let now = std::fs::read(&victim).unwrap();
    assert!(now == b"precious", "written through a planted hard link ({} bytes now)", now.len());
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
}

/// Something a local user put at a partial's name that the receiver cannot remove (a
/// directory with a file in it; in a sticky destination, anything of theirs) does not fail
/// later sends of that file with a disk I/O verdict: such a send is served from the start in a
/// plain temporary, and the planted directory is left alone.
#[test]
fn a_directory_planted_at_a_partial_s_name_does_not_fail_the_send() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("plantdir-src"), scratch("plantdir-dst"));
    let data = random_file(&src.join("f"), 24 << 20, 37);
    let dir = dst.to_str().unwrap();
    let rx =
        Receiver::start(&topo, 7647, &["--dir", dir, "--count", "2", "--timeout", "5", "--checkpoint-every", "2M"]);
    let key = leave_partial(&topo, &rx, 7647, &src.join("f"), &dst);
    let part = dst.join(format!(".{key}.part.rdcp-tmp"));
    std::fs::remove_file(&part).unwrap();
    let _ = std::fs::remove_file(dst.join(format!(".{key}.meta.rdcp-tmp")));
    std::fs::create_dir(&part).unwrap();
    std::fs::write(part.join("mine"), b"a local user's").unwrap();
    let out = spawn_send_reporting(&topo, 7647, &src.join("f"), &[]).wait_with_output().unwrap();
    let (code, lines) = rx.finish(Duration::from_secs(60));
    assert!(out.status.success(), "a directory at the partial's name failed the send: {}{lines}", text(&out.stderr));
    assert!(matches!(code, 0 | 9), "{lines}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    assert_eq!(std::fs::read(part.join("mine")).unwrap(), b"a local user's");
}

/// The harness's share with the host (`$SOFTROCE_OUT`, a 9p mount in the guest): Linux's 9p
/// refuses `renameat2(RENAME_NOREPLACE)` with `EINVAL`.
fn nine_p_share(name: &str) -> std::path::PathBuf {
    let out = std::env::var("SOFTROCE_OUT").expect("the harness exports SOFTROCE_OUT (its share with the host)");
    let d = Path::new(&out).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_9p_share_without_rename_noreplace_takes_files_and_batches() {
    let topo = testkit::require_topology!();
    let src = scratch("9p-src");
    let dst = nine_p_share("9p-dst");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let out_dir = std::env::var("SOFTROCE_OUT").unwrap();
    assert!(mounts.lines().any(|l| l.contains(&format!(" {out_dir} ")) && l.contains(" - 9p ")), "not 9p: {mounts}");
    let data = random_file(&src.join("f"), 3 << 20, 35);
    std::fs::create_dir_all(src.join("tree/sub")).unwrap();
    random_file(&src.join("tree/sub/g"), 100_000, 36);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7642, &["--dir", dir, "--count", "3", "--timeout", "10"]);
    let one = send(&topo, 7642, &[src.join("f").to_str().unwrap()]);
    let batch = send(&topo, 7642, &[src.join("tree").to_str().unwrap()]);
    // Never replaced: the same name again, with other bytes (the same size: the receiver hashes
    // the file in place and the sender's proof fails), is refused as existing, and the file stays.
    std::fs::create_dir_all(src.join("other")).unwrap();
    random_file(&src.join("other/f"), 3 << 20, 37);
    let again = send(&topo, 7642, &[src.join("other/f").to_str().unwrap()]);
    let (code, lines) = rx.finish(Duration::from_secs(60));
    assert!(one.status.success(), "{}{lines}", text(&one.stderr));
    assert!(batch.status.success(), "{}{}{lines}", text(&batch.stdout), text(&batch.stderr));
    assert_eq!(again.status.code(), Some(17), "Exists: {}{lines}", text(&again.stderr));
    assert_eq!(code, 9, "one of three failed: {lines}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    assert_eq!(std::fs::read(dst.join("tree/sub/g")).unwrap(), std::fs::read(src.join("tree/sub/g")).unwrap());
    assert!(listing(&dst).iter().all(|n| !n.ends_with(".rdcp-tmp")), "{:?}", listing(&dst));
    std::fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn a_destination_that_cannot_take_files_is_refused_at_start_with_its_cause() {
    let topo = testkit::require_topology!();
    let scratch = scratch("dest-bad");
    std::fs::write(scratch.join("file"), b"x").unwrap();
    let read_only = scratch.join("ro");
    std::fs::create_dir(&read_only).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "ro,size=1m", "tmpfs"]).arg(&read_only).status();
    assert!(mounted.unwrap().success(), "mounting a read-only tmpfs (the harness runs as root)");
    for (dir, cause) in [
        (scratch.join("missing"), "No such file or directory"),
        (scratch.join("file"), "Not a directory"),
        (read_only.clone(), "Read-only file system"),
    ] {
        let listen = format!("{}:7643", topo.server.addr);
        let child = cli::rdma_copy()
            .args(["recv", "--no-auth", "--listen", &listen, "--count", "1", "--dir"])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (code, err, _) = wait_within(child, Duration::from_secs(20), "a receiver with a bad destination");
        assert_eq!(code, Some(5), "{}: {err}", dir.display());
        assert!(err.contains(cause) && err.contains(dir.to_str().unwrap()), "{}: {err}", dir.display());
        assert!(!err.contains("listening on"), "{err}: it must not listen");
    }
    let _ = Command::new("umount").arg(&read_only).status();
}

#[test]
fn an_existing_directory_keeps_its_mode_even_when_overwriting() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("dirmode-src"), scratch("dirmode-dst"));
    std::fs::create_dir_all(src.join("top/new")).unwrap();
    std::fs::write(src.join("top/f"), b"x").unwrap();
    std::fs::set_permissions(src.join("top"), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(src.join("top/new"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::create_dir(dst.join("top")).unwrap();
    std::fs::set_permissions(dst.join("top"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7644, &["--dir", dir, "--count", "2", "--overwrite"]);
    let out = send(&topo, 7644, &["--preserve", src.join("top").to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&dst.join("top")), 0o700, "an existing directory was opened up");
    assert_eq!(mode(&dst.join("top/new")), 0o750, "a new one takes the sender's mode under --preserve");
    // Without --preserve, a new directory gets the receiver's own mode (0777 less its umask).
    std::fs::remove_dir_all(dst.join("top")).unwrap();
    std::fs::set_permissions(src.join("top/new"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = send(&topo, 7644, &[src.join("top").to_str().unwrap()]);
    let (code, lines) = rx.finish(Duration::from_secs(30));
    assert!(out.status.success() && code == 0, "{}{lines}", text(&out.stderr));
    let umask = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Umask:").map(|m| u32::from_str_radix(m.trim(), 8).unwrap()))
        .unwrap();
    assert_eq!((mode(&dst.join("top")), mode(&dst.join("top/new"))), (0o777 & !umask, 0o777 & !umask));
}

/// `recv` defaults to `--dir .`: run from a home directory, any sender (or, on loopback without
/// a secret, any local user) could store `.ssh/authorized_keys` or `.profile` there and get a
/// shell as the receiver's user. `rdma-copy recv` therefore refuses hidden names
/// at the top of its directory, through the library's policy hook (`ReceiveOptions::policy`),
/// unless given `--allow-hidden`; hidden names deeper in a tree (a `.gitignore`) are stored.
#[test]
fn hidden_names_at_the_top_are_refused_unless_allowed_and_deeper_ones_are_stored() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hidden-src"), scratch("hidden-dst"));
    random_file(&src.join(".profile"), 100, 61);
    std::fs::create_dir_all(src.join(".ssh")).unwrap();
    random_file(&src.join(".ssh/authorized_keys"), 100, 62);
    std::fs::create_dir_all(src.join("repo")).unwrap();
    let ignore = random_file(&src.join("repo/.gitignore"), 10, 63);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7645, &["--dir", dir, "--count", "3"]);
    let out = send(&topo, 7645, &[src.join(".profile").to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(16), "a hidden name is a bad name: {err}");
    assert!(err.contains("hidden names at the top of the receiver's directory are refused"), "{err}");
    let out = send(&topo, 7645, &[src.join(".ssh").to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let out = send(&topo, 7645, &[src.join("repo").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    eprintln!("{report}");
    assert_ne!(code, 0, "{report}");
    assert_eq!(listing(&dst), ["repo"], "nothing hidden at the top");
    assert!(std::fs::read(dst.join("repo/.gitignore")).unwrap() == ignore);

    // With --allow-hidden, the receiver's administrator takes them.
    let rx = Receiver::start(&topo, 7646, &["--dir", dir, "--count", "1", "--allow-hidden"]);
    let out = send(&topo, 7646, &[src.join(".profile").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{report}");
    assert!(dst.join(".profile").exists());
}
