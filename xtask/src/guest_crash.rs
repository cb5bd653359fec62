//! A guest kernel that died mid-run: its oops, whether rxe is in it, and what is left to run.
//!
//! `scripts/softroce` exits 125 when the VM ends without the command's status (a guest panic
//! reboots it at once) and keeps the whole guest console in a file whose path it prints. The
//! test command then reads the oops from that file. A crash whose oops runs through the
//! `rdma_rxe` module is the kernel's defect (docs/testing.md, "Known limits"): the binaries
//! that had not finished run again in a fresh boot, at most once per run of the command, and
//! the summary says so. Any other crash fails the run.

/// The line `scripts/softroce` prints before the console's path.
const KEPT: &str = "softroce: the guest's whole console is kept in ";
/// The line `scripts/guest/run-tests` prints before each binary, bench or check it starts.
const STARTS: [&str; 3] = ["--- device tests: ", "--- bench (criterion test mode): ", "--- check: "];

/// The path of the kept console, from the VM run's output.
pub(crate) fn kept_console(output: &[String]) -> Option<&str> {
    output.iter().rev().find_map(|l| l.strip_prefix(KEPT)).map(str::trim)
}

/// The oops in a guest console: from the first line that opens one (`BUG:`, `Oops`, a general
/// protection fault, or the panic itself when nothing came before it) to the panic's end
/// marker, with the console's own prefixes kept.
pub(crate) fn oops(console: &str) -> Option<String> {
    let lines: Vec<&str> = console.lines().collect();
    let opens = |l: &str| l.contains("BUG:") || l.contains("Oops") || l.contains("general protection fault");
    let first =
        lines.iter().position(|l| opens(l)).or_else(|| lines.iter().position(|l| l.contains("Kernel panic")))?;
    let end = lines[first..].iter().position(|l| l.contains("end Kernel panic")).map_or(lines.len(), |i| first + i + 1);
    Some(lines[first..end].join("\n"))
}

/// Whether an oops runs through rxe: a frame of its call trace, or its faulting instruction, is
/// in the `rdma_rxe` module (the module list, which names every loaded module, does not count).
pub(crate) fn in_rxe(oops: &str) -> bool {
    oops.lines().any(|l| !l.contains("Modules linked in") && l.contains("[rdma_rxe]"))
}

/// The name of the binary (test, bench or check) that was running when the guest died: the
/// last one `run-tests` started.
pub(crate) fn running(output: &[String]) -> Option<&str> {
    output.iter().rev().find_map(|l| STARTS.iter().find_map(|s| l.strip_prefix(s))).map(str::trim)
}

/// The lines of a `run-tests` list from the binary named `from` on: it and every one after it.
/// `None` when the list has no such binary.
pub(crate) fn remaining<'a>(list: &'a [String], from: &str) -> Option<&'a [String]> {
    let at = list.iter().position(|l| l.split('\t').nth(2) == Some(from))?;
    Some(&list[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call trace of rxe's panic on Linux 6.12.117 (in `device_resume`, docs/testing.md,
    /// Known limits) in a console as vng keeps it: timestamps, a line before the oops, and the
    /// oops's first lines, which the recorded console lacked (it was cut above `R10`), so those
    /// two are made up.
    const CONSOLE: &str = "\
[  812.114031] softroce flap: veth0 was down for 3 s
[ 1021.553811] BUG: unable to handle page fault for address: ffff9b5a1ca30000
[ 1021.554100] #PF: supervisor read access in kernel mode
[ 1021.554390] Oops: Oops: 0000 [#1] PREEMPT SMP NOPTI
[ 1021.555000] Workqueue: rxe_wq do_task [rdma_rxe]
[ 1021.555300] RIP: 0010:kmem_cache_alloc_node_noprof+0xe0/0x330
[ 1021.556000] Call Trace:
[ 1021.556100]  __alloc_skb+0x160/0x1a0
[ 1021.556200]  rxe_init_packet+0xa1/0x150 [rdma_rxe]
[ 1021.556300]  prepare_ack_packet+0x67/0x1c0 [rdma_rxe]
[ 1021.556400]  send_common_ack.isra.0+0x48/0xb0 [rdma_rxe]
[ 1021.556500]  rxe_receiver+0x1cc6/0x2410 [rdma_rxe]
[ 1021.556600] Modules linked in: rdma_rxe ib_uverbs ib_core veth
[ 1021.557000] Kernel panic - not syncing: Fatal exception in interrupt
[ 1021.557100] ---[ end Kernel panic - not syncing: Fatal exception in interrupt ]---
[ 1021.600000] reboot: machine restart
";

    #[test]
    fn the_oops_is_read_from_its_first_line_to_the_panics_end() {
        let oops = oops(CONSOLE).expect("an oops");
        assert!(oops.starts_with("[ 1021.553811] BUG: unable to handle page fault"), "{oops}");
        assert!(oops.ends_with("Fatal exception in interrupt ]---"), "{oops}");
        assert!(!oops.contains("softroce flap") && !oops.contains("reboot"), "{oops}");
        assert!(in_rxe(&oops));
    }

    #[test]
    fn a_crash_outside_rxe_is_not_rxes_even_with_the_module_loaded() {
        let console = "\
[    9.1] general protection fault, probably for non-canonical address 0xdead: 0000 [#1] SMP
[    9.2] RIP: 0010:ext4_find_entry+0x1/0x2
[    9.3] Call Trace:
[    9.4]  vfs_open+0x1/0x2
[    9.5] Modules linked in: rdma_rxe ib_uverbs ib_core veth
[    9.6] Kernel panic - not syncing: Fatal exception
[    9.7] ---[ end Kernel panic - not syncing: Fatal exception ]---
";
        let oops = oops(console).expect("an oops");
        assert!(oops.starts_with("[    9.1] general protection fault"));
        assert!(!in_rxe(&oops));
        assert_eq!(super::oops("[ 1.0] booted\n[ 2.0] shut down\n"), None);
    }

    #[test]
    fn what_remains_starts_with_the_binary_that_was_running() {
        let output: Vec<String> = [
            "--- device tests: device_flap",
            "test result: ok. 3 passed; 0 failed",
            "--- device tests: device_resume",
            "error: the VM ended without reporting the command's status (vng exit 255)",
            "softroce: the guest's whole console is kept in /r/target/softroce/console-6.12-1.log",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(running(&output), Some("device_resume"));
        assert_eq!(kept_console(&output), Some("/r/target/softroce/console-6.12-1.log"));
        let list: Vec<String> =
            ["/r\t/r/flap\tdevice_flap", "/r\t/r/resume\tdevice_resume", "/r\t/r/soak\tdevice_soak"]
                .map(String::from)
                .to_vec();
        assert_eq!(remaining(&list, "device_resume"), Some(&list[1..]));
        assert_eq!(remaining(&list, "device_other"), None);
        assert_eq!(running(&output[..2]), Some("device_flap"));
        assert_eq!(kept_console(&output[..4]), None);
    }
}
