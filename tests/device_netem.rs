//! Device tests: a 16 MiB `rdma-copy` transfer over an impaired wire. netem on
//! both ends of the veth pair (rxe1 10.77.0.2 sends to rxe0 10.77.0.1) loses 1% of the packets,
//! or reorders a quarter of them; the file must arrive identical, as over a clean wire. Each
//! case prints its time and data-phase throughput, the packets netem dropped or reordered, and
//! what rxe counted (retransmissions, sequence errors), beside a clean run's.

mod cli;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli::*;

/// 4,096 packets of 4 KiB each way: enough for 1% loss and a reordering wire to make rxe go
/// back N dozens of times (64 MiB took 67 s of a test run under reordering, for no more cover).
const SIZE: usize = 16 << 20;
const DEVS: [&str; 2] = ["veth0", "veth1"];

/// Every counter of each rxe port (`/sys/class/infiniband/<dev>/ports/1/hw_counters`), as
/// "<dev> <name>" and value.
fn rxe_counters(topo: &testkit::Topology) -> Vec<(String, u64)> {
    let mut v = Vec::new();
    for e in topo.endpoints() {
        let dir = format!("/sys/class/infiniband/{}/ports/1/hw_counters", e.device);
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let entry = entry.unwrap();
            if let Some(n) = std::fs::read_to_string(entry.path()).ok().and_then(|s| s.trim().parse().ok()) {
                v.push((format!("{} {}", e.device, entry.file_name().to_string_lossy()), n));
            }
        }
    }
    v.sort();
    v
}

/// The counters that changed between `before` and `after`, with their increase, except the
/// plain packet counts.
fn changed(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let mut out = Vec::new();
    for (k, a) in after {
        let b = before.iter().find(|(n, _)| n == k).map_or(0, |(_, b)| *b);
        let plain = ["sent_pkts", "rcvd_pkts", "rdma_sends", "rdma_recvs"].iter().any(|p| k.ends_with(p));
        if *a != b && !plain {
            out.push(format!("{k} +{}", a - b));
        }
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(", ")
    }
}

/// What netem did on each device so far: the "Sent ... (dropped ...)" line of `tc -s qdisc`.
fn netem_stats() -> String {
    DEVS.iter()
        .map(|dev| {
            let out = Command::new("tc").args(["-s", "qdisc", "show", "dev", dev]).output().unwrap();
            let s = text(&out.stdout);
            let sent = s.lines().find(|l| l.trim_start().starts_with("Sent")).unwrap_or("").trim().to_string();
            format!("{dev}: {sent}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// "R MB/s (data phase)" of a sender's report.
fn data_rate(report: &str) -> Option<f64> {
    report.split(" MB/s (data phase)").next()?.rsplit(' ').next()?.parse().ok()
}

/// Sends `file` (16 MiB) to a receiver on `port` (`--count 1`) and checks the outcome: stored
/// identical and the receiver's verdict ok. Prints the time, the data-phase rate and what rxe
/// and netem counted, labelled `case`.
fn transfer(topo: &testkit::Topology, port: u16, file: &Path, data: &[u8], case: &str) {
    let dst = scratch(&format!("netem-dst-{port}"));
    let rx = Receiver::start(topo, port, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let before = rxe_counters(topo);
    let t = Instant::now();
    let child = cli::rdma_copy()
        .args(["send", "--quiet", "--to", &format!("{}:{port}", topo.server.addr)])
        .args(["--from", &topo.client.addr.to_string(), "--timeout", SEND_TIMEOUT_S])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let took = t.elapsed();
    let report = text(&out.stdout);
    let (rcode, rreport) = rx.finish(Duration::from_secs(60));
    let counted = changed(&before, &rxe_counters(topo));
    let rate = data_rate(&report).map_or("-".into(), |r| format!("{r:.1}"));
    eprintln!(
        "netem {case}: 16 MiB in {took:.2?}, {rate} MB/s (data phase), sender exit {:?}\n  rxe counters: {counted}\n  \
         netem: {}\n  sender: {}{}  receiver: {}",
        out.status.code(),
        netem_stats(),
        report.trim(),
        text(&out.stderr),
        rreport.trim()
    );
    assert!(out.status.success(), "{case}: the sender failed: {}", text(&out.stderr));
    assert_eq!(rcode, 0, "{case}: {rreport}");
    let got = std::fs::read(dst.join(file.file_name().unwrap())).unwrap();
    assert!(got == data, "{case}: {} bytes arrived, {} sent, content differs", got.len(), data.len());
}

/// The reference for the impaired cases below: the same 16 MiB over the clean wire.
#[test]
fn a_16_mib_transfer_completes_over_a_clean_wire() {
    let topo = testkit::require_topology!();
    let src = scratch("netem-clean");
    let data = random_file(&src.join("f"), SIZE, 1);
    transfer(&topo, 7595, &src.join("f"), &data, "clean");
}

/// 1% of the packets lost each way (data, ACKs, CM messages): users on a lossy link rely on RC's
/// retransmission and rdma-copy's timeouts letting the transfer finish, identical.
#[test]
fn a_16_mib_transfer_completes_over_a_wire_that_loses_1_percent() {
    let topo = testkit::require_topology!();
    let src = scratch("netem-loss");
    let data = random_file(&src.join("f"), SIZE, 2);
    let _netem = Netem::new(&DEVS, &["loss", "1%"]);
    transfer(&topo, 7596, &src.join("f"), &data, "loss 1%");
}

/// A quarter of the packets overtake the rest each way: netem delays every packet 1 ms except
/// 25% (with 50% correlation) sent at once. Reordering needs the delay: without it nothing
/// waits to be overtaken.
#[test]
fn a_16_mib_transfer_completes_over_a_wire_that_reorders() {
    let topo = testkit::require_topology!();
    let src = scratch("netem-reorder");
    let data = random_file(&src.join("f"), SIZE, 3);
    let _netem = Netem::new(&DEVS, &["delay", "1ms", "reorder", "25%", "50%"]);
    transfer(&topo, 7597, &src.join("f"), &data, "delay 1ms reorder 25% 50%");
}
