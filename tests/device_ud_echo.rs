//! Device test of the UD echo example, rxe1 -> rxe0: a server answers two clients, each from
//! its datagram alone (`ibv_create_ah_from_wc`), and each client gets its own answer.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[test]
fn the_ud_echo_server_answers_each_of_two_clients() {
    let topo = testkit::require_topology!();
    let tool = testkit::example("ud_echo");
    let mut server =
        Command::new(&tool).args(["server", &topo.server.device, "2"]).stderr(Stdio::piped()).spawn().unwrap();
    let err = BufReader::new(server.stderr.take().unwrap());
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            eprintln!("  server: {line}");
            let _ = tx.send(line);
        }
    });
    let listening = lines.recv_timeout(Duration::from_secs(30)).expect("the server did not start");
    // "listening on IP qpn N"
    let words: Vec<&str> = listening.split_whitespace().collect();
    let (ip, qpn) = match words[..] {
        ["listening", "on", ip, "qpn", qpn] => (ip.to_owned(), qpn.to_owned()),
        _ => panic!("the server's first line: {listening}"),
    };
    assert_eq!(ip, topo.server.addr.to_string());
    let start = Instant::now();
    // Both clients at once: the server answers whichever datagram comes first.
    let clients: Vec<_> = ["first client", "second client, a longer message"]
        .iter()
        .map(|message| {
            let child = Command::new(&tool)
                .args(["client", &topo.client.device, &ip, &qpn, message])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (message, child)
        })
        .collect();
    for (message, child) in clients {
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "client {message:?}: {stderr}");
        assert_eq!(stdout.trim_end(), format!("echo: {message}"), "client {message:?} got its own answer");
    }
    eprintln!("two clients answered in {:?}", start.elapsed());
    let answers: Vec<String> = (0..2).map(|_| lines.recv_timeout(Duration::from_secs(10)).unwrap()).collect();
    let from = format!("to {}", topo.client.addr);
    assert!(answers.iter().all(|a| a.starts_with("answered") && a.contains(&from)), "{answers:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the server did not exit after its two answers");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the server's exit: {status}");
}
