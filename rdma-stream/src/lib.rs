//! Byte streams over RDMA: `std::io::Read` + `Write`, and with the feature `tokio`, tokio's
//! `AsyncRead` + `AsyncWrite`, so that programs written against byte streams (hyper, tonic,
//! your own framing) run over RDMA.
//!
//! A [`Listener`] accepts and [`Stream::connect`] connects through the RDMA connection manager
//! (`rdma_cm`); each stream is one RC queue pair whose SENDs carry the bytes into receive
//! buffers the peer posted, with credits in every message's immediate value (the wire format
//! and the flow control are in docs/stream.md). Connecting and accepting use the workspace's
//! one vocabulary: `.wait(timeout)` blocks, `.await` awaits.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = rdma_stream::Listener::bind("10.77.0.1:7000".parse()?)?;
//! let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
//!     let mut stream = listener.accept().wait(Duration::from_secs(10))?;
//!     let mut got = Vec::new();
//!     stream.read_to_end(&mut got)?; // until the client's shutdown_write
//!     Ok(got)
//! });
//! let mut stream = rdma_stream::Stream::connect("10.77.0.1:7000".parse()?).wait(Duration::from_secs(10))?;
//! stream.write_all(b"hello over RDMA")?;
//! stream.shutdown_write()?;
//! stream.flush()?;
//! assert_eq!(server.join().unwrap()?, b"hello over RDMA");
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod build;
mod credits;
mod error;
mod link;
mod listener;
mod options;
mod stream;
mod wait;
mod wire;

#[cfg(feature = "tokio")]
mod async_io;
#[cfg(feature = "hyper")]
pub mod hyper;
#[cfg(feature = "tonic")]
pub mod tonic;

#[cfg(feature = "tokio")]
pub use async_io::{OwnedReadHalf, OwnedWriteHalf};
pub use error::{Error, Result};
pub use listener::{Accept, Listener};
pub use options::{Options, MAX_MESSAGES};
pub use stream::{Connect, Stream};
