//! Device tests of the byte stream's async front (feature `tokio`), rxe1 (10.77.0.2) -> rxe0
//! (10.77.0.1): both peers writing 64 MiB at once through owned halves on different tasks,
//! read and write futures dropped half way, connections opened and closed in a row with
//! the verbs resources and fds back where they were, a stream dropped on a runtime that does
//! not block it, and (feature `tonic`) a stalled handshake
//! that delays no other accept. Ports 7650..7699.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_stream::{Listener, Options, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[cfg(feature = "tonic")]
const T: Duration = Duration::from_secs(20);

fn addrs(port: u16) -> Option<(SocketAddr, SocketAddr, String)> {
    let topo = testkit::topology()?;
    Some((
        SocketAddr::new(topo.server.addr.into(), port),
        SocketAddr::new(topo.client.addr.into(), 0),
        topo.server.device.clone(),
    ))
}

async fn pair(listener: &Listener, server: SocketAddr, from: SocketAddr) -> (Stream, Stream) {
    let (client, accepted) = tokio::join!(Stream::connect_with(server, Some(from), &Options::new()), listener.accept());
    (client.unwrap(), accepted.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_peers_write_64_mib_through_halves_on_other_tasks_and_read_every_byte() {
    let Some((server_addr, from, _)) = addrs(7650) else { return };
    let listener = Listener::bind(server_addr).unwrap();
    let (client, server) = pair(&listener, server_addr, from).await;
    const N: usize = 64 << 20;
    let a = std::sync::Arc::new(testkit::random_bytes(N, 11));
    let b = std::sync::Arc::new(testkit::random_bytes(N, 12));
    let mut tasks = Vec::new();
    for (stream, out, expect) in [(client, a.clone(), b.clone()), (server, b, a)] {
        let (mut rd, mut wr) = stream.into_split();
        tasks.push(tokio::spawn(async move {
            // Writes in odd pieces, then ends the direction.
            for piece in out.chunks(1_000_003) {
                wr.write_all(piece).await.unwrap();
            }
            wr.shutdown().await.unwrap();
        }));
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::with_capacity(N);
            rd.read_to_end(&mut got).await.unwrap();
            assert!(got == *expect, "the {} bytes read differ from those written", got.len());
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all).await.expect("both directions ended");
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_or_write_future_dropped_half_way_loses_no_byte() {
    let Some((server_addr, from, _)) = addrs(7651) else { return };
    let options = Options::new().message_size(4096).messages(4);
    let listener = Listener::bind_with(server_addr, &options).unwrap();
    let (client, server) = {
        let (c, s) = tokio::join!(Stream::connect_with(server_addr, Some(from), &options), listener.accept());
        (c.unwrap(), s.unwrap())
    };
    let (mut crd, mut cwr) = client.into_split();
    let (mut srd, mut swr) = server.into_split();
    // A read dropped before anything came: the bytes sent after it are all read later.
    let mut buf = [0u8; 64];
    assert!(tokio::time::timeout(Duration::from_millis(50), crd.read(&mut buf)).await.is_err());
    swr.write_all(b"after the dropped read").await.unwrap();
    swr.flush().await.unwrap();
    let mut got = vec![0u8; 22];
    crd.read_exact(&mut got).await.unwrap();
    assert_eq!(got, b"after the dropped read");
    // Writes dropped while the window is full: what they reported written arrives, once.
    let data = testkit::random_bytes(200_000, 5);
    let mut written = 0;
    while written < data.len() {
        match tokio::time::timeout(Duration::from_millis(20), cwr.write(&data[written..])).await {
            Ok(n) => written += n.unwrap(),
            Err(_) => {
                // Dropped mid-write: the reader takes some, the writer goes on.
                let mut some = vec![0u8; 10_000];
                let n = srd.read(&mut some).await.unwrap();
                let mut rest = vec![0u8; 0];
                rest.extend_from_slice(&some[..n]);
                // Keep what was read in order.
                RECEIVED.with(|r| r.borrow_mut().extend_from_slice(&rest));
            }
        }
    }
    cwr.shutdown().await.unwrap();
    let mut tail = Vec::new();
    srd.read_to_end(&mut tail).await.unwrap();
    let mut all = RECEIVED.with(|r| r.take());
    all.extend_from_slice(&tail);
    assert_eq!(all.len(), data.len());
    assert!(all == data, "the bytes arrived changed");
}

thread_local! {
    static RECEIVED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[tokio::test(flavor = "current_thread")]
async fn a_thousand_connections_in_a_row_leave_the_verbs_resources_and_fds_as_they_were() {
    let Some((server_addr, from, device)) = addrs(7652) else { return };
    let listener = Listener::bind(server_addr).unwrap();
    // Ten connections first: what stays open for the process (the devices streams keep open,
    // the CM's own handles, a thread's wake-up eventfd).
    for _ in 0..10 {
        let (mut c, mut s) = pair(&listener, server_addr, from).await;
        c.write_all(b"x").await.unwrap();
        s.read_exact(&mut [0u8; 1]).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fds = testkit::open_fds();
    let before = fd_targets();
    let qps = testkit::resource_count(&device, "qp");
    let mrs = testkit::resource_count(&device, "mr");
    let start = std::time::Instant::now();
    let all = async {
        for i in 0..1000u32 {
            let (mut c, mut s) = pair(&listener, server_addr, from).await;
            c.write_all(&i.to_le_bytes()).await.unwrap();
            let mut got = [0u8; 4];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(u32::from_le_bytes(got), i);
            if i % 100 == 99 {
                eprintln!("{} connections in {:?}", i + 1, start.elapsed());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(300), all).await.expect("1000 connections within 300 s");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A thread's wake-up eventfd (rdma-verbs' sleepers) is made on the thread's first blocking
    // sleep in a queue's drain and lives with the thread: at most that one may be new.
    let after = fd_targets();
    let new: Vec<&String> = after.iter().filter(|fd| !before.contains(fd)).collect();
    assert!(
        new.len() <= 1 && new.iter().all(|fd| fd.ends_with("anon_inode:[eventfd]")),
        "fds left open: {new:?} ({} before, {} after)",
        fds,
        testkit::open_fds()
    );
    assert_eq!(testkit::resource_count(&device, "qp"), qps, "QPs on {device}");
    assert_eq!(testkit::resource_count(&device, "mr"), mrs, "MRs on {device}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_on_a_runtime_returns_at_once_and_the_bytes_it_held_still_arrive() {
    let Some((server_addr, from, _)) = addrs(7654) else { return };
    // A window the writer fills at once, and a drain long enough to tell a drop that waits for
    // it from one that does not.
    let options = Options::new().message_size(4096).messages(4).drain_timeout(Duration::from_secs(5));
    let listener = Listener::bind_with(server_addr, &options).unwrap();
    let (client, server) = {
        let (c, s) = tokio::join!(Stream::connect_with(server_addr, Some(from), &options), listener.accept());
        (c.unwrap(), s.unwrap())
    };
    let mut client = client;
    let data = testkit::random_bytes(64 << 10, 21);
    // Writes until the peer, which does not read yet, has no room: the write that stays
    // pending is dropped and took nothing, so `taken` is what the stream holds or sent.
    let mut taken = 0;
    while let Ok(n) = tokio::time::timeout(Duration::from_millis(300), client.write(&data[taken..])).await {
        taken += n.unwrap();
        assert!(taken < data.len(), "a window of 3 messages took {taken} bytes");
    }
    let start = std::time::Instant::now();
    drop(client);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "dropping the stream blocked its worker for {took:?}");
    let mut server = server;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), server.read_to_end(&mut got))
        .await
        .expect("the end arrives")
        .unwrap();
    assert!(got == data[..taken], "read {} bytes of the {taken} written, or other bytes", got.len());
}

/// What each open fd is (for a failure's message).
fn fd_targets() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            format!(
                "{}:{}",
                e.file_name().to_string_lossy(),
                std::fs::read_link(e.path()).map(|p| p.display().to_string()).unwrap_or_default()
            )
        })
        .collect();
    v.sort();
    v
}

/// A client that sends its connect request with a stream's hello and then never completes the
/// handshake (its CM event is never taken, so no RTU goes): how a frozen or hostile client
/// looks to a listener.
#[cfg(feature = "tonic")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stalled_in_its_handshake_delays_no_other_accept_of_incoming() {
    use std::future::IntoFuture;
    use std::pin::Pin;

    use futures_core::Stream as _;
    use rdma_verbs::{AccessFlags, QpCaps, QpCreateAttr, Rc};

    let Some((server_addr, from, _)) = addrs(7653) else { return };
    // The listener's connect timeout (10 s) is what a stalled handshake holds a serial accept.
    let mut incoming = rdma_stream::tonic::Incoming::new(Listener::bind(server_addr).unwrap());
    let id = rdma_cm::CmId::new().unwrap().resolve(Some(from), server_addr).wait(T).unwrap();
    let ctx = id.open_context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).caps(caps)).unwrap();
    let qp = id.init_qp(qp, AccessFlags::empty()).unwrap();
    // The hello (docs/stream.md): magic, version 1, 64 KiB messages, a window of 16.
    let mut hello = *b"RDst\x01\0\0\0\0\0\0\0\0\0\0\0";
    hello[8..12].copy_from_slice(&65536u32.to_le_bytes());
    hello[12..16].copy_from_slice(&16u32.to_le_bytes());
    let mut stalled = id.connect(qp, &rdma_cm::ConnParams::new().private_data(&hello)).wait_async(T);
    // Polled until the request is out, then never again.
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut stalled).await.is_err());

    let started = std::time::Instant::now();
    let next = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx));
    let (client, accepted) =
        tokio::join!(Stream::connect_with(server_addr, Some(from), &Options::new()).into_future(), next);
    let (mut client, mut accepted) = (client.unwrap(), accepted.expect("Incoming never ends").unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the second client was accepted after {:?}: behind the stalled handshake",
        started.elapsed()
    );
    client.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    accepted.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");

    // The stalled client gives up: its handshake ends as an error item, and Incoming goes on.
    drop(stalled);
    let gave_up = std::time::Instant::now();
    let next = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx));
    let item = tokio::time::timeout(Duration::from_secs(15), next).await.expect("the stalled handshake ends");
    assert!(item.expect("Incoming never ends").is_err(), "the stalled handshake gave a stream");
    eprintln!("the stalled handshake ended {:?} after its client left", gave_up.elapsed());
}
