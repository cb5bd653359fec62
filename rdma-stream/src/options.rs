//! [`Options`]: how a stream's buffers are sized and how its waits wait.

use std::time::Duration;

use rdma_verbs::WaitPolicy;

/// How a stream is built: its message size and window, the bound of connecting and accepting,
/// and how its waits spin before they sleep.
///
/// Each side receives into `messages` buffers of `message_size` bytes, registered once: that is
/// the window the peer may fill before this side reads (less one message, kept for flow
/// control; see docs/stream.md). Each side sends messages of at most the smaller of its own
/// and the peer's `message_size`, from at most the smaller of the two `messages` buffers. A
/// stream therefore holds about `2 × messages × message_size` bytes of registered memory.
///
/// ```
/// let options = rdma_stream::Options::new().message_size(256 << 10).messages(32);
/// assert_eq!(options.window(), 31 * (256 << 10));
/// ```
#[derive(Debug, Clone)]
#[must_use = "options do nothing until a stream is built with them"]
pub struct Options {
    pub(crate) message_size: usize,
    pub(crate) messages: u32,
    pub(crate) inline: u32,
    pub(crate) connect_timeout: Duration,
    pub(crate) drain_timeout: Duration,
    pub(crate) wait: WaitPolicy,
}

/// The largest `messages`: counts travel modulo 2^31, and a QP takes far fewer receives.
pub const MAX_MESSAGES: u32 = 1 << 20;

impl Default for Options {
    fn default() -> Self {
        Options {
            message_size: 64 << 10,
            messages: 16,
            inline: 128,
            connect_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(2),
            wait: WaitPolicy::default(),
        }
    }
}

impl Options {
    /// The defaults: 16 messages of 64 KiB each way, 128 bytes of inline data, 10 s to connect,
    /// the library's default wait (spin 50 µs, then sleep on the completion channel).
    pub fn new() -> Self {
        Self::default()
    }

    /// The size of each receive buffer, the largest message the peer may send. At least 1;
    /// a size the device cannot register fails when the stream is built.
    pub fn message_size(mut self, bytes: usize) -> Self {
        self.message_size = bytes;
        self
    }

    /// How many receive buffers each side posts (at least 3, at most [`MAX_MESSAGES`] and the
    /// device's queue depth).
    pub fn messages(mut self, n: u32) -> Self {
        self.messages = n;
        self
    }

    /// Messages of at most this many bytes are sent as inline data (copied into the send queue
    /// by the post, no registered buffer read by the device). Lowered to what the device takes.
    pub fn inline(mut self, bytes: u32) -> Self {
        self.inline = bytes;
        self
    }

    /// The bound of resolving and connecting when a connect is awaited, and of an accept's
    /// handshake.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long dropping a stream waits for its messages in flight to be acknowledged before it
    /// tears the connection down.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How the stream's waits wait for completions.
    pub fn wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.wait = policy;
        self
    }

    /// The bytes the peer may send before this side reads: `(messages - 1) × message_size`.
    pub fn window(&self) -> usize {
        (self.messages.saturating_sub(1) as usize).saturating_mul(self.message_size)
    }

    /// Checks what does not depend on a device.
    pub(crate) fn check(&self) -> Result<(), crate::Error> {
        if self.message_size == 0 || self.message_size > u32::MAX as usize {
            return Err(crate::Error::Options(format!(
                "message size {}: it must be 1..={} bytes",
                self.message_size,
                u32::MAX
            )));
        }
        if !(3..=MAX_MESSAGES).contains(&self.messages) {
            return Err(crate::Error::Options(format!(
                "{} messages: a stream needs 3..={MAX_MESSAGES} (one is kept for flow control)",
                self.messages
            )));
        }
        Ok(())
    }
}
