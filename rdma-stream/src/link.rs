//! One connection's data path: the queues, the credits, the messages read and written, and
//! the one function, [`State::progress`], that takes what completed and sends what may go.
//!
//! Every operation of a stream, blocking or async, from either half, locks the [`State`],
//! calls `progress`, and then reads or writes. So whichever side of a program touches the
//! stream moves both directions on: a writer waiting for credits takes the peer's data off
//! the queue too, and a reader posts what a writer left waiting for credits.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::task::Waker;

use parking_lot::{Condvar, Mutex};
use rdma_cm::{Connection, Event};
use rdma_verbs::{
    CompletionQueue, CqWaiter, Rc, RecvRing, SendQueue, Slot, SlotMessage, SlotPool, SlotRequest, WaitPolicy,
};

use crate::credits::{Credits, Violation};
use crate::wire::Imm;

/// What one stream shares between its halves and its waits.
pub(crate) struct Shared {
    /// Dropped first: the queues drain (messages in flight are acknowledged, within the drain
    /// timeout) before the connection below sends its disconnect.
    pub(crate) state: Mutex<State>,
    /// Blocking waits that found another thread sleeping on the channel wait here.
    pub(crate) turn: Condvar,
    pub(crate) send_cq: Arc<CompletionQueue<'static>>,
    pub(crate) recv_cq: Arc<CompletionQueue<'static>>,
    pub(crate) policy: WaitPolicy,
    /// How long the drop waits for what was written to go.
    pub(crate) drain: std::time::Duration,
    pub(crate) conn: Connection<'static>,
    /// The user's handles on the stream (the stream, its write half): the last one dropped on
    /// a runtime closes the stream on a task of that runtime.
    #[cfg(feature = "tokio")]
    pub(crate) handles: std::sync::atomic::AtomicUsize,
}

impl Drop for Shared {
    /// Ends this direction after what was written (as `close` does a TCP socket's) and waits, up
    /// to the drain timeout, until everything sent is acknowledged, the peer is gone or the
    /// stream failed (unless an async close did so already). Then the QP is flushed, so that
    /// the queues drop without waiting for a peer that will not answer, and the connection
    /// disconnects last.
    fn drop(&mut self) {
        let st = self.state.get_mut();
        st.shutdown();
        if !st.drained {
            let until = rdma_verbs::Deadline::after(self.drain);
            let _ = self.wait_blocking(until, "closing", State::drained);
        }
        let _ = self.conn.qp().flush();
    }
}

/// A received message and how much of it was read.
struct Inbound {
    message: SlotMessage<'static>,
    read: usize,
}

/// Whether this side's direction has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Open,
    /// `shutdown` asked; the end goes with the next message credits allow.
    Ending,
    Ended,
}

/// What a failure leaves: every later operation reports it again.
#[derive(Debug, Clone)]
struct Failure {
    kind: io::ErrorKind,
    message: String,
}

/// The data path's state, behind [`Shared::state`].
pub(crate) struct State {
    sq: SendQueue<'static, Rc>,
    ring: RecvRing<'static>,
    /// Send buffers of `send_size` bytes.
    pool: SlotPool<'static>,
    send_size: usize,
    inline_max: usize,
    credits: Credits,
    inbox: VecDeque<Inbound>,
    /// The message being filled by writes, and its length.
    open: Option<(Slot<'static>, usize)>,
    direction: Direction,
    /// The peer's direction ended (its end arrived); reads return 0 once the inbox is empty.
    eof: bool,
    /// The peer disconnected.
    disconnected: bool,
    failure: Option<Failure>,
    /// A blocking wait sleeps on the channel (the others wait on [`Shared::turn`]).
    pub(crate) sleeping: bool,
    /// The next `progress` reads the CM channel: a sleep ended (the CM fd may have woken it) or
    /// a completion failed.
    pub(crate) cm_due: bool,
    /// `progress` calls since the CM channel was last read.
    since_cm: u32,
    /// The async waits to wake when `progress` changes something: the last waker of a read
    /// and of a write (flush, shutdown), as a `TcpStream` keeps them.
    pub(crate) wakers: [Option<Waker>; 2],
    /// The waiter of blocking waits, kept across them.
    pub(crate) waiter: Option<CqWaiter>,
    /// The closing drain is over (an async close ran it): the drop need not wait again.
    pub(crate) drained: bool,
}

/// How many `progress` steps may pass without reading the CM channel while nothing sleeps.
const CM_EVERY: u32 = 64;

/// The kind of an async wait, for its waker's place.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Read = 0,
    /// A write, a flush or a shutdown.
    Write = 1,
}

/// What [`State::read`] found.
pub(crate) enum ReadOutcome {
    /// Bytes were copied (0: the peer's direction ended and everything was read).
    Read(usize),
    /// Nothing to read yet.
    Empty,
}

impl State {
    /// The state of a connection whose receives `ring` posted, with `pool` to send from.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        sq: SendQueue<'static, Rc>,
        ring: RecvRing<'static>,
        pool: SlotPool<'static>,
        inline_max: usize,
        credits: Credits,
        policy: WaitPolicy,
    ) -> Self {
        State {
            send_size: pool.slot_size(),
            sq,
            ring,
            pool,
            inline_max,
            credits,
            inbox: VecDeque::new(),
            open: None,
            direction: Direction::Open,
            eof: false,
            disconnected: false,
            failure: None,
            sleeping: false,
            cm_due: true,
            since_cm: 0,
            wakers: [None, None],
            waiter: Some(CqWaiter::new(policy)),
            drained: false,
        }
    }

    /// Takes every CM event and completion there is, and sends what credits allow: a message
    /// writes left open, the end of this direction, a report that is due. Whether
    /// anything changed (a waiting reader or writer should look again).
    pub(crate) fn progress(&mut self, conn: &Connection<'_>) -> bool {
        let mut changed = false;
        // The CM's events first: a disconnect seen before the queues are polled leaves no
        // message that arrived before it behind in the receive queue. Reading the CM channel
        // costs a syscall that almost always finds nothing, so a spinning wait reads it only
        // every CM_EVERY steps; a sleep that the CM fd ended and a failed completion make the
        // next read due.
        self.since_cm += 1;
        if self.cm_due || self.since_cm >= CM_EVERY {
            changed |= self.take_cm_events(conn);
        }
        if conn.peer_disconnected() && !self.disconnected {
            self.disconnected = true;
            changed = true;
        }
        let mut failed = None;
        if let Err(e) = self.sq.poll(|c| {
            changed = true;
            if let Err(e) = c.ok() {
                failed.get_or_insert(e.to_string());
            }
        }) {
            failed.get_or_insert(e.to_string());
        }
        if let Some(message) = failed {
            self.fail(io::ErrorKind::ConnectionReset, message);
        }
        loop {
            match self.ring.try_recv() {
                Ok(Some(message)) => {
                    changed = true;
                    self.take_message(message);
                }
                Ok(None) => break,
                Err(e) => {
                    changed = true;
                    self.fail(io::ErrorKind::ConnectionReset, e.to_string());
                    break;
                }
            }
        }
        if self.failure.is_some() && !self.disconnected {
            // A failed completion: whether the peer left says what it means.
            changed |= self.take_cm_events(conn);
        }
        if self.send_pending(false) {
            changed = true;
        }
        changed
    }

    /// Takes the connection's CM events (a disconnect); whether anything changed.
    fn take_cm_events(&mut self, conn: &Connection<'_>) -> bool {
        self.cm_due = false;
        self.since_cm = 0;
        let mut changed = false;
        while !self.disconnected {
            match conn.try_recv_event() {
                Ok(Some(Event::Disconnected)) => {
                    self.disconnected = true;
                    changed = true;
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    self.fail(io::ErrorKind::ConnectionReset, e.to_string());
                    changed = true;
                    break;
                }
            }
        }
        changed
    }

    /// A received message: its credits, its end, its bytes.
    fn take_message(&mut self, message: SlotMessage<'static>) {
        if let Err(e) = message.ok() {
            // A flush after the peer ended its direction and left is no failure of the reads.
            let kind = if self.eof { io::ErrorKind::BrokenPipe } else { io::ErrorKind::ConnectionReset };
            self.fail(kind, e.to_string());
            return;
        }
        let Some(imm) = message.imm() else {
            return self.violation("a message without its immediate value");
        };
        let imm = Imm::decode(imm);
        match self.credits.on_receive(imm) {
            Ok(()) => {}
            Err(Violation::Overrun) => return self.violation("more messages than receives posted"),
            Err(Violation::FreedUnsent) => return self.violation("credits returned for messages never sent"),
        }
        let has_data = !message.bytes().is_empty();
        if has_data && self.eof {
            return self.violation("data after the end of its direction");
        }
        if has_data {
            self.inbox.push_back(Inbound { message, read: 0 });
        } else if let Err(e) = self.ring.release(message) {
            self.fail(io::ErrorKind::ConnectionReset, e.to_string());
        } else {
            self.credits.on_freed();
        }
        if imm.fin {
            self.eof = true;
        }
    }

    fn violation(&mut self, what: &'static str) {
        self.fail(io::ErrorKind::InvalidData, crate::Error::Protocol(what).to_string());
    }

    fn fail(&mut self, kind: io::ErrorKind, message: String) {
        self.failure.get_or_insert(Failure { kind, message });
    }

    /// The failure every operation reports from now on, if there is one.
    fn failed(&self) -> Option<io::Error> {
        self.failure.as_ref().map(|f| io::Error::new(f.kind, f.message.clone()))
    }

    /// Posts what may go now; whether anything went. `push`: a message that is not full goes
    /// even when half the window or less is open (a flush, or a read with nothing to read).
    fn send_pending(&mut self, push: bool) -> bool {
        if self.failure.is_some() {
            return false;
        }
        let mut sent = false;
        let ending = self.direction == Direction::Ending;
        let partial_may_go = push || ending || self.credits.may_send_partial();
        if self.open.as_ref().is_some_and(|(_, len)| *len > 0 && (*len == self.send_size || partial_may_go)) {
            match self.post_open(ending) {
                Ok(true) => {
                    sent = true;
                    if ending {
                        self.direction = Direction::Ended;
                    }
                }
                Ok(false) => {}
                Err(e) => self.fail(io::ErrorKind::ConnectionReset, e.to_string()),
            }
        } else if ending && self.open_len() == 0 && self.credits.may_send_data() && self.sq.room() > 0 {
            match self.post_control(true) {
                Ok(()) => {
                    sent = true;
                    self.direction = Direction::Ended;
                }
                Err(e) => self.fail(io::ErrorKind::ConnectionReset, e.to_string()),
            }
        }
        if self.credits.report_due(self.inbox.is_empty()) && self.credits.may_send_control() && self.sq.room() > 0 {
            match self.post_control(false) {
                Ok(()) => sent = true,
                Err(e) => self.fail(io::ErrorKind::ConnectionReset, e.to_string()),
            }
        }
        sent
    }

    /// Bytes written into the open message and not yet posted.
    fn open_len(&self) -> usize {
        self.open.as_ref().map_or(0, |(_, len)| *len)
    }

    /// Posts the open message if credits and the queue allow; whether it went.
    fn post_open(&mut self, fin: bool) -> rdma_verbs::Result<bool> {
        if !self.credits.may_send_data() || self.sq.room() == 0 {
            return Ok(false);
        }
        let Some((slot, len)) = self.open.take() else { return Ok(false) };
        let imm = self.credits.on_send(fin).encode();
        if len <= self.inline_max {
            let result = slot.as_slice().and_then(|bytes| self.sq.send_inline(&bytes[..len], Some(imm), 0));
            self.open = Some((slot, 0));
            result?;
        } else {
            let request = SlotRequest::send(slot, len).with_imm(imm);
            self.sq.push(request).map_err(|rejected| rejected.error)?;
            self.sq.submit()?;
        }
        Ok(true)
    }

    /// Posts a message without data: a report, or the end of this direction.
    fn post_control(&mut self, fin: bool) -> rdma_verbs::Result<()> {
        let imm = self.credits.on_send(fin).encode();
        self.sq.send_inline(&[], Some(imm), 0)
    }

    /// Copies received bytes into `buf`: as many as there are, up to its length.
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        let mut at = 0;
        self.read_into(buf.len(), |bytes| {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        })
    }

    /// Hands received bytes to `put`, in pieces, up to `room` bytes in all (so that a caller's
    /// buffer need not be initialized first).
    pub(crate) fn read_into(&mut self, room: usize, mut put: impl FnMut(&[u8])) -> io::Result<ReadOutcome> {
        let mut n = 0;
        while n < room {
            let Some(front) = self.inbox.front_mut() else { break };
            let bytes = &front.message.bytes()[front.read..];
            let k = bytes.len().min(room - n);
            put(&bytes[..k]);
            front.read += k;
            n += k;
            if front.read == front.message.bytes().len() {
                let done = self.inbox.pop_front().expect("the front message");
                if let Err(e) = self.ring.release(done.message) {
                    // The bytes copied are the caller's; the failure is every later call's.
                    self.fail(io::ErrorKind::ConnectionReset, e.to_string());
                    break;
                }
                self.credits.on_freed();
            }
        }
        if n > 0 || room == 0 {
            self.send_pending(false);
            return Ok(ReadOutcome::Read(n));
        }
        // Nothing to read: this side is about to wait, so what it wrote goes now.
        self.send_pending(true);
        if self.eof {
            return Ok(ReadOutcome::Read(0));
        }
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if self.disconnected {
            return Err(crate::Error::PeerDisconnected.into());
        }
        Ok(ReadOutcome::Empty)
    }

    /// Copies bytes of `buf` into messages, and posts those credits allow: how many were
    /// taken, or `None` when no buffer has room (the peer's window is full).
    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<Option<usize>> {
        self.write_vectored(&[io::IoSlice::new(buf)])
    }

    /// [`write`](Self::write) of the bytes of `bufs` in order, into the same messages: a
    /// caller that hands several pieces at once (a frame's header and its payload) sends them
    /// as one message when they fit.
    pub(crate) fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<Option<usize>> {
        self.writable()?;
        let mut n = 0;
        for buf in bufs {
            let k = self.fill(buf)?;
            n += k;
            if k < buf.len() {
                break;
            }
        }
        if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Ok(None);
        }
        self.send_pending(false);
        Ok(Some(n))
    }

    /// Copies bytes of `buf` into the open message, posting each message that fills up while
    /// credits allow: how many were taken.
    fn fill(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            if self.open.is_none() {
                match self.pool.try_take() {
                    Some(slot) => self.open = Some((slot, 0)),
                    None => break,
                }
            }
            let (slot, len) = self.open.as_mut().expect("an open message");
            let k = (self.send_size - *len).min(buf.len() - n);
            slot.write_at(*len, &buf[n..n + k]).map_err(io::Error::other)?;
            *len += k;
            n += k;
            if *len == self.send_size && !self.post_open(false).map_err(|e| self.reset(e))? {
                break;
            }
        }
        Ok(n)
    }

    /// Whether a write may go on: this direction is open and nothing failed.
    fn writable(&self) -> io::Result<()> {
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if self.direction != Direction::Open {
            return Err(crate::Error::Shutdown.into());
        }
        if self.disconnected {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, crate::Error::PeerDisconnected));
        }
        Ok(())
    }

    /// A failed post: the connection is broken.
    fn reset(&mut self, e: rdma_verbs::Error) -> io::Error {
        self.fail(io::ErrorKind::ConnectionReset, e.to_string());
        self.failed().expect("just failed")
    }

    /// Whether everything written has been posted (a flush is over): `Err` when it never will be.
    pub(crate) fn flushed(&mut self) -> io::Result<bool> {
        if self.open_len() > 0 {
            self.send_pending(true);
        }
        let pending = self.open_len() > 0 || self.direction == Direction::Ending;
        if !pending {
            return Ok(true);
        }
        if let Some(e) = self.failed() {
            return Err(e);
        }
        if self.disconnected {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, crate::Error::PeerDisconnected));
        }
        Ok(false)
    }

    /// The closing drain's result, once there is one: everything written was posted and
    /// acknowledged, or never will be (the peer left, the stream failed).
    pub(crate) fn drained(&mut self) -> Option<io::Result<()>> {
        match self.flushed() {
            Ok(true) if self.in_flight() == 0 || self.gone() => Some(Ok(())),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether nothing more can be acknowledged: the peer left or the stream failed.
    pub(crate) fn gone(&self) -> bool {
        self.disconnected || self.failure.is_some()
    }

    /// Messages posted and not yet acknowledged.
    pub(crate) fn in_flight(&self) -> usize {
        self.sq.in_flight()
    }

    /// Ends this direction: the end goes with the next message credits allow.
    pub(crate) fn shutdown(&mut self) {
        if self.direction == Direction::Open {
            self.direction = Direction::Ending;
            self.send_pending(true);
        }
    }

    /// Takes the async waits' wakers, to be woken once the state is unlocked (each then looks
    /// at the state again).
    pub(crate) fn take_wakers(&mut self) -> [Option<Waker>; 2] {
        [self.wakers[0].take(), self.wakers[1].take()]
    }

    /// Registers the waker of an async wait of kind `op`, in place of the last one.
    #[cfg(feature = "tokio")]
    pub(crate) fn register(&mut self, op: Op, waker: &Waker) {
        let slot = &mut self.wakers[op as usize];
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }
}
