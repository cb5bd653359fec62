//! `rdma-copy`: send files over RDMA, control by Send/Recv, data by pipelined RDMA WRITE.
//!
//! ```text
//! cargo run --release --example rdma-copy -- recv --listen 10.77.0.1:7471 --dir /srv/in --secret-file key
//! cargo run --release --example rdma-copy -- send big.iso --to 10.77.0.1:7471 --from 10.77.0.2
//! ```
//! The receiver stores each file under a temporary name, checks the whole-file XXH3-128 digest,
//! syncs, and only then renames it into place. `recv --discard` checks the data in memory and
//! throws it away (network speed without the disk's). `--json` prints one JSON object per
//! transfer for machines. Logs (`RUST_LOG=info`) carry each session's id.
//!
//! `--driver tokio` (or `$RDMA_COPY_DRIVER=tokio`; needs the feature `tokio`) runs the same
//! transfers as tasks of one tokio runtime instead of a thread per receiver session: the
//! library's async driver, the same code as the blocking one but for its waits.
//!
//! Exit codes (send): 0 stored; 1 usage error; 2 connection failure; 3 timeout; 4 protocol error; 5 local file
//! error; 6 peer gone; 10 + the ACK status code when the receiver refused (see
//! `docs/protocol.md`): 11 checksum mismatch, 12 disk I/O, 13 no space, 14 protocol mismatch,
//! 15 too large, 16 bad name, 17 exists, 18 busy, 19 not authorized, 20 internal.
//!
//! Exit codes (recv): 0 every transfer stored; 1 usage error; 2 listening failed; 9 a transfer
//! failed or was refused (see its report); 128 + N stopped by signal N (SIGINT, SIGTERM: the
//! sessions in progress end and their temporaries are removed; a second signal kills at once).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use rdma_proto::auth::Secret;
use rdma_proto::driver::{
    send_file, send_files, BatchReport, Decision, Phases, Policy, ReceiveOptions, ReceiveReport, SendOptions,
    SendReport, Server,
};
use rdma_proto::Digest;
use rdma_verbs::WaitPolicy;

/// Port used when an address has none.
const DEFAULT_PORT: u16 = 7471;
/// `send --retries` for a single file when not given: a connection that fails mid-transfer
/// (under load Linux 6.1's rxe ends one now and then, docs/testing.md) is resumed by itself.
const DEFAULT_RETRIES: u32 = 3;
/// `send --busy-wait` when not given: long enough for sixteen senders at once against a
/// receiver's eight places (each turned away waits about a second and asks again).
const DEFAULT_BUSY_WAIT_S: u64 = 60;

#[derive(Parser)]
#[command(
    name = "rdma-copy",
    version,
    about = "Copy files over RDMA (RoCE/InfiniBand): safe, pipelined, integrity-checked",
    after_help = exit_code_help()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print one JSON object per transfer instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How transfers wait: `threads` (blocking calls; a receiver serves each sender on a thread
    /// of its own) or `tokio` (one tokio runtime on this thread, each session a task; needs the
    /// feature `tokio`). Default: $RDMA_COPY_DRIVER, else `threads`.
    #[arg(long, global = true, value_enum)]
    driver: Option<Driver>,
}

/// How `rdma-copy` runs its transfers: the blocking driver or the async one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Driver {
    /// Blocking calls, a thread per receiver session.
    Threads,
    /// The async driver, on a tokio runtime of one thread.
    Tokio,
}

impl Driver {
    /// `--driver`, else `$RDMA_COPY_DRIVER`, else `threads`; `Err` with why for an unknown name,
    /// or `tokio` in a build without the feature.
    fn chosen(flag: Option<Driver>) -> Result<Driver, String> {
        let d = match (flag, std::env::var("RDMA_COPY_DRIVER")) {
            (Some(d), _) => d,
            (None, Ok(v)) => <Driver as clap::ValueEnum>::from_str(&v, true)
                .map_err(|_| format!("$RDMA_COPY_DRIVER {v:?}: threads or tokio"))?,
            (None, Err(_)) => Driver::Threads,
        };
        if d == Driver::Tokio && cfg!(not(feature = "tokio")) {
            return Err("--driver tokio: this rdma-copy was built without the feature `tokio`".into());
        }
        Ok(d)
    }

    /// The driver made ready to run: for `tokio`, its runtime of one thread built. `Err` when
    /// the runtime cannot be made.
    fn ready(self) -> std::io::Result<Ready> {
        match self {
            Driver::Threads => Ok(Ready::Threads),
            #[cfg(feature = "tokio")]
            Driver::Tokio => Ok(Ready::Tokio(tokio::runtime::Builder::new_current_thread().enable_all().build()?)),
            #[cfg(not(feature = "tokio"))]
            Driver::Tokio => unreachable!("refused by Driver::chosen"),
        }
    }

    /// [`ready`](Self::ready), then [`Ready::run`].
    fn run<T>(
        self,
        threads: impl FnOnce() -> T,
        #[cfg(feature = "tokio")] tokio: impl std::future::Future<Output = T>,
    ) -> std::io::Result<T> {
        Ok(self.ready()?.run(
            threads,
            #[cfg(feature = "tokio")]
            tokio,
        ))
    }
}

/// A driver ready to run: what it needs made before anything is announced, so that a receiver
/// that says it listens needs no more resources to serve than it holds.
enum Ready {
    /// Blocking calls on this thread.
    Threads,
    /// The async driver's runtime.
    #[cfg(feature = "tokio")]
    Tokio(tokio::runtime::Runtime),
}

impl Ready {
    /// Runs `threads` on this thread, or `tokio`'s future on the runtime.
    fn run<T>(
        self,
        threads: impl FnOnce() -> T,
        #[cfg(feature = "tokio")] tokio: impl std::future::Future<Output = T>,
    ) -> T {
        match self {
            Ready::Threads => threads(),
            #[cfg(feature = "tokio")]
            Ready::Tokio(runtime) => runtime.block_on(tokio),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Receive files: listen and serve senders (several at once).
    #[command(after_help = recv_exit_code_help())]
    Recv(RecvArgs),
    /// Send files to a receiver, one after another.
    #[command(after_help = send_exit_code_help())]
    Send(SendArgs),
}

/// `send`'s exit codes, from the table that defines them (`rdma_proto::driver::exit_codes`).
fn send_exit_code_help() -> String {
    let mut help = String::from("Exit codes of send (a batch: the first failed entry's):\n");
    for (code, what) in rdma_proto::driver::exit_codes() {
        help.push_str(&format!("  {code:>3}  {what}\n"));
    }
    help
}

/// `recv`'s exit codes (this tool's own: `recv` below).
fn recv_exit_code_help() -> String {
    let codes: [(&str, &str); 6] = [
        ("0", "every transfer was stored"),
        ("1", "bad arguments"),
        ("2", "cannot listen (no RDMA device, the address or port taken)"),
        ("5", "the destination cannot take files"),
        ("9", "a transfer failed or was refused (each has its report)"),
        ("128+N", "stopped by signal N (SIGINT, SIGTERM)"),
    ];
    let mut help = String::from("Exit codes of recv:\n");
    for (code, what) in codes {
        help.push_str(&format!("  {code:>5}  {what}\n"));
    }
    help
}

/// Both commands' exit codes, for the top-level help.
fn exit_code_help() -> String {
    format!("{}\n{}", send_exit_code_help(), recv_exit_code_help())
}

#[derive(clap::Args)]
struct RecvArgs {
    /// Address to listen on (an RDMA device's IP, or 0.0.0.0), with an optional :PORT.
    #[arg(long, default_value = "0.0.0.0")]
    listen: String,
    /// Directory to store files in.
    #[arg(long, default_value = ".", conflicts_with = "discard")]
    dir: PathBuf,
    /// Check the data against its digest in memory, then throw it away (no disk).
    #[arg(long)]
    discard: bool,
    /// Serve senders without a shared secret on an address other than loopback: anyone who
    /// can reach it may store files (without it, such a receiver needs --secret-file or
    /// $RDMA_COPY_SECRET).
    #[arg(long)]
    no_auth: bool,
    /// Replace files that exist (default: refuse them with status "exists").
    #[arg(long)]
    overwrite: bool,
    /// Take hidden names (starting with ".") at the top of --dir, such as .ssh or .profile
    /// (default: refuse them with status "bad name": run from a home directory, they would
    /// let a sender plant a shell user's startup files or keys).
    #[arg(long)]
    allow_hidden: bool,
    /// Largest file accepted, in bytes (suffixes K, M, G, T: powers of 1024).
    #[arg(long, default_value = "1T", value_parser = parse_size)]
    max_size: u64,
    /// Most bytes one session may bring: its file, or all the files of a batch (suffixes as
    /// --max-size).
    #[arg(long, default_value = "1T", value_parser = parse_size)]
    max_session_bytes: u64,
    /// Memory for the slot rings of all transfers together, in bytes (suffixes as
    /// --max-size): each of --max-sessions transfers gets an equal share.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    memory: u64,
    /// Largest chunk granted, in bytes.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    max_chunk: u64,
    /// Most chunks in flight per transfer (1..=4096).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_depth: u32,
    /// Transfers served at the same time; more are refused with status "busy".
    #[arg(long, default_value_t = 8)]
    max_sessions: usize,
    /// Connections one address may hold at once (sessions, and those before their HELLO; a
    /// sender that proves the secret in its request is counted, not held back); more are
    /// refused with status "busy".
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_per_address: u64,
    /// Seconds a new connection keeps its place before it proves itself (its HELLO, and the
    /// secret): when every place is taken, a new connection takes the place of one that proved
    /// nothing for this long (of the address holding the most such places), instead of
    /// hearing "busy". A sender with the secret proves it in its connection request and takes
    /// such a place at any age.
    #[arg(long, value_name = "SECS", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    preempt_after: u64,
    /// Most connections (lanes) one transfer may be striped over (1..=16; 1: no striping).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=16))]
    max_lanes: u16,
    /// The whole-file digest granted to senders that offer it (every sender offers xxh3-128):
    /// auto picks the one that hashes faster on this CPU.
    #[arg(long, default_value = "auto", value_parser = parse_digest)]
    digest: DigestArg,
    /// Seconds a transfer may make no progress before it is ended (1..=31536000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    timeout: u64,
    /// The slowest pace a sender may keep, in bytes per second (e.g. 16K), judged once per
    /// --timeout of its time; a slower one is told "busy" and keeps its partial. 0: no floor.
    #[arg(long, default_value = "16K", value_parser = parse_size, value_name = "RATE")]
    min_rate: u64,
    /// Most entries one batch may offer; past them the batch ends as for a protocol violation.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_entries: u32,
    /// The QP's local ACK timeout exponent: a packet not acknowledged within 4.096 us x 2^N is
    /// sent again (1..=31). The receiver sends only control messages, and probes for a lost
    /// one itself while the session lasts: its default is 18 (1.07 s), the sender's 14. See
    /// docs/protocol.md.
    #[arg(long, value_name = "N", default_value_t = 18, value_parser = clap::value_parser!(u8).range(1..=31))]
    ack_timeout: u8,
    /// Microseconds a waiting loop polls its completion queues before it sleeps on their
    /// channel (0..=1000000; 0, the default: sleep at once). See docs/protocol.md.
    #[arg(long, value_name = "US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    spin_us: u64,
    /// Exit after this many transfers (default: serve forever). A transfer counts once its
    /// sender's HELLO arrived and, with a secret, the sender proved it, whatever its outcome;
    /// connections that send none or cannot prove the secret do not count.
    #[arg(long)]
    count: Option<usize>,
    /// Do not keep the data of interrupted transfers for a resume (by default a transfer that
    /// fails midway leaves a hidden partial that the same file's next send continues).
    #[arg(long)]
    no_resume: bool,
    /// Seconds an unused partial is kept (default: a day).
    #[arg(long, default_value_t = 86_400, value_name = "SECS")]
    partial_ttl: u64,
    /// Most partials kept at once; keeping one more gives up the oldest (0: keep none).
    #[arg(long, default_value_t = 64, value_name = "N")]
    max_partials: usize,
    /// Most bytes the partials kept hold together; keeping one more gives up the oldest.
    #[arg(long, default_value = "256G", value_parser = parse_size, value_name = "SIZE")]
    max_partial_bytes: u64,
    /// Without a secret: most bytes one sender address's partials hold together; keeping one
    /// more gives up that address's oldest.
    #[arg(long, default_value = "64G", value_parser = parse_size, value_name = "SIZE")]
    max_partial_bytes_per_address: u64,
    /// Free space to keep on --dir's file system: the larger of this and --min-free-percent,
    /// but at most a fifth of the file system. Partials are given up (the oldest first) or not
    /// kept to keep it, and a new transfer gives up partials until its file fits beside it: a
    /// send is never refused for space that abandoned partials hold.
    #[arg(long, default_value = "1G", value_parser = parse_size, value_name = "SIZE")]
    min_free: u64,
    /// Free space to keep on --dir's file system, as a percentage of its size (0..=100; see
    /// --min-free).
    #[arg(long, default_value_t = 5, value_name = "PCT", value_parser = clap::value_parser!(u8).range(0..=100))]
    min_free_percent: u8,
    /// Sync a resumable transfer's data and record how much of it is safe every SIZE bytes
    /// stored: the most a receiver killed outright (SIGKILL, a crash) makes its sender send
    /// again.
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE")]
    checkpoint_every: u64,
    /// Require senders to prove they know the shared secret in this file (at least 16 bytes;
    /// mode 0600 or stricter). Without it, the secret comes from $RDMA_COPY_SECRET if set.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// Test hook: corrupt this chunk on arrival (to see the digest check fail).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    corrupt_chunk: Option<u64>,
    /// Test hook: never ACK, repeat an old CREDIT every millisecond instead.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_never_ack: bool,
}

#[derive(clap::Args)]
struct SendArgs {
    /// Files and directories to send. Files go one session each, unless --batch; directories
    /// (sent with everything in them, under their own name) make the whole command one batch.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Send everything in one session: one connection and one grant, a verdict per file, one
    /// summary (the default when a directory is given).
    #[arg(long)]
    batch: bool,
    /// Keep modes and modification times (files and directories of a batch).
    #[arg(long, short = 'p')]
    preserve: bool,
    /// The receiver's address, with an optional :PORT.
    #[arg(long)]
    to: String,
    /// Local address to send from (selects the RDMA device).
    #[arg(long)]
    from: Option<IpAddr>,
    /// Name to store the file under (only with one file; default: its own name).
    #[arg(long)]
    name: Option<String>,
    /// Bytes per chunk, one RDMA WRITE each (suffixes K, M, G); a single smaller file is one
    /// chunk of its size.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    chunk: u64,
    /// Chunks in flight (1..=4096).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    depth: u32,
    /// Connections (lanes, each a QP) to stripe each transfer's chunks over (1..=16); a
    /// receiver grants at most its --max-lanes, one without striping takes everything on one.
    #[arg(long, visible_alias = "qps", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    lanes: u16,
    /// Seconds to resolve and connect (1..=86400).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    connect_timeout: u64,
    /// Seconds a transfer may make no progress before it is ended (1..=31536000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    timeout: u64,
    /// The QP's local ACK timeout exponent: a packet not acknowledged within 4.096 us x 2^N is
    /// sent again (1..=31). Shorter recovers sooner from loss; see docs/protocol.md.
    #[arg(long, value_name = "N", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    ack_timeout: u8,
    /// Microseconds a waiting loop polls its completion queues before it sleeps on their
    /// channel (0..=1000000; 0, the default: sleep at once). See docs/protocol.md.
    #[arg(long, value_name = "US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    spin_us: u64,
    /// Send a file again, up to N times, when its connection failed mid-transfer (the peer
    /// disconnected or stopped answering, or the device refused a WRITE: exit 6 once the
    /// retries are used up); the receiver resumes it where it kept data. Waits 0.5 s before the
    /// first retry, doubling to at most 4 s; a retry that cannot connect (the receiver
    /// restarting) counts as one. A receiver's --count counts the failed session too. Default:
    /// 3 for files, 0 (the only value taken) for --batch or a directory.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    retries: Option<u32>,
    /// Seconds a file's send may wait in all for a receiver that answers "busy" (every place
    /// taken), asking again after each wait, before it exits 18: each wait is the receiver's
    /// hint (about 1 s; 3 s for a sender whose slow transfer gave its place to a newer one,
    /// which then resumes) times a random 0.5-1.5, so senders turned away together come back
    /// spread out. Not counted as --retries. 0: exit 18 at the first "busy". A batch waits so
    /// for a receiver that refuses the whole batch "busy"; an entry is never sent again.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_BUSY_WAIT_S, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    busy_wait: u64,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Send every byte, even to a receiver that holds part of this file from an interrupted
    /// transfer (by default only the rest is sent; the digest covers every byte either way).
    #[arg(long)]
    no_resume: bool,
    /// Prove the shared secret in this file to a receiver that requires it, and send only to a
    /// receiver that proves it too. Without it, the secret comes from $RDMA_COPY_SECRET if set.
    #[arg(long, value_name = "PATH")]
    secret_file: Option<std::path::PathBuf>,
    /// Test hook: offer protocol versions MIN-MAX and send --name unchecked.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_offer: Option<String>,
    /// Test hook: right after the FIN, send junk, a second FIN, or a WRITE.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_after_fin: Option<String>,
    /// Test hook: use this session id (decimal) instead of a random one.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_session: Option<u64>,
    /// Test hook: extra lanes present this token (32 hex digits) instead of the GRANT's.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_lane_token: Option<String>,
    /// Test hook: connecting the extra lanes takes this many milliseconds longer.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_lane_delay_ms: Option<u64>,
    /// Test hook: change chunk N after hashing it, and send the digest a forger without the
    /// secret computes for what was sent.
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_tamper: Option<u64>,
    /// Test hook: wait this many milliseconds before reading each chunk (a trickling sender).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    test_chunk_delay_ms: Option<u64>,
}

/// `recv --digest`: a digest, or `auto` (`None`: the faster one on this CPU).
#[derive(Debug, Clone, Copy)]
struct DigestArg(Option<Digest>);

fn parse_digest(s: &str) -> Result<DigestArg, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DigestArg(None));
    }
    s.parse().map(|d| DigestArg(Some(d))).map_err(|e: String| format!("{e}, or auto"))
}

/// `recv`'s own rule, through the library's policy hook: a name at the top of the destination
/// that starts with "." (.ssh, .profile, .bashrc, .config) is refused, deeper ones are not
/// (a tree's .gitignore is fine).
fn hidden_names_refused() -> Policy {
    Policy::new(|offer| {
        match offer.path.split('/').next() {
        Some(top) if top.starts_with('.') => Decision::refuse(
            rdma_proto::Status::BadName,
            format!("{top:?}: hidden names at the top of the receiver's directory are refused (recv --allow-hidden takes them)"),
        ),
        _ => Decision::Accept,
    }
    })
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 10),
        Some('M') => (&s[..s.len() - 1], 20),
        Some('G') => (&s[..s.len() - 1], 30),
        Some('T') => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 1M, 2G)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("{s} is too large"))
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DEFAULT_PORT))
        .map_err(|_| format!("{s:?} is not an IP address[:port]"))
}

fn main() -> ExitCode {
    // Usage errors exit 1 (clap's own default, 2, is this tool's "connection failure").
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .init();
    let driver = match Driver::chosen(cli.driver) {
        Ok(d) => d,
        Err(e) => return ExitCode::from(usage(e) as u8),
    };
    let code = match cli.command {
        Command::Recv(a) => recv(a, cli.json, driver),
        Command::Send(a) => send(a, cli.json, driver),
    };
    ExitCode::from(code as u8)
}

/// The shared secret: from `--secret-file` (refused unless only its owner can read it, as ssh
/// does with keys), else from `$RDMA_COPY_SECRET`, else none. Never from the command line, and
/// never printed.
fn load_secret(file: Option<&std::path::Path>) -> Result<Option<Secret>, String> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(path) = file {
        let meta = std::fs::metadata(path).map_err(|e| format!("--secret-file {}: {e}", path.display()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "--secret-file {}: readable by others (mode {:o}): chmod 600 it",
                path.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("--secret-file {}: {e}", path.display()))?;
        return Secret::new(&bytes).map(Some).map_err(|e| format!("--secret-file {}: {e}", path.display()));
    }
    match std::env::var_os("RDMA_COPY_SECRET") {
        Some(v) => Secret::new(std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()))
            .map(Some)
            .map_err(|e| format!("$RDMA_COPY_SECRET: {e}")),
        None => Ok(None),
    }
}

fn usage(msg: String) -> i32 {
    eprintln!("rdma-copy: {msg}");
    1
}

/// Report lines and log records that could not be written (standard output or error full,
/// closed, or gone): dropped, never a panic, so that a receiver whose log cannot be written
/// (its disk full) serves on. Counted here, and said once on standard error if it can be.
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// Counts one line that could not be written; the first one is said on standard error (if
/// that can be written).
fn dropped(what: &str, e: &std::io::Error) {
    if DROPPED.fetch_add(1, Ordering::Relaxed) == 0 {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "rdma-copy: {what} cannot be written ({e}): its lines are dropped from now on (counted)"
        );
    }
}

/// Writes one line to standard output; a line that cannot be written is dropped and counted
/// ([`DROPPED`]). `println!` panics then, which ended the receiver.
fn say_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()) {
        dropped("standard output", &e);
    }
}

/// `println!` that never panics: [`say_line`].
macro_rules! say {
    ($($t:tt)*) => { say_line(format_args!($($t)*)) };
}

/// `eprintln!` that never panics: a line standard error cannot take is dropped.
macro_rules! note {
    ($($t:tt)*) => {{
        use std::io::Write;
        if let Err(e) = writeln!(std::io::stderr(), $($t)*) {
            dropped("standard error", &e);
        }
    }};
}

/// Standard error for the log: a record it cannot take is dropped and counted ([`DROPPED`]),
/// where tracing's own writer would report the failure with `eprintln!`, which panics.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if let Err(e) = std::io::stderr().write_all(buf) {
            dropped("standard error", &e);
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn recv(a: RecvArgs, json: bool, driver: Driver) -> i32 {
    let listen = match parse_addr(&a.listen) {
        Ok(l) => l,
        Err(e) => return usage(e),
    };
    let Ok(max_chunk) = u32::try_from(a.max_chunk) else { return usage("--max-chunk: at most 4G - 1".into()) };
    let mut opts = ReceiveOptions::default();
    opts.dir = (!a.discard).then_some(a.dir);
    opts.overwrite = a.overwrite;
    opts.max_size = a.max_size;
    opts.max_session_bytes = a.max_session_bytes;
    opts.max_chunk = max_chunk;
    opts.memory_budget = a.memory;
    opts.max_slots = a.max_depth.max(1);
    opts.max_sessions = a.max_sessions.max(1);
    opts.max_per_address = a.max_per_address as usize;
    opts.preempt_after = Duration::from_secs(a.preempt_after);
    opts.max_lanes = a.max_lanes;
    opts.digest = a.digest.0;
    opts.timeout = Duration::from_secs(a.timeout);
    opts.min_rate = a.min_rate;
    opts.max_entries = a.max_entries;
    if !a.allow_hidden {
        opts.policy = Some(hidden_names_refused());
    }
    opts.accept_timeout = Duration::from_secs(a.timeout);
    opts.ack_timeout = a.ack_timeout;
    opts.wait = WaitPolicy::spin_then_sleep(Duration::from_micros(a.spin_us));
    opts.resume = !a.no_resume;
    opts.partial_ttl = Duration::from_secs(a.partial_ttl);
    opts.max_partials = a.max_partials;
    opts.max_partial_bytes = a.max_partial_bytes;
    opts.max_partial_bytes_per_address = a.max_partial_bytes_per_address;
    opts.min_free = a.min_free;
    opts.min_free_percent = a.min_free_percent;
    opts.checkpoint_every = a.checkpoint_every;
    opts.secret = match load_secret(a.secret_file.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    if opts.secret.is_none() && !a.no_auth && !listen.ip().is_loopback() {
        return usage(format!(
            "listening on {} without a shared secret would let anyone who reaches it store files: give \
             --secret-file FILE (or $RDMA_COPY_SECRET), or --no-auth to serve everyone",
            listen.ip()
        ));
    }
    #[cfg(feature = "fault-injection")]
    {
        opts.corrupt_chunk = a.corrupt_chunk;
        opts.test_never_ack = a.test_never_ack;
    }
    // SIGINT/SIGTERM: stop serving, end the sessions in progress (their temporaries are
    // removed), exit 128 + the signal. A second signal kills at once.
    // The handlers only set atomics (async-signal-safe); a thread that waits for the signals
    // sets the stop flag, which wakes the accept loop and the sessions at once.
    let signal = Arc::new(AtomicUsize::new(0));
    let signalled = Arc::new(AtomicBool::new(false));
    let sigs = [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM];
    let registered = sigs.iter().try_for_each(|&sig| {
        signal_hook::flag::register_conditional_shutdown(sig, 1, signalled.clone())
            .and_then(|_| signal_hook::flag::register(sig, signalled.clone()))
            .and_then(|_| signal_hook::flag::register_usize(sig, signal.clone(), sig as usize))
            .map(drop)
    });
    let waiter = registered.and_then(|()| signal_hook::iterator::Signals::new(sigs)).map(|mut signals| {
        let stop = opts.stop.clone();
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                stop.set();
            }
        })
    });
    if let Err(e) = waiter {
        note!("rdma-copy: installing a signal handler: {e}");
        return 2;
    }
    // The runtime first: "listening on" tells that the receiver holds what it serves with.
    let ready = match driver.ready() {
        Ok(ready) => ready,
        Err(e) => {
            let e = rdma_proto::driver::Error::Usage(format!("starting the tokio runtime: {e}"));
            note!("rdma-copy: {e}");
            return e.exit_code();
        }
    };
    let server = match Server::bind(listen, opts) {
        Ok(s) => s,
        Err(e @ rdma_proto::driver::Error::Destination(_)) => {
            note!("rdma-copy: {e}");
            return e.exit_code();
        }
        Err(e) => {
            note!("rdma-copy: listening on {listen}: {e}");
            return e.exit_code();
        }
    };
    if !json {
        note!("rdma-copy: listening on {}", server.local_addr());
    }
    let failures = Arc::new(AtomicUsize::new(0));
    let f = failures.clone();
    let report = move |r: ReceiveReport| {
        // A failed transfer makes the exit status 9; a connection that asked for none (an idle
        // one timed out, say), or could not prove the secret, is only reported.
        if r.authorized && r.result.is_err() {
            f.fetch_add(1, Ordering::Relaxed);
        }
        if json {
            let result = match (r.status(), &r.result) {
                (Some(s), _) => serde_json::json!({"status": s.to_string(), "code": s.code()}),
                (None, Err(e)) => serde_json::json!({"error": e.to_string()}),
                (None, Ok(())) => serde_json::json!({}),
            };
            let v = serde_json::json!({
                "role": "recv", "session": format!("{:016x}", r.session), "peer": r.peer.to_string(),
                "name": r.name, "bytes": r.bytes, "result": result, "seconds": r.total.as_secs_f64(),
                "mb_per_s": mb_per_s(r.bytes, r.phases.data), "phases": phases_json(&r.phases),
            });
            say!("{v}");
        } else {
            for e in &r.entries {
                let what = if e.status == rdma_proto::Status::Ok {
                    "stored".to_owned()
                } else {
                    format!("{}: {}", e.status, e.detail)
                };
                let kind = if e.directory { "/" } else { "" };
                say!("{:016x}   {}{kind} ({} bytes): {what}", r.session, e.path, e.bytes);
            }
            let unlisted = r.entry_counts.ended.saturating_sub(r.entries.len() as u64);
            if unlisted > 0 {
                let listed_stored = r.entries.iter().filter(|e| e.status == rdma_proto::Status::Ok).count() as u64;
                let stored = r.entry_counts.stored.saturating_sub(listed_stored);
                say!("{:016x}   ... {unlisted} more entries, {stored} of them stored", r.session);
            }
            let what = match (r.status(), &r.result) {
                (Some(s), _) => s.to_string(),
                (None, Err(e)) => format!("failed: {e}"),
                (None, Ok(())) => String::new(),
            };
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            say!(
                "{:016x} from {}: {} ({} bytes, {:.1} MB/s): {what}; connect {:.1} ms, data {:.1} ms, digest {:.1} ms, fsync+rename {:.1} ms",
                r.session,
                r.peer,
                r.name.as_deref().unwrap_or("-"),
                r.bytes,
                mb_per_s(r.bytes, r.phases.data),
                ms(r.phases.connect),
                ms(r.phases.data),
                ms(r.phases.digest),
                ms(r.phases.sync_rename)
            );
        }
    };
    let r = ready.run(
        || server.serve(a.count, report.clone()),
        #[cfg(feature = "tokio")]
        server.serve_async(a.count, report.clone()),
    );
    let lost = DROPPED.load(Ordering::Relaxed);
    if lost > 0 {
        note!("rdma-copy: {lost} report or log lines could not be written");
    }
    match r {
        Err(e) => {
            note!("rdma-copy: {e}");
            2
        }
        Ok(()) if signal.load(Ordering::Relaxed) != 0 => 128 + signal.load(Ordering::Relaxed) as i32,
        Ok(()) if failures.load(Ordering::Relaxed) > 0 => 9,
        Ok(()) => 0,
    }
}

fn send(a: SendArgs, json: bool, driver: Driver) -> i32 {
    let to = match parse_addr(&a.to) {
        Ok(t) => t,
        Err(e) => return usage(e),
    };
    if a.name.is_some() && a.files.len() > 1 {
        return usage("--name takes one file".into());
    }
    let Ok(chunk) = u32::try_from(a.chunk) else { return usage("--chunk: at most 4G - 1".into()) };
    if chunk == 0 || a.depth == 0 {
        return usage("--chunk and --depth must be at least 1".into());
    }
    let mut opts = SendOptions::new(to);
    opts.from = a.from.map(|ip| SocketAddr::new(ip, 0));
    opts.name = a.name.clone();
    opts.chunk = chunk;
    opts.depth = a.depth;
    opts.lanes = a.lanes;
    opts.connect_timeout = Duration::from_secs(a.connect_timeout);
    opts.timeout = Duration::from_secs(a.timeout);
    opts.ack_timeout = a.ack_timeout;
    opts.wait = WaitPolicy::spin_then_sleep(Duration::from_micros(a.spin_us));
    opts.resume = !a.no_resume;
    let batch = a.batch || a.files.iter().any(|f| f.is_dir());
    opts.retries = a.retries.unwrap_or(if batch { 0 } else { DEFAULT_RETRIES });
    opts.busy_wait = Duration::from_secs(a.busy_wait);
    opts.preserve = a.preserve;
    opts.secret = match load_secret(a.secret_file.as_deref()) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    #[cfg(feature = "fault-injection")]
    {
        use rdma_proto::driver::AfterFin;
        if let Some(v) = &a.test_offer {
            let parsed = v.split_once('-').and_then(|(lo, hi)| Some((lo.parse().ok()?, hi.parse().ok()?)));
            let Some((lo, hi)) = parsed else { return usage(format!("--test-offer {v:?}: MIN-MAX")) };
            opts.test_offer = Some(lo..=hi);
        }
        opts.test_session = a.test_session;
        if let Some(hex) = &a.test_lane_token {
            let token = u128::from_str_radix(hex, 16).map(u128::to_be_bytes);
            let Ok(token) = token else { return usage(format!("--test-lane-token {hex:?}: 32 hex digits")) };
            opts.test_lane_token = Some(token);
        }
        opts.test_lane_delay = a.test_lane_delay_ms.map(Duration::from_millis);
        opts.test_tamper = a.test_tamper;
        opts.test_chunk_delay = a.test_chunk_delay_ms.map(Duration::from_millis);
        opts.test_after_fin = match a.test_after_fin.as_deref() {
            None => None,
            Some("junk") => Some(AfterFin::Junk),
            Some("fin") => Some(AfterFin::SecondFin),
            Some("write") => Some(AfterFin::Write),
            Some(v) => return usage(format!("--test-after-fin {v:?}: junk, fin or write")),
        };
    }
    if batch {
        if a.name.is_some() {
            return usage("--name takes one file, not a batch".into());
        }
        if opts.retries > 0 {
            return usage("--retries takes single files, not a batch: send it again to resume".into());
        }
        return send_batch(&a, &opts, json, driver);
    }
    let mut code = 0;
    for path in &a.files {
        let bar = progress_bar(a.quiet || json, &path.display().to_string());
        let progress = |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        };
        let r = driver
            .run(
                || send_file(path, &opts, progress),
                #[cfg(feature = "tokio")]
                rdma_proto::driver::send_file_async(path, &opts, progress),
            )
            .unwrap_or_else(|e| Err(rdma_proto::driver::Error::Usage(format!("starting the tokio runtime: {e}"))));
        bar.finish_and_clear();
        match r {
            Ok(rep) => print_sent(path, &rep, json),
            Err(e) => {
                code = e.exit_code();
                if json {
                    let v = serde_json::json!({"role": "send", "file": path.display().to_string(), "error": e.to_string(), "exit_code": code});
                    println!("{v}");
                } else {
                    eprintln!("rdma-copy: {}: {e}", path.display());
                }
            }
        }
    }
    code
}

/// A progress bar labelled `msg` on a terminal's stderr; hidden when `quiet` or not a terminal.
fn progress_bar(quiet: bool, msg: &str) -> ProgressBar {
    if quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(0);
    b.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    b.set_message(msg.to_owned());
    b
}

/// `send --batch`, or with a directory: one session, a line per entry, one summary. The exit
/// code is 0 when every entry was stored, else the first failure's.
fn send_batch(a: &SendArgs, opts: &SendOptions, json: bool, driver: Driver) -> i32 {
    let bar = progress_bar(a.quiet || json, "batch");
    let progress = |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let r = driver
        .run(
            || send_files(&a.files, opts, progress),
            #[cfg(feature = "tokio")]
            rdma_proto::driver::send_files_async(&a.files, opts, progress),
        )
        .unwrap_or_else(|e| Err(rdma_proto::driver::Error::Usage(format!("starting the tokio runtime: {e}"))));
    bar.finish_and_clear();
    let r: BatchReport = match r {
        Ok(r) => r,
        Err(e) => {
            let code = e.exit_code();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"role": "send", "batch": true, "error": e.to_string(), "exit_code": code})
                );
            } else {
                eprintln!("rdma-copy: batch: {e}");
            }
            return code;
        }
    };
    let mut code = 0;
    for (path, why) in &r.skipped {
        if json {
            println!("{}", serde_json::json!({"role": "send", "file": path.display().to_string(), "skipped": why}));
        } else {
            eprintln!("rdma-copy: {}: {why}", path.display());
        }
    }
    for e in &r.entries {
        let c = e.result.as_ref().err().map_or(0, |e| e.exit_code());
        if code == 0 {
            code = c;
        }
        if json {
            let err = e.result.as_ref().err().map(|e| e.to_string());
            let v = serde_json::json!({"role": "send", "file": e.source.display().to_string(), "path": e.path,
                "directory": e.directory, "bytes": e.size, "resumed_from": e.resumed_from, "error": err, "exit_code": c});
            println!("{v}");
        } else {
            let kind = if e.directory { "/" } else { "" };
            match &e.result {
                Ok(()) if e.resumed_from > 0 => {
                    println!("{}{kind}: {} bytes, stored, resumed at byte {}", e.path, e.size, e.resumed_from)
                }
                Ok(()) => println!("{}{kind}: {} bytes, stored", e.path, e.size),
                Err(err) => println!("{}{kind}: {err}", e.path),
            }
        }
    }
    if code == 0 {
        if let Err(e) = &r.result {
            code = e.exit_code();
        }
    }
    let stored = r.entries.iter().filter(|e| e.result.is_ok()).count();
    let secs = r.total.as_secs_f64();
    if json {
        let err = r.result.as_ref().err().map(|e| e.to_string());
        let v = serde_json::json!({"role": "send", "batch": true, "session": format!("{:016x}", r.session),
            "entries": r.entries.len(), "stored": stored, "skipped": r.skipped.len(), "bytes": r.bytes,
            "seconds": secs, "error": err, "exit_code": code});
        println!("{v}");
    } else {
        let tail = match &r.result {
            Ok(()) => String::new(),
            Err(e) => format!("; {e}"),
        };
        println!(
            "batch: {stored} of {} entries stored ({} skipped), {} bytes in {secs:.3} s, {:.1} MB/s, session {:016x}{tail}",
            r.entries.len(),
            r.skipped.len(),
            r.bytes,
            mb_per_s(r.bytes, r.total),
            r.session
        );
    }
    code
}

fn mb_per_s(bytes: u64, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        bytes as f64 / t.as_secs_f64() / 1e6
    }
}

fn phases_json(p: &Phases) -> serde_json::Value {
    serde_json::json!({
        "connect": p.connect.as_secs_f64(), "grant": p.grant.as_secs_f64(), "lanes": p.lanes.as_secs_f64(),
        "data": p.data.as_secs_f64(),
        "digest": p.digest.as_secs_f64(), "sync_rename": p.sync_rename.as_secs_f64(),
    })
}

fn print_sent(path: &std::path::Path, r: &SendReport, json: bool) {
    if json {
        let v = serde_json::json!({
            "role": "send", "file": path.display().to_string(), "session": format!("{:016x}", r.session),
            "bytes": r.bytes, "chunk": r.chunk, "slots": r.slots, "seconds": r.total.as_secs_f64(),
            "resumed_from": r.resumed_from, "lanes": r.lanes, "digest": r.digest.name(), "retries": r.retries,
            "mb_per_s": mb_per_s(r.bytes - r.resumed_from, r.phases.data), "phases": phases_json(&r.phases), "exit_code": 0,
            "already_stored": r.already_stored,
        });
        println!("{v}");
        return;
    }
    if r.already_stored {
        println!("{}: {} bytes, already stored on the receiver, identical: nothing sent", path.display(), r.bytes);
        return;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let resumed = if r.resumed_from > 0 { format!(", resumed at byte {}", r.resumed_from) } else { String::new() };
    let lanes = if r.lanes > 1 { format!(", {} lanes", r.lanes) } else { String::new() };
    let retried = match r.retries {
        0 => String::new(),
        1 => ", after 1 retry".to_owned(),
        n => format!(", after {n} retries"),
    };
    println!(
        "{}: {} bytes in {:.3} s, {:.1} MB/s (data phase), chunk {} x {} slots, session {:016x}{lanes}{resumed}{retried}",
        path.display(),
        r.bytes,
        r.total.as_secs_f64(),
        mb_per_s(r.bytes - r.resumed_from, r.phases.data),
        r.chunk,
        r.slots,
        r.session
    );
    let lanes = if r.lanes > 1 { format!(", lanes {:.1} ms", ms(r.phases.lanes)) } else { String::new() };
    let digest = r.digest;
    println!(
        "  connect {:.1} ms, grant {:.1} ms{lanes}, data {:.1} ms, FIN to ACK ({digest} digest, fsync, rename) {:.1} ms",
        ms(r.phases.connect),
        ms(r.phases.grant),
        ms(r.phases.data),
        ms(r.phases.digest)
    );
}
