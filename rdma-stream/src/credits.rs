//! The flow control of one stream: how many messages a side may send, and when it must tell
//! its peer what it has freed. No I/O here; docs/stream.md explains why these rules cannot
//! deadlock.
//!
//! A credit is one receive posted at the peer. Both sides use the same window, the smaller of
//! the two hellos' `messages` (a side may post more receives than that; the window is what
//! both reckon with, so that the reader's rule for reporting matches what the writer holds).
//! A side spends one credit per message it sends (data, a report, the end of its direction),
//! and learns from the immediate of every message the peer sends how many receives the peer
//! has freed and posted again. So no message ever arrives without a receive posted for it (no
//! receiver-not-ready, no retry).
//!
//! - **Only a report may take the last credit:** data and an end sent alone need two credits,
//!   a report one. So a side whose messages filled the peer's window can still send the
//!   report that opens its own. (An end alone returns nothing to the peer: had it taken the
//!   last credit, a peer stuck one credit short with its reader busy would wait for a report
//!   this side could no longer send.)
//! - **A message that is not full goes at once only while more than half the window is
//!   open;** below that, writes fill it until it is full, or the stream is flushed, shut down,
//!   or read with nothing to read. So small writes cannot spend the window one receive each.
//! - **A report is due** when the peer's window, as far as this side knows it, is at most half
//!   open, this side holds freed receives it has not reported, and either it has read
//!   everything that arrived (it is about to wait) or it holds half a window of them. So a
//!   writer that filled the window gets its credits back in batches while the reader works
//!   through the messages, and at once when the reader waits for more.
//! - A report restores the peer's whole window and lowers this side's by one, so two peers
//!   whose windows are both low trade at most two reports before neither is due.
//! - Every message carries the count, so data flowing the other way returns credits at no
//!   cost.

use crate::wire::{count_diff, Imm, COUNT_MASK};

/// The credit state of one stream, both directions.
#[derive(Debug, Clone)]
pub(crate) struct Credits {
    /// Receives the peer posted for this side (its hello's `messages`).
    peer_messages: u32,
    /// Messages this side sent (mod 2^31).
    sent: u32,
    /// The peer's count of receives freed, from its latest message (mod 2^31).
    peer_freed: u32,
    /// Receives this side posted for the peer (its own hello's `messages`).
    messages: u32,
    /// Messages received (mod 2^31).
    received: u32,
    /// Receives freed and posted again (mod 2^31).
    freed: u32,
    /// `freed` as last sent to the peer.
    reported: u32,
}

/// A peer broke the flow control: it sent what it had no credit for, or returned credits for
/// messages never sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    /// More messages arrived than receives were posted.
    Overrun,
    /// The peer says it freed receives this side never filled.
    FreedUnsent,
}

impl Credits {
    /// The state at connection between a side whose hello said `own` messages and a peer whose
    /// hello said `peer`: both reckon with the smaller window.
    pub(crate) fn between(own: u32, peer: u32) -> Self {
        Self::new(own.min(peer))
    }

    /// The state at connection with a window of `window` messages each way.
    fn new(window: u32) -> Self {
        Credits { peer_messages: window, sent: 0, peer_freed: 0, messages: window, received: 0, freed: 0, reported: 0 }
    }

    /// Receives free at the peer, as far as this side knows.
    pub(crate) fn available(&self) -> u32 {
        self.peer_messages - count_diff(self.sent, self.peer_freed)
    }

    /// Whether a data message, or an end without data, may go now (it keeps one credit for a
    /// report).
    pub(crate) fn may_send_data(&self) -> bool {
        self.available() >= 2
    }

    /// Whether a report may go now.
    pub(crate) fn may_send_control(&self) -> bool {
        self.available() >= 1
    }

    /// Whether a message that is not full should go now rather than wait to be filled: more
    /// than half the window is open.
    pub(crate) fn may_send_partial(&self) -> bool {
        self.available() > self.peer_messages / 2
    }

    /// A message goes: the immediate it carries.
    pub(crate) fn on_send(&mut self, fin: bool) -> Imm {
        debug_assert!(self.may_send_control());
        self.sent = (self.sent + 1) & COUNT_MASK;
        self.reported = self.freed;
        Imm { freed: self.freed, fin }
    }

    /// A message arrived with `imm`.
    pub(crate) fn on_receive(&mut self, imm: Imm) -> Result<(), Violation> {
        if count_diff(self.received, self.freed) >= self.messages {
            return Err(Violation::Overrun);
        }
        if count_diff(imm.freed, self.peer_freed) > count_diff(self.sent, self.peer_freed) {
            return Err(Violation::FreedUnsent);
        }
        self.received = (self.received + 1) & COUNT_MASK;
        self.peer_freed = imm.freed;
        Ok(())
    }

    /// A receive was freed and posted again (its data read, or at once for a message without
    /// data).
    pub(crate) fn on_freed(&mut self) {
        self.freed = (self.freed + 1) & COUNT_MASK;
    }

    /// The peer's credits as far as the peer can know them: receives posted here less the
    /// messages received since the last report.
    fn peer_window(&self) -> u32 {
        self.messages.saturating_sub(count_diff(self.received, self.reported))
    }

    /// Whether a report should go now, even without data to carry it; `idle`: everything that
    /// arrived has been read.
    pub(crate) fn report_due(&self, idle: bool) -> bool {
        let unreported = count_diff(self.freed, self.reported);
        unreported > 0 && self.peer_window() <= self.messages / 2 && (idle || unreported >= self.messages / 2)
    }

    /// Whether this side holds freed receives it has not reported.
    #[cfg(test)]
    fn unreported(&self) -> bool {
        self.freed != self.reported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sides' credits and the messages in flight between them, in order.
    struct Pair {
        side: [Credits; 2],
        /// Messages in flight towards side `i`: (imm, carries data).
        wire: [std::collections::VecDeque<(Imm, bool)>; 2],
        /// Data messages received and not yet consumed by side `i`'s reader.
        unread: [u32; 2],
    }

    impl Pair {
        fn new(r: u32) -> Self {
            Self::between(r, r)
        }
        /// Side 0's hello said `a` messages, side 1's `b`.
        fn between(a: u32, b: u32) -> Self {
            Pair { side: [Credits::between(a, b), Credits::between(b, a)], wire: Default::default(), unread: [0, 0] }
        }
        fn send(&mut self, from: usize, data: bool) {
            let imm = self.side[from].on_send(false);
            self.wire[1 - from].push_back((imm, data));
        }
        /// The end of `from`'s direction, without data, if the credits let it go.
        fn send_end(&mut self, from: usize) -> bool {
            if !self.side[from].may_send_data() {
                return false;
            }
            let imm = self.side[from].on_send(true);
            self.wire[1 - from].push_back((imm, false));
            true
        }
        /// Delivers what is in flight to side `to`, which then reports if due (as a stream's
        /// progress does after every poll).
        fn deliver(&mut self, to: usize) {
            while let Some((imm, data)) = self.wire[to].pop_front() {
                self.side[to].on_receive(imm).expect("within the credits");
                if data {
                    self.unread[to] += 1;
                } else {
                    self.side[to].on_freed();
                }
            }
            self.maybe_report(to);
        }
        fn maybe_report(&mut self, at: usize) {
            if self.side[at].report_due(self.unread[at] == 0) && self.side[at].may_send_control() {
                self.send(at, false);
            }
        }
        fn read_one(&mut self, at: usize) {
            assert!(self.unread[at] > 0);
            self.unread[at] -= 1;
            self.side[at].on_freed();
            self.maybe_report(at);
        }
    }

    #[test]
    fn a_writer_fills_the_window_less_one_and_a_reader_opens_it_again() {
        let mut p = Pair::new(4);
        let mut sent = 0;
        while p.side[0].may_send_data() {
            p.send(0, true);
            sent += 1;
        }
        assert_eq!(sent, 3, "data keeps one credit back");
        p.deliver(1);
        p.read_one(1);
        assert!(p.wire[0].is_empty(), "one of three read, more to read: no report yet");
        p.read_one(1);
        assert_eq!(p.wire[0].len(), 1, "half the window freed: a report goes");
        p.deliver(0);
        assert_eq!(p.side[0].available(), 3);
        p.read_one(1);
        assert!(p.wire[0].is_empty(), "the window is over half open again");
        let mut p = Pair::new(16);
        for _ in 0..15 {
            p.send(0, true);
        }
        p.deliver(1);
        let mut reports = 0;
        for _ in 0..15 {
            p.read_one(1);
            reports += p.wire[0].len();
            p.deliver(0);
        }
        assert_eq!(reports, 1, "credits come back in a batch of half a window");
        assert!(p.side[0].available() >= 8, "the writer has half its window again");
    }

    #[test]
    fn two_idle_peers_do_not_trade_reports() {
        let mut p = Pair::new(4);
        for _ in 0..3 {
            p.send(0, true);
        }
        p.deliver(1);
        for _ in 0..3 {
            p.read_one(1);
        }
        p.deliver(0); // side 0 frees the report's receive at once
        assert!(!p.side[0].report_due(true), "side 1's window is open: no report back");
        assert!(p.side[0].unreported(), "it rides on the next message");
    }

    #[test]
    fn both_sides_writing_and_reading_never_stall_while_readers_read() {
        // Random interleavings of two writers and two readers: whenever a writer cannot send,
        // some step (a delivery or a read) is still possible, until every message is read.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for r in [3u32, 4, 5, 8, 16] {
            let mut p = Pair::new(r);
            let mut left = [200u32, 200];
            let mut steps = 0;
            while left != [0, 0] || p.unread != [0, 0] || !p.wire[0].is_empty() || !p.wire[1].is_empty() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let side = (seed & 1) as usize;
                match (seed >> 1) % 3 {
                    0 if left[side] > 0 && p.side[side].may_send_data() => {
                        p.send(side, true);
                        left[side] -= 1;
                    }
                    1 => p.deliver(side),
                    2 if p.unread[side] > 0 => p.read_one(side),
                    _ => {}
                }
                steps += 1;
                assert!(steps < 1_000_000, "stalled with r = {r}: left {left:?}, unread {:?}", p.unread);
            }
        }
    }

    #[test]
    fn a_peer_that_overruns_or_frees_what_was_never_sent_is_refused() {
        let mut c = Credits::new(2);
        c.on_receive(Imm { freed: 0, fin: false }).unwrap();
        c.on_receive(Imm { freed: 0, fin: false }).unwrap();
        assert_eq!(c.on_receive(Imm { freed: 0, fin: false }), Err(Violation::Overrun));
        let mut c = Credits::new(2);
        assert_eq!(c.on_receive(Imm { freed: 1, fin: false }), Err(Violation::FreedUnsent));
    }

    #[test]
    fn peers_whose_hellos_differ_move_every_message_one_way() {
        // The writer's window is the smaller hello; the reader must report by that window, not
        // by the receives it posted, or a one-way transfer stops once the writer's credits are
        // spent and the reader still thinks half its window is open.
        for (a, b) in [(16, 32), (32, 16), (4, 16), (3, 8), (16, 16)] {
            let mut p = Pair::between(a, b);
            let mut moved = 0;
            for _ in 0..10_000 {
                while moved < 1_000 && p.side[0].may_send_data() {
                    p.send(0, true);
                    moved += 1;
                }
                p.deliver(1);
                while p.unread[1] > 0 {
                    p.read_one(1);
                }
                p.deliver(0);
            }
            assert_eq!(moved, 1_000, "hellos {a} and {b}: the writer stalled");
        }
    }

    #[test]
    fn an_end_sent_alone_leaves_the_credit_for_the_report_the_peers_writer_needs() {
        // Side 0 fills side 1's window and ends its direction; side 1, which never reads,
        // writes on. Side 0 reads all of it: its reports must keep side 1's writes going.
        let mut p = Pair::new(16);
        while p.side[0].may_send_data() {
            p.send(0, true);
        }
        let mut written = 0;
        while p.side[1].may_send_data() {
            p.send(1, true);
            written += 1;
        }
        let _held_back = !p.send_end(0);
        for _ in 0..200 {
            p.deliver(0);
            while p.unread[0] > 0 {
                p.read_one(0);
            }
            let _ = p.send_end(0);
            p.deliver(1);
            while p.side[1].may_send_data() {
                p.send(1, true);
                written += 1;
            }
        }
        assert!(written > 1_000, "side 1 wrote only {written} messages: it stalled one credit short");
    }
}
