//! Device tests: the examples' rping and rdma_server/rdma_client protocols against rdma-core's
//! own tools (rdmacm-utils), each side both ways, rxe1 (10.77.0.2) -> rxe0 (10.77.0.1).

#[path = "../examples/common/cm.rs"]
mod cm;
// The examples' own protocol code (their defaults for the command line are unused here).
#[allow(dead_code)]
#[path = "../examples/rdma_server_client/protocol.rs"]
mod rdma_msg;
#[allow(dead_code)]
#[path = "../examples/rping/protocol.rs"]
mod rping;

use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cm::BoxError;

const T: Duration = Duration::from_secs(10);
const PINGS: u32 = 10;
const SIZE: usize = 100;

/// Starts one of rdma-core's tools with its output captured.
fn spawn(tool: &str, args: &[&str]) -> Child {
    Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {tool} (rdmacm-utils): {e}"))
}

/// Waits up to `T` for a tool to exit (killing it past that), and returns its output.
fn finish(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + T;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still running after {T:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A port nobody listens on (the CM picked it a moment ago).
fn free_port(topo: &testkit::Topology) -> u16 {
    rdma_cm::Listener::bind(SocketAddr::new(topo.server.addr.into(), 0), 1).unwrap().local_addr().port()
}

/// Runs `f` until it stops failing with "no listener" (a tool still starting), up to `T`.
fn until_listening<R>(mut f: impl FnMut() -> Result<R, BoxError>) -> R {
    let deadline = Instant::now() + T;
    loop {
        match f() {
            Ok(r) => return r,
            Err(e)
                if Instant::now() < deadline
                    && matches!(e.downcast_ref::<rdma_cm::Error>(), Some(rdma_cm::Error::NoListener { .. })) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn options() -> rping::Options {
    rping::Options { size: SIZE, count: PINGS, validate: true, timeout: T }
}

fn lines_with<'a>(out: &'a Output, prefix: &'a str) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.strip_prefix(prefix)).map(str::to_owned).collect()
}

#[test]
fn our_rping_server_answers_rdma_cores_rping_client() {
    let topo = testkit::require_topology!();
    let listener = rdma_cm::Listener::bind(SocketAddr::new(topo.server.addr.into(), 0), 3).unwrap();
    let (srv, cli, port) = (topo.server.addr.to_string(), topo.client.addr.to_string(), listener.local_addr().port());
    let port = port.to_string();
    let size = SIZE.to_string();
    let count = PINGS.to_string();
    let child = spawn("rping", &["-c", "-a", &srv, "-I", &cli, "-p", &port, "-C", &count, "-S", &size, "-V", "-v"]);
    let mut seen = Vec::new();
    let answered = rping::serve(&listener, &options(), |n, data| seen.push((n, data.to_vec()))).unwrap();
    let out = finish(child, "rping -c");
    assert_eq!(answered, PINGS);
    for (n, data) in &seen {
        assert_eq!(data, &rping::ping_data(*n, SIZE), "ping {n} as READ from rping's buffer");
    }
    let echoed = lines_with(&out, "ping data: ");
    let expected: Vec<String> = (0..PINGS).map(|n| rping::text(&rping::ping_data(n, SIZE))).collect();
    assert_eq!(echoed, expected, "what rping -c -V got back and printed");
}

#[test]
fn our_rping_client_pings_rdma_cores_rping_server() {
    let topo = testkit::require_topology!();
    let port = free_port(&topo);
    let srv = topo.server.addr.to_string();
    let child = spawn("rping", &["-s", "-a", &srv, "-p", &port.to_string(), "-S", &SIZE.to_string(), "-v"]);
    let dst = SocketAddr::new(topo.server.addr.into(), port);
    let src = SocketAddr::new(topo.client.addr.into(), 0);
    let mut echoes = Vec::new();
    let done = until_listening(|| {
        echoes.clear();
        rping::client(dst, Some(src), &options(), |n, data| echoes.push((n, data.to_vec())))
    });
    let out = finish(child, "rping -s");
    assert_eq!(done, PINGS);
    assert_eq!(echoes.len(), PINGS as usize);
    for (n, data) in &echoes {
        assert_eq!(data, &rping::ping_data(*n, SIZE), "ping {n} as rping -s wrote it back");
    }
    let read = lines_with(&out, "server ping data: ");
    let expected: Vec<String> = (0..PINGS).map(|n| rping::text(&rping::ping_data(n, SIZE))).collect();
    assert_eq!(read, expected, "what rping -s READ from us and printed");
}

#[test]
fn our_client_talks_to_rdma_cores_rdma_server_three_times() {
    let topo = testkit::require_topology!();
    let dst_ip = topo.server.addr.to_string();
    let src = SocketAddr::new(topo.client.addr.into(), 0);
    for round in 0..3 {
        let port = free_port(&topo);
        let child = spawn("rdma_server", &["-s", &dst_ip, "-p", &port.to_string()]);
        let mut msg = [0u8; rdma_msg::MSG_LEN];
        msg[0] = round;
        let dst = SocketAddr::new(topo.server.addr.into(), port);
        let reply = until_listening(|| rdma_msg::client(dst, Some(src), &msg, T));
        let out = finish(child, "rdma_server");
        // rdma_server answers with its static, zero-filled send buffer.
        assert_eq!(reply, [0u8; rdma_msg::MSG_LEN], "round {round}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("rdma_server: end 0"), "round {round}");
    }
}

#[test]
fn our_server_answers_rdma_cores_rdma_client_three_times() {
    let topo = testkit::require_topology!();
    let listener = rdma_cm::Listener::bind(SocketAddr::new(topo.server.addr.into(), 0), 3).unwrap();
    let (srv, port) = (topo.server.addr.to_string(), listener.local_addr().port().to_string());
    let reply = *b"rdma-rs answers\0";
    std::thread::scope(|s| {
        let server = s.spawn(|| (0..3).map(|_| rdma_msg::serve(&listener, &reply, T).unwrap()).collect::<Vec<_>>());
        for round in 0..3 {
            let out = finish(spawn("rdma_client", &["-s", &srv, "-p", &port]), "rdma_client");
            assert!(String::from_utf8_lossy(&out.stdout).contains("rdma_client: end 0"), "round {round}");
        }
        let received = server.join().unwrap();
        // rdma_client sends its static, zero-filled send buffer.
        assert_eq!(received, vec![[0u8; rdma_msg::MSG_LEN]; 3]);
    });
}
