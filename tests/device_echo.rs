//! Device tests of the echo example (feature `tokio`), rxe1 (10.77.0.2) -> rxe0 (10.77.0.1): the
//! async server and the thread-per-connection server each serve many clients whose every reply
//! is checked byte for byte by the client; a client killed mid-stream is seen leaving by the
//! server, which goes on serving. Ports 7540..7549.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// The example binary, built by `cargo test --features tokio` next to this test's own binary.
fn tool() -> PathBuf {
    testkit::example("echo")
}

/// A running `echo server`; its stderr lines arrive on `lines`. Killed when dropped.
struct Server {
    child: Child,
    lines: Receiver<String>,
}

impl Server {
    /// Starts `echo server` on rxe0's address and `port` and waits until it listens.
    fn start(topo: &testkit::Topology, port: u16, args: &[&str]) -> Server {
        let addr = format!("{}:{port}", topo.server.addr);
        let mut child = Command::new(tool()).args(["server", &addr]).args(args).stderr(Stdio::piped()).spawn().unwrap();
        let err = BufReader::new(child.stderr.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                eprintln!("  server: {line}");
                let _ = tx.send(line);
            }
        });
        let server = Server { child, lines };
        server.expect("listening on", Duration::from_secs(30));
        server
    }

    /// The next line of the server's that contains `what`, within `limit`.
    fn expect(&self, what: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(_) => panic!("the server printed no line with {what:?} within {limit:?}"),
            }
        }
    }

    /// Waits (at most `limit`) for the server to exit by itself; its exit code.
    fn finish(mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "the server did not exit within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `echo client` from rxe1's address to rxe0's `port`, as a command to run.
fn client(topo: &testkit::Topology, port: u16, args: &[&str]) -> Command {
    let to = format!("{}:{port}", topo.server.addr);
    let mut c = Command::new(tool());
    c.args(["client", &to, "--from", &topo.client.addr.to_string()]).args(args);
    c
}

/// Runs a client to its end, which must be a success with the figures line.
fn run_client(topo: &testkit::Topology, port: u16, args: &[&str]) -> Output {
    let start = Instant::now();
    let out = client(topo, port, args).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("client {args:?} in {:?}: {stdout}{stderr}", start.elapsed());
    assert!(out.status.success(), "the client failed: {stderr}");
    assert!(stdout.contains("p50") && stdout.contains("msgs/s"), "no figures: {stdout}");
    out
}

/// `clients` connections of `round_trips` each against a server started with `server_args`,
/// which must then log each one's end as the peer's disconnect and exit by itself.
fn serve(port: u16, server_args: &[&str], clients: usize, client_args: &[&str]) {
    let topo = testkit::require_topology!();
    let count = clients.to_string();
    let server = Server::start(&topo, port, &[server_args, &["--count", &count]].concat());
    run_client(&topo, port, &[client_args, &["--clients", &count]].concat());
    for _ in 0..clients {
        server.expect("ended: peer disconnected", Duration::from_secs(30));
    }
    assert_eq!(server.finish(Duration::from_secs(30)), 0, "the server's exit code");
}

#[test]
fn the_async_server_serves_32_clients_of_250_round_trips() {
    serve(7540, &["--mode", "async"], 32, &["--round-trips", "250", "--mode", "async"]);
}

#[test]
fn the_threads_server_serves_8_clients_with_blocking_waits() {
    serve(7541, &["--mode", "threads"], 8, &["--round-trips", "250", "--mode", "threads"]);
}

#[test]
fn the_threads_server_serves_2_spinning_clients_with_spinning_waits() {
    let spin = ["--mode", "threads", "--wait", "spin"];
    serve(7542, &spin, 2, &[&spin[..], &["--round-trips", "300"]].concat());
}

/// A client killed (SIGKILL) mid-stream: the server logs that its peer left within 10 s, and
/// serves the next client.
fn killed_client(port: u16, mode: &str) {
    let topo = testkit::require_topology!();
    let server = Server::start(&topo, port, &["--mode", mode, "--count", "2"]);
    let mut doomed = client(&topo, port, &["--round-trips", "100000000", "--mode", mode])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = server.expect("established", Duration::from_secs(30));
    let peer = started.split_whitespace().nth(2).unwrap().trim_end_matches(':').to_owned();
    std::thread::sleep(Duration::from_millis(500));
    assert!(doomed.try_wait().unwrap().is_none(), "the client ended before it was killed");
    doomed.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    doomed.wait().unwrap();
    let ended = server.expect("ended:", Duration::from_secs(10));
    eprintln!("the server saw the killed client leave after {:?}", killed.elapsed());
    assert_eq!(ended, format!("connection from {peer} ended: peer disconnected"));
    run_client(&topo, port, &["--round-trips", "200", "--mode", mode]);
    server.expect("ended: peer disconnected", Duration::from_secs(30));
    assert_eq!(server.finish(Duration::from_secs(30)), 0, "the server's exit code");
}

#[test]
fn the_async_server_sees_a_killed_client_leave_and_serves_the_next() {
    killed_client(7543, "async");
}

#[test]
fn the_threads_server_sees_a_killed_client_leave_and_serves_the_next() {
    killed_client(7544, "threads");
}

/// The client checks every byte: a server that flips one byte of its 500th reply (hidden test
/// flag) makes it exit 1 naming the round trip.
#[cfg(feature = "fault-injection")]
#[test]
fn a_corrupted_reply_fails_the_client() {
    let topo = testkit::require_topology!();
    let _server = Server::start(&topo, 7545, &["--mode", "async", "--test-corrupt", "500"]);
    let out = client(&topo, 7545, &["--round-trips", "1000", "--mode", "async"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("client: {stderr}");
    assert_eq!(out.status.code(), Some(1), "the client's exit code");
    assert!(stderr.contains("round trip 499: the reply differs from the message at byte 63"), "{stderr}");
}
