//! Host tests of the `rdma-copy` tool (no RDMA needed): its help and its user guide
//! (docs/rdma-copy.md) list the exit codes, and on a host without RDMA it says what to do, as
//! `rdma-verbs` does.

mod cli;

use std::path::Path;

/// `--help` (and `send --help`) list every exit code of `rdma_proto::driver::exit_codes`, the
/// one place they are defined, and `recv`'s own.
#[test]
fn help_lists_every_exit_code() {
    let top = cli::rdma_copy().arg("--help").output().unwrap();
    let send = cli::rdma_copy().args(["send", "--help"]).output().unwrap();
    let recv = cli::rdma_copy().args(["recv", "--help"]).output().unwrap();
    for out in [&top, &send, &recv] {
        assert!(out.status.success(), "{}", cli::text(&out.stderr));
    }
    let (top, send, recv) = (cli::text(&top.stdout), cli::text(&send.stdout), cli::text(&recv.stdout));
    for (code, what) in rdma_proto::driver::exit_codes() {
        let line = format!("{code:>3}  {what}");
        assert!(top.contains(&line), "--help lacks {line:?}:\n{top}");
        assert!(send.contains(&line), "send --help lacks {line:?}:\n{send}");
    }
    for line in ["0  every transfer was stored", "9  a transfer failed", "128+N  stopped by signal N"] {
        assert!(top.contains(line) && recv.contains(line), "recv's codes lack {line:?}:\n{recv}");
    }
}

/// The user guide's exit-code table has a row for every code `send` gives, worded as `--help`
/// words it (both come from `rdma_proto::driver::exit_codes`), so the guide cannot fall behind.
#[test]
fn the_user_guide_lists_every_exit_code() {
    let guide = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rdma-copy.md")).unwrap();
    for (code, what) in rdma_proto::driver::exit_codes() {
        let row = format!("| {code} | {what} |");
        assert!(guide.lines().any(|l| l == row), "docs/rdma-copy.md lacks the row {row:?}");
    }
}

/// Without RDMA, `send` and `recv` exit 2 and say what `rdma-verbs` says when it finds no
/// device, not only "rdma_create_event_channel: No such device".
#[test]
fn without_rdma_send_and_recv_say_what_to_do() {
    if Path::new("/dev/infiniband/rdma_cm").exists() {
        eprintln!("skipped: this host has RDMA (/dev/infiniband/rdma_cm)");
        return;
    }
    let available = rdma_verbs::DeviceList::available().map(|l| l.names()).unwrap_or_default();
    let advice = if available.is_empty() {
        rdma_verbs::Error::NoDevice { name: None, available: vec![] }.to_string()
    } else {
        "is the rdma_ucm module loaded?".to_owned()
    };
    let dir = cli::scratch("host-no-rdma");
    std::fs::write(dir.join("f"), b"data").unwrap();
    let send = cli::rdma_copy().args(["send", "--to", "127.0.0.1"]).arg(dir.join("f")).output().unwrap();
    let recv = cli::rdma_copy().args(["recv", "--listen", "127.0.0.1", "--dir"]).arg(&*dir).output().unwrap();
    for (what, out) in [("send", send), ("recv", recv)] {
        let err = cli::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        assert!(err.contains(&advice), "{what} does not say what to do ({advice:?}): {err}");
    }
}
