//! Device tests of HTTP over RDMA streams (feature `stream-ecosystem`), rxe1 (10.77.0.2) ->
//! rxe0 (10.77.0.1): hyper-util's server answers HTTP/1.1 and HTTP/2 on the streams a
//! `rdma_stream::Listener` accepts; hyper-util's pooled client (through
//! `rdma_stream::hyper::Connector`) and hyper's one-connection clients POST 1 MiB bodies and
//! check every byte of the 1 MiB answers. The server is the http example's
//! (examples/common/http.rs). Ports 7770..7779.

#[path = "../examples/common/http.rs"]
mod http;
#[path = "../examples/common/pattern.rs"]
mod pattern;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use pattern::pattern;
use rdma_stream::{Listener, Stream};

/// The longest any one step may take.
const T: Duration = Duration::from_secs(30);
/// Each request's body, and so each answer's.
const SIZE: usize = 1 << 20;

/// Runs `f` on a current-thread runtime with IO and time, with the echo server on rxe0's
/// `port`; `f` gets the server's address and the client's address to connect from.
fn with_server<F: Future<Output = ()>>(port: u16, f: impl FnOnce(SocketAddr, SocketAddr) -> F) {
    let topo = testkit::require_topology!();
    let server = SocketAddr::new(topo.server.addr.into(), port);
    let from = SocketAddr::new(topo.client.addr.into(), 0);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let serving = tokio::spawn(http::serve(Listener::bind(server).unwrap()));
        tokio::time::timeout(2 * T, f(server, from)).await.expect("the test did not finish in time");
        serving.abort();
    });
}

/// Four POSTs of 1 MiB through a pooled client of one version, each answer checked.
async fn pooled(server: SocketAddr, from: SocketAddr, http2: bool, want: Version) {
    let client = http::client(Some(from), http2);
    let start = Instant::now();
    for i in 0..4 {
        let body = pattern(SIZE, i);
        let (version, answer) = http::post(&client, &format!("http://{server}/echo"), body.clone()).await.unwrap();
        assert_eq!(version, want, "the answer's HTTP version");
        assert_eq!(answer.len(), SIZE, "answer {i}'s length");
        assert!(answer == body, "answer {i} differs from its request");
    }
    eprintln!("{want:?}: 4 POSTs of 1 MiB echoed in {:?}", start.elapsed());
}

#[test]
fn http1_posts_of_1_mib_through_the_pooled_client_come_back_intact() {
    with_server(7770, |server, from| pooled(server, from, false, Version::HTTP_11));
}

#[test]
fn http2_posts_of_1_mib_through_the_pooled_client_come_back_intact() {
    with_server(7771, |server, from| pooled(server, from, true, Version::HTTP_2));
}

/// A stream to `server`, from `from`.
async fn connect(server: SocketAddr, from: SocketAddr) -> Stream {
    Stream::connect_with(server, Some(from), &rdma_stream::Options::default()).await.unwrap()
}

/// The request for one 1 MiB POST of `seed`'s bytes.
fn post(server: SocketAddr, seed: u64) -> (Request<Full<Bytes>>, Vec<u8>) {
    let body = pattern(SIZE, seed);
    let request = Request::post(format!("http://{server}/echo"))
        .header(hyper::header::HOST, server.to_string())
        .body(Full::new(Bytes::from(body.clone())))
        .unwrap();
    (request, body)
}

/// The body of a 200 answer.
async fn answer_body(answer: hyper::Response<hyper::body::Incoming>) -> Bytes {
    assert_eq!(answer.status(), StatusCode::OK);
    answer.into_body().collect().await.unwrap().to_bytes()
}

#[test]
fn http1_and_http2_handshakes_on_a_stream_carry_1_mib_both_ways() {
    with_server(7772, |server, from| async move {
        let io = TokioIo::new(connect(server, from).await);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        let driving = tokio::spawn(connection);
        for seed in 10..12 {
            let (request, body) = post(server, seed);
            let answer = sender.send_request(request).await.unwrap();
            assert_eq!(answer.version(), Version::HTTP_11);
            assert!(answer_body(answer).await == body, "an HTTP/1.1 answer differs from its request");
        }
        drop(sender);
        tokio::time::timeout(T, driving).await.expect("the HTTP/1.1 connection did not end").unwrap().unwrap();

        let io = TokioIo::new(connect(server, from).await);
        let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await.unwrap();
        let driving = tokio::spawn(connection);
        // Two requests at once on the one connection: HTTP/2's streams, interleaved.
        let calls: Vec<_> = (20..22)
            .map(|seed| {
                let mut sender = sender.clone();
                tokio::spawn(async move {
                    let (request, body) = post(server, seed);
                    let answer = sender.send_request(request).await.unwrap();
                    assert_eq!(answer.version(), Version::HTTP_2);
                    assert!(answer_body(answer).await == body, "an HTTP/2 answer differs from its request");
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        drop(sender);
        tokio::time::timeout(T, driving).await.expect("the HTTP/2 connection did not end").unwrap().unwrap();
    });
}
