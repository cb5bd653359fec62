//! Device tests of the byte stream, rxe1 (10.77.0.2) -> rxe0 (10.77.0.1): echoes of every size in
//! both directions with random splits, the half-close, both peers writing at once (full windows,
//! and many small writes), vectored writes, peers whose windows differ, a peer that leaves, and
//! a listener dropped with a connect pending. Ports 7600..7649.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdma_stream::{Listener, Options, Stream};

const T: Duration = Duration::from_secs(20);

fn addrs(port: u16) -> Option<(SocketAddr, SocketAddr)> {
    let topo = testkit::topology()?;
    Some((SocketAddr::new(topo.server.addr.into(), port), SocketAddr::new(topo.client.addr.into(), 0)))
}

/// A connected pair: (client, server).
fn pair(port: u16, options: &Options) -> Option<(Stream, Stream)> {
    pair_with(port, options, options)
}

/// A connected pair whose sides have their own options: (client, server).
fn pair_with(port: u16, client: &Options, server: &Options) -> Option<(Stream, Stream)> {
    let (server_addr, from) = addrs(port)?;
    let listener = Listener::bind_with(server_addr, server).unwrap();
    let accept = std::thread::spawn(move || listener.accept().wait(T).unwrap());
    let client = Stream::connect_with(server_addr, Some(from), client).wait(T).unwrap();
    Some((client, accept.join().unwrap()))
}

/// A xorshift generator for split sizes.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Writes `data` in random pieces of up to `max` bytes.
fn write_split(mut s: &Stream, data: &[u8], rng: &mut Rng, max: usize) {
    let mut at = 0;
    while at < data.len() {
        let n = (1 + rng.below(max)).min(data.len() - at);
        at += s.write(&data[at..at + n]).unwrap();
    }
    s.flush().unwrap();
}

/// Reads exactly `len` bytes in random pieces of up to `max` bytes.
fn read_split(mut s: &Stream, len: usize, rng: &mut Rng, max: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    let mut at = 0;
    while at < len {
        let n = (1 + rng.below(max)).min(len - at);
        let k = s.read(&mut got[at..at + n]).unwrap();
        assert!(k > 0, "end of file after {at} of {len} bytes");
        at += k;
    }
    got
}

#[test]
fn echoes_of_1_byte_to_16_mib_come_back_whole_in_both_directions_with_random_splits() {
    let Some((client, server)) = pair(7600, &Options::new()) else { return };
    let echo = std::thread::spawn(move || {
        let mut rng = Rng(7);
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0usize;
        loop {
            let n = (&server).read(&mut buf[..1 + rng.below(1 << 20)]).unwrap();
            if n == 0 {
                return total;
            }
            total += n;
            (&server).write_all(&buf[..n]).unwrap();
        }
    });
    let mut rng = Rng(42);
    let mut sent = 0;
    let started = Instant::now();
    for size in [1usize, 7, 64, 1000, 4096, 65535, 65536, 65537, 1 << 20, 3 << 20, 16 << 20] {
        let data = testkit::random_bytes(size, size as u64);
        let reader = {
            // Read the echo beside the writes: a 16 MiB message is over both windows.
            let client = &client;
            std::thread::scope(|s| {
                let r = s.spawn(|| read_split(client, size, &mut Rng(size as u64 + 1), 200_000));
                write_split(client, &data, &mut rng, 300_000);
                r.join().unwrap()
            })
        };
        assert!(reader == data, "the echo of {size} bytes differs");
        sent += size;
    }
    client.shutdown_write().unwrap();
    let mut rest = Vec::new();
    (&client).read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    assert_eq!(echo.join().unwrap(), sent);
    eprintln!("echoed {sent} bytes in {:?}", started.elapsed());
}

#[test]
fn a_half_close_gives_the_peer_every_byte_then_end_of_file_and_the_other_direction_goes_on() {
    let Some((mut client, mut server)) = pair(7601, &Options::new()) else { return };
    client.write_all(b"request").unwrap();
    client.shutdown_write().unwrap();
    assert_eq!(client.write(b"x").unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
    let mut got = Vec::new();
    server.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"request");
    assert_eq!(server.read(&mut [0u8; 8]).unwrap(), 0, "end of file stays");
    server.write_all(b"response after the client's end").unwrap();
    drop(server); // ends the server's direction after its bytes
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"response after the client's end");
}

#[test]
fn two_peers_that_write_their_windows_without_reading_do_not_deadlock() {
    let options = Options::new().message_size(4096).messages(8);
    let Some((client, server)) = pair(7602, &options) else { return };
    // What each may write before the other reads: the window and the message being filled.
    let n = options.window();
    let a = testkit::random_bytes(n, 1);
    let b = testkit::random_bytes(n, 2);
    let start = Instant::now();
    let (ga, gb) = std::thread::scope(|s| {
        let w1 = s.spawn(|| (&client).write_all(&a).unwrap());
        let w2 = s.spawn(|| (&server).write_all(&b).unwrap());
        w1.join().unwrap();
        w2.join().unwrap();
        let r1 = s.spawn(|| read_split(&client, n, &mut Rng(3), 5000));
        let r2 = s.spawn(|| read_split(&server, n, &mut Rng(4), 5000));
        (r1.join().unwrap(), r2.join().unwrap())
    });
    assert!(ga == b && gb == a);
    assert!(start.elapsed() < T);
}

#[test]
fn a_dropped_peer_ends_its_direction_after_its_bytes_and_the_reader_sees_end_of_file_at_once() {
    let Some((client, server)) = pair(7603, &Options::new()) else { return };
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        let result = (&server).read_to_end(&mut got).map(|_| got.len());
        (result, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    (&client).write_all(&[5u8; 100_000]).unwrap();
    drop(client);
    let dropped = Instant::now();
    let (result, at) = reader.join().unwrap();
    assert_eq!(result.unwrap(), 100_000);
    assert!(at.duration_since(dropped) < Duration::from_secs(5), "the reader waited {:?}", at - dropped);
}

#[test]
fn a_peer_killed_mid_stream_fails_the_read_with_an_error_not_a_hang() {
    let Some((server_addr, from)) = addrs(7604) else { return };
    let listener = Listener::bind(server_addr).unwrap();
    let mut child = std::process::Command::new(testkit::example("stream"))
        .args(["send", &server_addr.to_string(), "--from", &from.ip().to_string(), "--forever"])
        .spawn()
        .unwrap();
    let mut stream = listener.accept().wait(T).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    while total < 8 << 20 {
        total += stream.read(&mut buf).unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let end = loop {
        match stream.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => {}
            Err(e) => break Err(e),
        }
    };
    let e = end.expect_err("a killed peer is no end of file");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert!(killed.elapsed() < Duration::from_secs(10), "the read failed after {:?}", killed.elapsed());
    let w = stream.write(b"x").unwrap_err();
    assert!(matches!(w.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset), "{w}");
}

#[test]
fn a_listener_dropped_with_a_connect_pending_fails_the_connect_at_once() {
    let Some((server_addr, from)) = addrs(7605) else { return };
    let listener = Listener::bind(server_addr).unwrap();
    let connect = std::thread::spawn(move || {
        let result = Stream::connect_with(server_addr, Some(from), &Options::new()).wait(T);
        (result.map(|_| ()), Instant::now())
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(listener);
    let dropped = Instant::now();
    let (result, at) = connect.join().unwrap();
    assert!(result.is_err(), "the connect to a dropped listener succeeded");
    assert!(at.saturating_duration_since(dropped) < Duration::from_secs(5), "{:?}", at - dropped);
}

/// Reads `from` to its end within `T`; what it read.
fn read_to_end_within(mut from: &Stream) -> Vec<u8> {
    from.set_read_timeout(Some(T));
    let mut got = Vec::new();
    from.read_to_end(&mut got).unwrap();
    got
}

#[test]
fn peers_with_different_windows_stream_each_way_to_the_end() {
    // The server posts twice the client's receives: both must reckon with the smaller window,
    // or the reader never reports while the writer waits for credits.
    for (port, client_messages, server_messages) in [(7606, 16, 32), (7607, 32, 4)] {
        let client_options = Options::new().messages(client_messages);
        let server_options = Options::new().messages(server_messages);
        let Some((client, server)) = pair_with(port, &client_options, &server_options) else { return };
        let up = testkit::random_bytes(4 << 20, 11);
        let down = testkit::random_bytes(3 << 20, 12);
        client.set_write_timeout(Some(T));
        server.set_write_timeout(Some(T));
        std::thread::scope(|s| {
            let upload = s.spawn(|| {
                (&client).write_all(&up).unwrap();
                client.shutdown_write().unwrap();
            });
            assert!(read_to_end_within(&server) == up, "{client_messages}/{server_messages}: the upload differs");
            upload.join().unwrap();
            let download = s.spawn(|| {
                (&server).write_all(&down).unwrap();
                server.shutdown_write().unwrap();
            });
            assert!(read_to_end_within(&client) == down, "{client_messages}/{server_messages}: the download differs");
            download.join().unwrap();
        });
    }
}

#[test]
fn two_peers_that_each_write_100_small_pieces_before_reading_do_not_deadlock() {
    // 100 KiB in 1 KiB writes is far below the default window (15 × 64 KiB): small writes must
    // fill messages once half the window is spent, not take a receive each.
    let Some((client, server)) = pair(7608, &Options::new()) else { return };
    let a = testkit::random_bytes(100 << 10, 21);
    let b = testkit::random_bytes(100 << 10, 22);
    let write_small = |mut s: &Stream, data: &[u8]| {
        s.set_write_timeout(Some(T));
        for piece in data.chunks(1024) {
            s.write_all(piece).unwrap();
        }
    };
    let (ga, gb) = std::thread::scope(|s| {
        let w1 = s.spawn(|| write_small(&client, &a));
        let w2 = s.spawn(|| write_small(&server, &b));
        w1.join().unwrap();
        w2.join().unwrap();
        client.set_read_timeout(Some(T));
        server.set_read_timeout(Some(T));
        let r1 = s.spawn(|| read_split(&client, b.len(), &mut Rng(5), 5000));
        let r2 = s.spawn(|| read_split(&server, a.len(), &mut Rng(6), 5000));
        (r1.join().unwrap(), r2.join().unwrap())
    });
    assert!(ga == b && gb == a, "the bytes differ");
}

#[test]
fn a_vectored_write_takes_every_piece_that_fits_and_the_peer_reads_them_in_order() {
    // A window of 3 × 4 KiB: a vectored write of more than that takes what fits and no more.
    let options = Options::new().message_size(4096).messages(4);
    let Some((mut client, server)) = pair(7609, &options) else { return };
    server.set_read_timeout(Some(T));
    // A frame's header and its payload, as h2 writes them.
    let header = [9u8; 9];
    let payload = testkit::random_bytes(1000, 31);
    let n = client.write_vectored(&[std::io::IoSlice::new(&header), std::io::IoSlice::new(&payload)]).unwrap();
    assert_eq!(n, header.len() + payload.len(), "one call takes both pieces");
    client.flush().unwrap();
    let mut got = vec![0u8; n];
    (&server).read_exact(&mut got).unwrap();
    assert_eq!(&got[..9], &header);
    assert!(got[9..] == payload[..], "the payload differs");
    // More pieces than the window holds: a partial count, and the rest goes with later writes.
    let big: Vec<Vec<u8>> = (0..8).map(|i| testkit::random_bytes(3000, 40 + i)).collect();
    let all: Vec<u8> = big.concat();
    let taken = client.write_vectored(&big.iter().map(|b| std::io::IoSlice::new(b)).collect::<Vec<_>>()).unwrap();
    assert!(taken > 0 && taken < all.len(), "a write into a 12 KiB window took {taken} of {} bytes", all.len());
    std::thread::scope(|s| {
        let reader = s.spawn(|| read_split(&server, all.len(), &mut Rng(9), 5000));
        client.set_write_timeout(Some(T));
        client.write_all(&all[taken..]).unwrap();
        client.flush().unwrap();
        assert!(reader.join().unwrap() == all, "the bytes differ");
    });
}
