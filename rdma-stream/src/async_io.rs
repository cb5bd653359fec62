//! tokio's `AsyncRead` + `AsyncWrite` for [`Stream`], and its owned halves (feature `tokio`).
//!
//! Cancel safety, as tokio documents it for `TcpStream`: a `read` future dropped before it
//! completes has read nothing (bytes stay for the next read); a `write` future dropped before
//! it completes has written nothing, and one that completed with `n` took those `n` bytes for
//! good (they are sent even if the caller never polls again, as soon as any operation on the
//! stream or its halves, or its drop, finds credits for them). `flush` and `shutdown` may be
//! dropped and called again.
//!
//! A stream's async waits register with the reactor of the runtime they first sleep on and keep
//! that registration, as tokio's own IO types stay with the runtime they were made in: use a
//! stream within one runtime. One moved to another runtime waits on the first one's reactor
//! while that runtime lives (and needs it driven); once it has shut down, the next wait
//! registers with the runtime it runs on.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::link::{Op, ReadOutcome, Shared};
use crate::wait::AsyncWait;
use crate::Stream;

fn poll_read(
    shared: &Arc<Shared>,
    wait: &mut AsyncWait,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    // `put_slice` copies into the unfilled part without zeroing it first (hyper hands a
    // fresh, uninitialized buffer to every poll).
    shared.poll_wait(Op::Read, wait, cx, |st| match st.read_into(buf.remaining(), |bytes| buf.put_slice(bytes)) {
        Ok(ReadOutcome::Read(_)) => Some(Ok(())),
        Ok(ReadOutcome::Empty) => None,
        Err(e) => Some(Err(e)),
    })
}

fn poll_write(shared: &Arc<Shared>, wait: &mut AsyncWait, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
    shared.poll_wait(Op::Write, wait, cx, |st| st.write(buf).transpose())
}

fn poll_write_vectored(
    shared: &Arc<Shared>,
    wait: &mut AsyncWait,
    cx: &mut Context<'_>,
    bufs: &[io::IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    shared.poll_wait(Op::Write, wait, cx, |st| st.write_vectored(bufs).transpose())
}

fn poll_flush(shared: &Arc<Shared>, wait: &mut AsyncWait, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    shared.poll_wait(Op::Write, wait, cx, |st| match st.flushed() {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    })
}

fn poll_shutdown(shared: &Arc<Shared>, wait: &mut AsyncWait, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    shared.state.lock().shutdown();
    poll_flush(shared, wait, cx)
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        poll_read(&this.shared, this.read_wait.get_mut(), cx, buf)
    }
}

/// `AsyncWrite` for a type whose writes wait through `$wait` (a `Mutex<AsyncWait>` field):
/// the stream and its write half write the same way.
macro_rules! async_write {
    ($type:ty, $wait:ident) => {
        impl AsyncWrite for $type {
            fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                let this = self.get_mut();
                poll_write(&this.shared, this.$wait.get_mut(), cx, buf)
            }

            /// Takes the pieces in order into the same messages: a frame's header and its
            /// payload go as one message when they fit.
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                let this = self.get_mut();
                poll_write_vectored(&this.shared, this.$wait.get_mut(), cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let this = self.get_mut();
                poll_flush(&this.shared, this.$wait.get_mut(), cx)
            }

            /// Ends this direction ([`Stream::shutdown_write`]) and waits until the end was
            /// sent.
            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                let this = self.get_mut();
                poll_shutdown(&this.shared, this.$wait.get_mut(), cx)
            }
        }
    };
}

async_write!(Stream, write_wait);
async_write!(OwnedWriteHalf, wait);

impl Stream {
    /// Splits the stream into a reading and a writing half that can move to different tasks
    /// (feature `tokio`). The connection ends when both are dropped.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let shared = Arc::clone(&self.shared);
        shared.handles.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let write = OwnedWriteHalf { shared: Arc::clone(&shared), wait: Mutex::default(), shutdown_on_drop: true };
        (OwnedReadHalf { shared, wait: Mutex::default(), _stream: Arc::new(self) }, write)
    }
}

/// The reading half of a [`Stream`] ([`Stream::into_split`]).
pub struct OwnedReadHalf {
    shared: Arc<Shared>,
    wait: Mutex<AsyncWait>,
    /// Keeps the stream (its timeouts, its drop) alive with the read half.
    _stream: Arc<Stream>,
}

/// The writing half of a [`Stream`] ([`Stream::into_split`]). Dropping it ends this direction,
/// as `tokio::net::tcp::OwnedWriteHalf` does.
pub struct OwnedWriteHalf {
    shared: Arc<Shared>,
    wait: Mutex<AsyncWait>,
    shutdown_on_drop: bool,
}

impl std::fmt::Debug for OwnedReadHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedReadHalf").field("peer", &self.shared.conn.peer_addr()).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for OwnedWriteHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedWriteHalf").field("peer", &self.shared.conn.peer_addr()).finish_non_exhaustive()
    }
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        poll_read(&this.shared, this.wait.get_mut(), cx, buf)
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            self.shared.state.lock().shutdown();
        }
        self.shared.release_handle();
    }
}
