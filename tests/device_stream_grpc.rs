//! Device tests of gRPC over RDMA streams (feature `stream-ecosystem`), rxe1 (10.77.0.2) ->
//! rxe0 (10.77.0.1): a tonic server serves the connections of `rdma_stream::tonic::Incoming`,
//! a tonic channel connects through `rdma_stream::hyper::Connector`, and every byte of every
//! answer is checked. The service is the grpc example's (examples/common/grpc.rs). Ports
//! 7760..7769.

// tonic's handlers and interceptors return `Result<_, tonic::Status>`: the size of its error
// is tonic's to choose.
#![allow(clippy::result_large_err)]

#[path = "../examples/common/grpc.rs"]
mod grpc;
#[path = "../examples/common/pattern.rs"]
mod pattern;

use std::future::Future;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grpc::{EchoClient, EchoServer, StreamRequest};
use pattern::pattern;
use rdma_stream::hyper::Connector;
use rdma_stream::tonic::Incoming;
use rdma_stream::Listener;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Endpoint, Server};

/// The longest any one step may take.
const T: Duration = Duration::from_secs(30);

/// The server's address at `port`, and the client's address to connect from.
fn addrs(topo: &testkit::Topology, port: u16) -> (SocketAddr, SocketAddr) {
    (SocketAddr::new(topo.server.addr.into(), port), SocketAddr::new(topo.client.addr.into(), 0))
}

/// Runs `f` on a current-thread runtime with IO and time, failing after twice `T`.
fn run<F: Future<Output = ()>>(f: F) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { tokio::time::timeout(2 * T, f).await.expect("the test did not finish in time") });
}

/// A tonic server of the echo service on `addr`, recording each call's `remote_addr`; it stops
/// (after its calls in progress) when `stop` is sent.
struct Serving {
    peers: Arc<Mutex<Vec<Option<SocketAddr>>>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Serving {
    fn start(addr: SocketAddr) -> Serving {
        let incoming = Incoming::new(Listener::bind(addr).unwrap());
        let peers = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&peers);
        let record = move |request: tonic::Request<()>| {
            seen.lock().unwrap().push(request.remote_addr());
            Ok(request)
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = Server::builder().add_service(InterceptedService::new(EchoServer, record));
        let task = tokio::spawn(server.serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        }));
        Serving { peers, stop, task }
    }

    /// Stops the server; the peer address of each call it answered.
    async fn finish(self) -> Vec<Option<SocketAddr>> {
        self.stop.send(()).unwrap();
        tokio::time::timeout(T, self.task).await.expect("the server did not stop").unwrap().expect("the server failed");
        let peers = self.peers.lock().unwrap();
        peers.clone()
    }
}

/// A client of the echo service at `server`, connected from `from`.
async fn client(server: SocketAddr, from: SocketAddr) -> EchoClient {
    let endpoint = Endpoint::from_shared(format!("http://{server}")).unwrap().connect_timeout(T).timeout(T);
    let channel = endpoint.connect_with_connector(Connector::new().local_address(Some(from))).await.unwrap();
    EchoClient::new(channel)
}

#[test]
fn a_unary_call_and_a_server_streaming_call_carry_1_mib_messages_intact() {
    let topo = testkit::require_topology!();
    let (server, from) = addrs(&topo, 7760);
    run(async {
        let serving = Serving::start(server);
        let mut client = client(server, from).await;

        let start = Instant::now();
        let sent = pattern(1 << 20, 1);
        let echoed = client.unary(sent.clone()).await.unwrap();
        assert_eq!(echoed.len(), sent.len(), "the unary answer's length");
        assert!(echoed == sent, "the unary answer differs from the request");
        eprintln!("unary 1 MiB: {:?}", start.elapsed());

        let start = Instant::now();
        let mut stream = client.stream(StreamRequest { count: 8, size: 1 << 20, seed: 100 }).await.unwrap();
        let mut received = 0u64;
        while let Some(message) = stream.message().await.unwrap() {
            assert!(message.data == pattern(1 << 20, 100 + received), "streamed message {received} differs");
            received += 1;
        }
        assert_eq!(received, 8, "the streamed messages");
        eprintln!("stream of 8 x 1 MiB: {:?}", start.elapsed());

        drop(client);
        let peers = serving.finish().await;
        assert_eq!(peers.len(), 2, "the calls the server saw");
        for peer in peers {
            let peer = peer.expect("tonic's remote_addr, from the stream's Connected");
            assert_eq!(peer.ip(), from.ip(), "the peer address of a call");
        }
    });
}

#[test]
fn sixteen_concurrent_unary_calls_share_one_channel() {
    let topo = testkit::require_topology!();
    let (server, from) = addrs(&topo, 7761);
    run(async {
        let serving = Serving::start(server);
        let client = client(server, from).await;
        let calls: Vec<_> = (0..16u64)
            .map(|i| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let sent = pattern(64 << 10, 1000 + i);
                    let echoed = client.unary(sent.clone()).await.unwrap();
                    assert!(echoed == sent, "call {i}'s answer differs from its request");
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        drop(client);
        assert_eq!(serving.finish().await.len(), 16, "the calls the server saw");
    });
}

/// What a tonic user sees when nothing listens: the channel's connect fails with the
/// connector's "connection refused" in its sources, at once rather than at the connect timeout.
#[test]
fn a_channel_to_an_address_nothing_listens_on_fails_at_once() {
    let topo = testkit::require_topology!();
    let (server, from) = addrs(&topo, 7763);
    run(async {
        let start = Instant::now();
        let endpoint = Endpoint::from_shared(format!("http://{server}")).unwrap().connect_timeout(T);
        let connector = Connector::new().local_address(Some(from));
        let error = endpoint.connect_with_connector(connector).await.expect_err("a channel to nothing connected");
        let took = start.elapsed();
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
        let io = std::iter::from_fn(|| {
            let this = source?;
            source = this.source();
            Some(this)
        })
        .find_map(|e| e.downcast_ref::<std::io::Error>());
        let io = io.unwrap_or_else(|| panic!("no io::Error among the sources of {error:?}"));
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused, "{io}");
        assert!(took < Duration::from_secs(5), "the refusal took {took:?}");
    });
}

/// The example's server process; killed when dropped (a failed test leaves none behind).
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The example binaries, as a user runs them: the client's checks pass, the server logs each
/// call with the client's address and exits by itself after `--count` calls.
#[test]
fn the_grpc_example_serves_its_client() {
    let topo = testkit::require_topology!();
    let (server, from) = addrs(&topo, 7762);
    let tool = testkit::example("grpc");
    let mut child = Command::new(&tool)
        .args(["server", &server.to_string(), "--count", "2"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut child = Process(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stderr).map_while(Result::ok) {
            eprintln!("  server: {line}");
            let _ = tx.send(line);
        }
    });
    let first = lines.recv_timeout(T).expect("the server printed nothing");
    assert!(first.contains("listening on"), "the server's first line: {first}");

    let out = Command::new(&tool)
        .args(["client", &server.to_string(), "--from", &from.ip().to_string(), "--size", "262144", "--messages", "4"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("client: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("all bytes checked"), "the client failed");

    let deadline = Instant::now() + T;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit after its --count calls");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the server's exit: {status}");
    let calls = format!("call from Some({}:", from.ip());
    let logged = std::iter::from_fn(|| lines.recv_timeout(Duration::from_secs(5)).ok());
    assert_eq!(logged.filter(|l| l.contains(&calls)).count(), 2, "the calls logged with the client's address");
}
