//! The sender and receiver machines driven against each other in memory, with a simulated driver
//! (a file, a slot ring, an output file, a fake clock) and a simulated network: files of every
//! edge size arrive identical through rings as small as two slots, memory stays bounded, refusals
//! and corruption end with the right status at both ends, and a hostile network (reordering,
//! duplicating, dropping, truncating, corrupting) never makes either machine panic, hang, or
//! report success for bytes that differ from the file.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use rdma_proto::receiver::{self, Receiver, ReceiverConfig};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{self, caps, Ack, Credit, Fin, Grant, Hello, Message};
use rdma_proto::{Outcome, ProtocolError, Status};

/// Address of slot 0 of the receiver's ring, as the simulated driver registers it.
const RING_ADDR: u64 = 0x7f3a_0000_4000;
/// The ring's rkey.
const RKEY: u32 = 0xbeef;
/// The session id every test sender uses.
const SESSION: u64 = 0x5e55_1011_0000_0001;

/// The test's whole-file digest: FNV-1a on 128 bits (the core does not hash; the driver's
/// digest is XXH3-128, of the same length).
fn digest(data: &[u8]) -> Vec<u8> {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for &b in data {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h.to_be_bytes()[..wire::DIGEST_LEN].to_vec()
}

/// xorshift64*: the seeded randomness of the simulation.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that seeds 0, 1, 2... start far apart (and never at 0).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }
    fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// What the network does to packets, each in events per thousand packets (per thousand steps
/// for `clock_jump`).
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// Deliver a random packet in flight instead of the oldest.
    reorder: u32,
    /// Lose a packet (a lost WRITE may still complete at the sender).
    drop: u32,
    /// Deliver a packet twice (the copy at a random later point).
    duplicate: u32,
    /// Cut a packet short.
    truncate: u32,
    /// Flip a byte of a WRITE's data.
    corrupt: u32,
    /// A WRITE's data lands but its arrival (the receive completion) is lost.
    lose_arrival: u32,
    /// Jump the clock to the earliest deadline, so that a timeout fires mid-session.
    clock_jump: u32,
}

impl Faults {
    fn any(&self) -> bool {
        let f = *self;
        f.reorder + f.drop + f.duplicate + f.truncate + f.corrupt + f.lose_arrival + f.clock_jump > 0
    }
}

/// Hooks of the simulated receiver driver.
#[derive(Debug, Clone, Default)]
struct Hooks {
    /// Answer the Open with this failure.
    open_fails: Option<Status>,
    /// Flip a byte of this chunk's slot just before it is stored.
    corrupt_slot_of: Option<u64>,
    /// Fail storing this chunk with this status.
    store_fails: Option<(u64, Status)>,
    /// Deliver nothing more to either side after this many packets reached the receiver.
    blackout_after: Option<u64>,
}

enum Packet {
    Control(Vec<u8>),
    Write { seq: u64, imm: u32, remote_addr: u64, rkey: u32, data: Vec<u8> },
}

struct InFlight {
    packet: Packet,
    /// A duplicate made by the network (never duplicated again).
    copy: bool,
}

impl InFlight {
    fn duplicate(&self) -> InFlight {
        let packet = match &self.packet {
            Packet::Control(b) => Packet::Control(b.clone()),
            Packet::Write { seq, imm, remote_addr, rkey, data } => {
                Packet::Write { seq: *seq, imm: *imm, remote_addr: *remote_addr, rkey: *rkey, data: data.clone() }
            }
        };
        InFlight { packet, copy: true }
    }
}

enum SendJob {
    Read { seq: u64, offset: u64, len: u32 },
    Digest,
}

enum RecvJob {
    Open { size: u64, slot_size: u32, slot_count: u32 },
    Store { seq: u64, slot: u32, offset: u64, len: u32 },
    Finalize { digest: Vec<u8> },
}

/// The receiver's temporary file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Temp {
    None,
    Open,
    Committed,
    Discarded,
}

/// Both machines, both drivers, the network between them and the clock.
struct Sim {
    label: String,
    rng: Rng,
    faults: Faults,
    hooks: Hooks,
    now: Instant,
    steps: u64,
    trace: VecDeque<String>,

    file: Vec<u8>,
    depth: u32,
    sender: Sender,
    send_jobs: VecDeque<SendJob>,
    /// Chunks read into local slots and not yet handed to the network.
    local: BTreeMap<u64, Vec<u8>>,
    reads_asked: u64,
    /// WRITEs delivered (or lost) whose completion the sender has not been told.
    completions: Vec<u64>,
    /// Chunks whose WRITE completion the sender was told (`WriteDone` of the last one).
    write_done: u64,
    /// The highest CREDIT delivered to the sender.
    credit_seen: u64,
    max_local_slots: u64,
    sender_outcome: Option<Outcome>,

    to_receiver: VecDeque<InFlight>,
    to_sender: VecDeque<InFlight>,
    delivered_to_receiver: u64,

    receiver: Receiver,
    recv_jobs: VecDeque<RecvJob>,
    ring: Vec<u8>,
    geometry: Option<(u32, u32)>,
    output: Vec<u8>,
    temp: Temp,
    stores_asked: u64,
    stored: u64,
    max_ring_in_use: u64,
    acks_sent: Vec<Status>,
    receiver_outcome: Option<Outcome>,
}

impl Sim {
    #[allow(clippy::too_many_arguments)]
    fn new(
        label: String,
        seed: u64,
        file: Vec<u8>,
        name: &str,
        sender_cfg: SenderConfig,
        receiver_cfg: ReceiverConfig,
        faults: Faults,
        hooks: Hooks,
    ) -> Sim {
        let now = Instant::now();
        let depth = sender_cfg.depth;
        let sender = Sender::new(SESSION, name, file.len() as u64, sender_cfg, now).expect("a valid sender");
        Sim {
            label,
            rng: Rng::new(seed),
            faults,
            hooks,
            now,
            steps: 0,
            trace: VecDeque::new(),
            file,
            depth,
            sender,
            send_jobs: VecDeque::new(),
            local: BTreeMap::new(),
            reads_asked: 0,
            completions: Vec::new(),
            write_done: 0,
            credit_seen: 0,
            max_local_slots: 0,
            sender_outcome: None,
            to_receiver: VecDeque::new(),
            to_sender: VecDeque::new(),
            delivered_to_receiver: 0,
            receiver: Receiver::new(receiver_cfg, now),
            recv_jobs: VecDeque::new(),
            ring: Vec::new(),
            geometry: None,
            output: Vec::new(),
            temp: Temp::None,
            stores_asked: 0,
            stored: 0,
            max_ring_in_use: 0,
            acks_sent: Vec::new(),
            receiver_outcome: None,
        }
    }

    fn note(&mut self, event: String) {
        if self.trace.len() == 48 {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    /// Panics with the case's label and its last events unless `ok`.
    #[track_caller]
    fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
            panic!("{}: {}\nlast events:\n  {}", self.label, what(), trace.join("\n  "));
        }
    }

    fn done(&self) -> bool {
        self.sender.is_done() && self.receiver.is_done()
    }

    /// Runs both sides until both are done; panics past `max_steps`.
    fn run(&mut self, max_steps: u64) {
        self.drain_sender();
        self.drain_receiver();
        while !self.done() {
            self.steps += 1;
            self.check(self.steps <= max_steps, || format!("not done after {max_steps} steps"));
            self.now += Duration::from_micros(self.rng.below(2_000));
            if self.rng.chance(self.faults.clock_jump) {
                self.jump_clock();
                continue;
            }
            self.step();
        }
        self.check_end();
    }

    /// One move, chosen at random among those possible: a delivery in either direction, a
    /// job of either driver, the sender's completions; the clock jumps when none is possible.
    fn step(&mut self) {
        let blackout = self.hooks.blackout_after.is_some_and(|n| self.delivered_to_receiver >= n);
        let mut moves: Vec<u8> = Vec::with_capacity(5);
        if !self.to_receiver.is_empty() && !blackout {
            moves.push(0);
        }
        if !self.to_sender.is_empty() && !blackout {
            moves.push(1);
        }
        if !self.send_jobs.is_empty() {
            moves.push(2);
        }
        if !self.recv_jobs.is_empty() {
            moves.push(3);
        }
        if !self.completions.is_empty() {
            moves.push(4);
        }
        if moves.is_empty() {
            self.jump_clock();
            return;
        }
        match self.rng.pick(&moves) {
            0 => self.deliver_to_receiver(),
            1 => self.deliver_to_sender(),
            2 => self.sender_job(),
            3 => self.receiver_job(),
            _ => self.report_completions(),
        }
        self.drain_sender();
        self.drain_receiver();
    }

    fn jump_clock(&mut self) {
        let deadline = [self.sender.poll_timeout(), self.receiver.poll_timeout()].into_iter().flatten().min();
        let Some(deadline) = deadline else { return };
        self.now = self.now.max(deadline);
        self.note(format!("clock jumps to the deadline (step {})", self.steps));
        self.sender.handle_timeout(self.now);
        self.receiver.handle_timeout(self.now);
        self.drain_sender();
        self.drain_receiver();
    }

    /// Takes the next packet of `queue`: the oldest, or any when the network reorders.
    fn take(rng: &mut Rng, faults: &Faults, queue: &mut VecDeque<InFlight>) -> InFlight {
        let at = if rng.chance(faults.reorder) { rng.below(queue.len() as u64) as usize } else { 0 };
        queue.remove(at).expect("a packet in flight")
    }

    /// Puts a duplicate of `p` somewhere in `queue`, if the network duplicates it.
    fn maybe_duplicate(rng: &mut Rng, faults: &Faults, queue: &mut VecDeque<InFlight>, p: &InFlight) -> bool {
        if p.copy || !rng.chance(faults.duplicate) {
            return false;
        }
        let at = rng.below(queue.len() as u64 + 1) as usize;
        queue.insert(at, p.duplicate());
        true
    }

    /// A control message as the network hands it over: cut short (exactly), or whole with the
    /// zero padding of a receive slot.
    fn wire_bytes(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        if self.rng.chance(self.faults.truncate) {
            bytes.truncate(self.rng.below(bytes.len() as u64) as usize);
        } else {
            let padding = self.rng.below(24) as usize;
            bytes.resize(bytes.len() + padding, 0);
        }
        bytes
    }

    fn deliver_to_receiver(&mut self) {
        let p = Self::take(&mut self.rng, &self.faults, &mut self.to_receiver);
        self.delivered_to_receiver += 1;
        if Self::maybe_duplicate(&mut self.rng, &self.faults, &mut self.to_receiver, &p) {
            self.note("network duplicates a packet to the receiver".into());
        }
        let dropped = self.rng.chance(self.faults.drop);
        match p.packet {
            Packet::Control(bytes) => {
                if dropped {
                    self.note(format!("network drops {}", describe(&bytes)));
                    return;
                }
                let bytes = self.wire_bytes(bytes);
                self.note(format!("receiver gets {}", describe(&bytes)));
                self.receiver.handle(receiver::Input::Message(&bytes), self.now);
            }
            Packet::Write { seq, imm, remote_addr, rkey, mut data } => {
                if dropped {
                    self.note(format!("network drops the WRITE of chunk {seq}"));
                    if !p.copy && self.rng.chance(500) {
                        self.completions.push(seq);
                    }
                    return;
                }
                if !data.is_empty() && self.rng.chance(self.faults.truncate) {
                    data.truncate(self.rng.below(data.len() as u64) as usize);
                    self.note(format!("network cuts the WRITE of chunk {seq} to {} bytes", data.len()));
                }
                if !data.is_empty() && self.rng.chance(self.faults.corrupt) {
                    let at = self.rng.below(data.len() as u64) as usize;
                    data[at] ^= 1 << self.rng.below(8);
                    self.note(format!("network flips a bit of chunk {seq} at {at}"));
                }
                // The NIC checks the rkey and the range before placing a byte.
                self.check(rkey == RKEY, || format!("WRITE with rkey {rkey:#x}"));
                let at = remote_addr.checked_sub(RING_ADDR).map(|a| a as usize);
                let fits = at.is_some_and(|a| a + data.len() <= self.ring.len());
                self.check(fits, || format!("WRITE at {remote_addr:#x} of {} bytes outside the ring", data.len()));
                let at = at.unwrap_or(0);
                self.ring[at..at + data.len()].copy_from_slice(&data);
                if !p.copy {
                    self.completions.push(seq);
                }
                if self.rng.chance(self.faults.lose_arrival) {
                    self.note(format!("network loses the arrival of chunk {seq}"));
                    return;
                }
                self.note(format!("receiver gets WRITE imm {imm} of {} bytes", data.len()));
                let len = data.len() as u32;
                self.receiver.handle(receiver::Input::WriteArrived { imm, len }, self.now);
            }
        }
    }

    fn deliver_to_sender(&mut self) {
        let p = Self::take(&mut self.rng, &self.faults, &mut self.to_sender);
        if Self::maybe_duplicate(&mut self.rng, &self.faults, &mut self.to_sender, &p) {
            self.note("network duplicates a packet to the sender".into());
        }
        let Packet::Control(bytes) = p.packet else { unreachable!("the receiver sends control messages only") };
        if self.rng.chance(self.faults.drop) {
            self.note(format!("network drops {}", describe(&bytes)));
            return;
        }
        let bytes = self.wire_bytes(bytes);
        if let Ok((_, Message::Credit(Credit { consumed }))) = wire::decode(&bytes) {
            self.credit_seen = self.credit_seen.max(consumed);
        }
        self.note(format!("sender gets {}", describe(&bytes)));
        self.sender.handle(sender::Input::Message(&bytes), self.now);
    }

    fn report_completions(&mut self) {
        let last = self.completions.drain(..).max().expect("a completion");
        // A send queue completes in order: report only what is newer than the last report.
        if last >= self.write_done {
            self.write_done = last + 1;
            self.note(format!("sender: WRITEs up to chunk {last} completed"));
            self.sender.handle(sender::Input::WriteDone { seq: last }, self.now);
        }
    }

    fn sender_job(&mut self) {
        match self.send_jobs.pop_front().expect("a job") {
            SendJob::Read { seq, offset, len } => {
                let start = offset as usize;
                self.local.insert(seq, self.file[start..start + len as usize].to_vec());
                self.sender.handle(sender::Input::ChunkRead { seq }, self.now);
            }
            SendJob::Digest => {
                let d = digest(&self.file);
                self.sender.handle(sender::Input::Digest(d), self.now);
            }
        }
    }

    fn receiver_job(&mut self) {
        match self.recv_jobs.pop_front().expect("a job") {
            RecvJob::Open { size, slot_size, slot_count } => {
                if let Some(status) = self.hooks.open_fails {
                    let input = receiver::Input::OpenFailed(status, "the simulated driver refuses".into());
                    self.receiver.handle(input, self.now);
                    return;
                }
                self.temp = Temp::Open;
                self.output = vec![0; size as usize];
                self.ring = vec![0; slot_size as usize * slot_count as usize];
                self.geometry = Some((slot_size, slot_count));
                self.receiver.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, self.now);
            }
            RecvJob::Store { seq, slot, offset, len } => {
                if let Some((bad, status)) = self.hooks.store_fails {
                    if bad == seq {
                        let input = receiver::Input::StoreFailed(status, "the simulated disk fails".into());
                        self.receiver.handle(input, self.now);
                        return;
                    }
                }
                let (slot_size, _) = self.geometry.expect("a ring");
                let at = slot as usize * slot_size as usize;
                if self.hooks.corrupt_slot_of == Some(seq) {
                    self.ring[at] ^= 0x40;
                }
                // Copy out of the peer-writable slot once; store (and later hash) that copy.
                let copy = self.ring[at..at + len as usize].to_vec();
                let start = offset as usize;
                self.output[start..start + copy.len()].copy_from_slice(&copy);
                self.stored += 1;
                self.receiver.handle(receiver::Input::ChunkStored { seq }, self.now);
            }
            RecvJob::Finalize { digest: theirs } => {
                let (status, detail) = if digest(&self.output) == theirs {
                    self.temp = Temp::Committed;
                    (Status::Ok, String::new())
                } else {
                    (Status::ChecksumMismatch, "the data does not match the sender's digest".into())
                };
                self.receiver.handle(receiver::Input::Finalized(status, detail), self.now);
            }
        }
    }

    /// Performs the sender's actions, checking each against the protocol's rules.
    fn drain_sender(&mut self) {
        while let Some(action) = self.sender.poll_action() {
            self.check(self.sender_outcome.is_none(), || format!("sender action {action:?} after Finish"));
            match action {
                sender::Action::Send(bytes) => {
                    self.check(wire::decode(&bytes).is_ok(), || "the sender sent an undecodable message".into());
                    self.note(format!("sender sends {}", describe(&bytes)));
                    self.to_receiver.push_back(InFlight { packet: Packet::Control(bytes), copy: false });
                }
                sender::Action::ReadChunk { seq, offset, len } => {
                    let g = *self.sender.grant().expect("reads follow the grant");
                    let slot = u64::from(g.slot_size);
                    let want = (self.file.len() as u64 - seq * slot).min(slot);
                    self.check(seq == self.reads_asked && offset == seq * slot && u64::from(len) == want, || {
                        format!("read of chunk {seq} at {offset} ({len} bytes), expected chunk {}", self.reads_asked)
                    });
                    self.reads_asked += 1;
                    let in_use = self.reads_asked - self.write_done;
                    self.max_local_slots = self.max_local_slots.max(in_use);
                    self.check(in_use <= u64::from(self.depth), || {
                        format!("{in_use} local slots in use, depth {}", self.depth)
                    });
                    self.send_jobs.push_back(SendJob::Read { seq, offset, len });
                }
                sender::Action::WriteChunk { seq, len, remote_addr, rkey, imm } => {
                    let g = *self.sender.grant().expect("WRITEs follow the grant");
                    let count = u64::from(g.slot_count);
                    let data = self.local.remove(&seq);
                    self.check(data.as_ref().is_some_and(|d| d.len() == len as usize), || {
                        format!("WRITE of chunk {seq} ({len} bytes) that was not read")
                    });
                    self.check(remote_addr == g.addr + (seq % count) * u64::from(g.slot_size), || {
                        format!("chunk {seq} written at {remote_addr:#x}")
                    });
                    self.check(rkey == g.rkey && imm == seq as u32, || format!("chunk {seq}: rkey {rkey}, imm {imm}"));
                    // Flow control: only into a slot the receiver credited, hence emptied.
                    self.check(seq < self.credit_seen + count, || {
                        format!("chunk {seq} written with credit for {} of {count} slots", self.credit_seen)
                    });
                    self.check(seq < self.stored + count, || {
                        format!("chunk {seq} written over chunk {} not yet stored", seq - count)
                    });
                    self.note(format!("sender WRITEs chunk {seq}"));
                    let data = data.unwrap_or_default();
                    self.to_receiver.push_back(InFlight {
                        packet: Packet::Write { seq, imm, remote_addr, rkey, data },
                        copy: false,
                    });
                }
                sender::Action::NeedDigest => self.send_jobs.push_back(SendJob::Digest),
                sender::Action::Finish(o) => {
                    self.note(format!("sender finishes: {o:?}"));
                    self.send_jobs.clear();
                    self.sender_outcome = Some(o);
                }
            }
        }
    }

    /// Performs the receiver's actions, checking each against the protocol's rules.
    fn drain_receiver(&mut self) {
        while let Some(action) = self.receiver.poll_action() {
            self.check(self.receiver_outcome.is_none(), || format!("receiver action {action:?} after Finish"));
            match action {
                receiver::Action::Open { name, size, slot_size, slot_count } => {
                    self.check(self.temp == Temp::None && slot_size > 0 && slot_count > 0, || {
                        format!("open of {name:?}: {slot_count} slots of {slot_size}")
                    });
                    self.recv_jobs.push_back(RecvJob::Open { size, slot_size, slot_count });
                }
                receiver::Action::Send(bytes) => {
                    let decoded = wire::decode(&bytes);
                    self.check(decoded.is_ok(), || "the receiver sent an undecodable message".into());
                    if let Ok((_, Message::Ack(a))) = decoded {
                        self.acks_sent.push(a.status);
                    }
                    self.note(format!("receiver sends {}", describe(&bytes)));
                    self.to_sender.push_back(InFlight { packet: Packet::Control(bytes), copy: false });
                }
                receiver::Action::StoreChunk { seq, slot, offset, len } => {
                    let (slot_size, count) = self.geometry.expect("stores follow the open");
                    let fits = offset + u64::from(len) <= self.output.len() as u64;
                    self.check(
                        seq == self.stores_asked && slot < count && u64::from(slot) == seq % u64::from(count),
                        || format!("store of chunk {seq} from slot {slot} of {count}"),
                    );
                    self.check(offset == seq * u64::from(slot_size) && len <= slot_size && fits, || {
                        format!("store of chunk {seq}: {len} bytes at {offset}")
                    });
                    self.stores_asked += 1;
                    let in_ring = self.stores_asked - self.stored;
                    self.max_ring_in_use = self.max_ring_in_use.max(in_ring);
                    self.check(in_ring <= u64::from(count), || format!("{in_ring} chunks in a ring of {count}"));
                    self.recv_jobs.push_back(RecvJob::Store { seq, slot, offset, len });
                }
                receiver::Action::Finalize { digest } => {
                    self.check(self.stored == self.stores_asked && self.temp == Temp::Open, || {
                        format!("finalize with {} of {} chunks stored", self.stored, self.stores_asked)
                    });
                    self.recv_jobs.push_back(RecvJob::Finalize { digest });
                }
                receiver::Action::Discard => {
                    self.check(self.temp == Temp::Open, || format!("discard of a temporary that is {:?}", self.temp));
                    // A driver commits when asked (the real one at once, before it reads the
                    // next action): a discard after that comes too late.
                    self.check(!self.commit_pending(), || "discard while the commit asked for is under way".into());
                    self.temp = Temp::Discarded;
                }
                receiver::Action::Finish(o) => {
                    // The verdict must be the commit's: the session cannot end before it.
                    self.check(!self.commit_pending(), || format!("{o:?} while the commit asked for is under way"));
                    self.note(format!("receiver finishes: {o:?}"));
                    self.recv_jobs.clear();
                    self.receiver_outcome = Some(o);
                }
            }
        }
    }

    /// Whether the receiver asked for a commit whose answer it has not had.
    fn commit_pending(&self) -> bool {
        self.recv_jobs.iter().any(|j| matches!(j, RecvJob::Finalize { .. }))
    }

    /// What must hold once both sides are done.
    fn check_end(&self) {
        let (Some(sent), Some(received)) = (&self.sender_outcome, &self.receiver_outcome) else {
            self.check(false, || "done without a Finish".into());
            return;
        };
        self.check(self.sender.poll_timeout().is_none() && self.receiver.poll_timeout().is_none(), || {
            "a done machine still wants a timeout".into()
        });
        match received {
            Outcome::Acked { status: Status::Ok, .. } => {
                self.check(self.output == self.file, || "the receiver acknowledged bytes that differ".into());
                self.check(self.temp == Temp::Committed, || format!("OK with the temporary {:?}", self.temp));
                self.check(self.receiver.bytes_stored() == self.file.len() as u64, || "bytes stored".into());
            }
            Outcome::Acked { status, .. } => {
                self.check(self.acks_sent.last() == Some(status), || format!("verdict {status} without its ACK"));
                self.check(matches!(self.temp, Temp::None | Temp::Discarded), || {
                    format!("{status}: the temporary is {:?}", self.temp)
                });
            }
            Outcome::Failed(_) => {
                self.check(matches!(self.temp, Temp::None | Temp::Discarded), || {
                    format!("failure: the temporary is {:?}", self.temp)
                });
            }
        }
        if let Outcome::Acked { status, .. } = sent {
            // Only the receiver makes verdicts: the sender's is one the receiver sent.
            self.check(self.acks_sent.contains(status), || format!("the sender saw {status}, never sent"));
            if *status == Status::Ok {
                self.check(matches!(received, Outcome::Acked { status: Status::Ok, .. }), || {
                    "the sender saw OK, the receiver did not store".into()
                });
            }
        }
    }
}

/// A control message in a trace line.
fn describe(bytes: &[u8]) -> String {
    match wire::decode(bytes) {
        Ok((_, Message::Hello(h))) => format!("HELLO {} bytes", h.size),
        Ok((_, Message::Grant(g))) => format!("GRANT {} slots of {}", g.slot_count, g.slot_size),
        Ok((_, Message::Credit(c))) => format!("CREDIT {}", c.consumed),
        Ok((_, Message::Fin(f))) => format!("FIN {} chunks", f.chunks),
        Ok((_, Message::Ack(a))) => format!("ACK {}", a.status),
        Err(e) => format!("{} bytes that do not decode ({e})", bytes.len()),
    }
}

fn file_of(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0xf11e);
    (0..size).map(|_| rng.next() as u8).collect()
}

fn sender_cfg(chunk: u32, depth: u32) -> SenderConfig {
    SenderConfig::new(chunk, depth, Duration::from_secs(10))
}

fn receiver_cfg(max_slots: u32) -> ReceiverConfig {
    receiver_config(1 << 30, 1 << 20, 1 << 24, max_slots, Duration::from_secs(10))
}

fn receiver_config(
    max_size: u64,
    max_chunk: u32,
    memory_budget: u64,
    max_slots: u32,
    timeout: Duration,
) -> ReceiverConfig {
    let mut c = ReceiverConfig::default();
    (c.max_size, c.max_chunk, c.memory_budget, c.max_slots, c.timeout) =
        (max_size, max_chunk, memory_budget, max_slots, timeout);
    c
}

/// Runs one transfer over a faithful network (in order, nothing lost), the drivers' work and
/// the deliveries interleaved as `seed` says.
fn transfer(file: Vec<u8>, sender: SenderConfig, receiver: ReceiverConfig, hooks: Hooks, seed: u64) -> Sim {
    let label = format!("{} bytes, chunk {}, depth {}, seed {seed}", file.len(), sender.chunk, sender.depth);
    let chunks = file.len() as u64 / u64::from(sender.chunk.min(receiver.max_chunk)) + 1;
    let mut sim = Sim::new(label, seed, file, "file.bin", sender, receiver, Faults::default(), hooks);
    sim.run(64 * (chunks + 8));
    sim
}

fn assert_ok(sim: &Sim) {
    let ok = |o: &Option<Outcome>| matches!(o, Some(Outcome::Acked { status: Status::Ok, .. }));
    sim.check(ok(&sim.sender_outcome) && ok(&sim.receiver_outcome), || {
        format!("outcomes {:?} / {:?}", sim.sender_outcome, sim.receiver_outcome)
    });
    sim.check(sim.output == sim.file, || "the output differs".into());
}

fn acked(o: &Option<Outcome>) -> Option<Status> {
    match o {
        Some(Outcome::Acked { status, .. }) => Some(*status),
        _ => None,
    }
}

#[test]
fn files_of_every_edge_size_arrive_identical() {
    let chunk = 16;
    for size in [0, 1, chunk - 1, chunk, chunk + 1, 2 * chunk, 40 * chunk + 5] {
        for seed in 0..16 {
            let sim =
                transfer(file_of(size, seed), sender_cfg(chunk as u32, 4), receiver_cfg(4), Hooks::default(), seed);
            assert_ok(&sim);
            assert_eq!(sim.sender.chunks(), size.div_ceil(chunk) as u64);
            assert_eq!(sim.sender.chunks_written(), sim.sender.chunks());
        }
    }
}

#[test]
fn many_chunks_go_through_a_ring_of_two_slots() {
    for seed in 0..8 {
        let sim = transfer(file_of(7 * 500 + 3, seed), sender_cfg(7, 2), receiver_cfg(2), Hooks::default(), seed);
        assert_ok(&sim);
        assert_eq!(sim.sender.grant().map(|g| (g.slot_size, g.slot_count)), Some((7, 2)));
        assert_eq!(sim.sender.chunks(), 501);
        // Bounded, and the bounds are reached: the pipeline is used.
        assert!(sim.max_local_slots <= 2 && sim.max_ring_in_use <= 2);
        assert_eq!(sim.max_ring_in_use, 2, "seed {seed}: the ring was never full");
    }
}

#[test]
fn the_receiver_grants_smaller_slots_and_fewer_of_them() {
    let mut receiver = receiver_cfg(64);
    (receiver.max_chunk, receiver.memory_budget) = (5, 15);
    for seed in 0..8 {
        let sim = transfer(file_of(123, seed), sender_cfg(16, 8), receiver.clone(), Hooks::default(), seed);
        assert_ok(&sim);
        assert_eq!(sim.sender.grant().map(|g| (g.slot_size, g.slot_count)), Some((5, 3)));
        assert_eq!(sim.sender.chunks(), 25);
        assert!(sim.max_ring_in_use <= 3 && sim.max_local_slots <= 8);
    }
}

#[test]
fn a_corrupted_chunk_is_a_checksum_mismatch_at_both_ends() {
    for (size, bad) in [(1, 0), (100, 0), (100, 3), (100, 6)] {
        let hooks = Hooks { corrupt_slot_of: Some(bad), ..Hooks::default() };
        let sim = transfer(file_of(size, 1), sender_cfg(16, 4), receiver_cfg(2), hooks, 1);
        assert_eq!(acked(&sim.receiver_outcome), Some(Status::ChecksumMismatch));
        assert_eq!(acked(&sim.sender_outcome), Some(Status::ChecksumMismatch));
        assert_eq!(Status::ChecksumMismatch.exit_code(), 11);
        assert_eq!(sim.temp, Temp::Discarded);
    }
}

#[test]
fn driver_failures_reach_the_sender_as_their_status() {
    for status in [Status::Exists, Status::NoSpace, Status::DiskIo, Status::Busy] {
        let hooks = Hooks { open_fails: Some(status), ..Hooks::default() };
        let sim = transfer(file_of(50, 2), sender_cfg(16, 4), receiver_cfg(4), hooks, 2);
        assert_eq!((acked(&sim.sender_outcome), acked(&sim.receiver_outcome)), (Some(status), Some(status)));
        assert_eq!(sim.temp, Temp::None, "a refused open leaves no temporary");

        let hooks = Hooks { store_fails: Some((2, status)), ..Hooks::default() };
        let sim = transfer(file_of(50, 2), sender_cfg(16, 4), receiver_cfg(4), hooks, 2);
        assert_eq!(acked(&sim.sender_outcome), Some(status));
        assert!(matches!(sim.receiver_outcome, Some(Outcome::Failed(ProtocolError::Local(_)))));
        assert_eq!(sim.temp, Temp::Discarded);
    }
}

#[test]
fn a_link_gone_silent_times_both_sides_out() {
    for after in [0, 1, 3, 6] {
        let hooks = Hooks { blackout_after: Some(after), ..Hooks::default() };
        let sim = transfer(file_of(100, 3), sender_cfg(16, 2), receiver_cfg(2), hooks, 3);
        assert!(
            matches!(sim.sender_outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))),
            "after {after}: {:?}",
            sim.sender_outcome
        );
        assert!(matches!(sim.receiver_outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))));
        assert!(matches!(sim.temp, Temp::None | Temp::Discarded));
        assert!(sim.acks_sent.is_empty(), "a timeout sends no ACK");
    }
}

#[test]
fn a_timeout_too_large_to_represent_waits_without_panicking() {
    // Duration::MAX is "no deadline" elsewhere in the workspace; here it must not overflow.
    let mut cfg = sender_cfg(16, 2);
    cfg.timeout = Duration::MAX;
    let mut rcfg = receiver_cfg(2);
    rcfg.timeout = Duration::MAX;
    let sim = transfer(file_of(100, 4), cfg.clone(), rcfg, Hooks::default(), 4);
    assert_ok(&sim);
    let now = Instant::now();
    let s = Sender::new(1, "f", 10, cfg, now).unwrap();
    assert!(s.poll_timeout().unwrap() > now + Duration::from_secs(3600 * 24 * 365));
}

#[test]
fn repeated_credits_do_not_hold_off_the_senders_timeout() {
    // A receiver that never ACKs but keeps repeating an old CREDIT must not keep the sender
    // waiting: only a credit for new slots is progress.
    let t0 = Instant::now();
    let cfg = sender_cfg(16, 2);
    let timeout = cfg.timeout;
    let mut s = Sender::new(7, "f", 0, cfg, t0).unwrap();
    let _ = actions_of_sender(&mut s);
    let grant = Grant { version: 1, caps: caps::DIGEST_XXH3_128, addr: 4096, rkey: 1, slot_size: 16, slot_count: 2 };
    s.handle(sender::Input::Message(&encode(7, &Message::Grant(grant))), t0);
    for a in actions_of_sender(&mut s) {
        if let sender::Action::NeedDigest = a {
            s.handle(sender::Input::Digest(digest(&[])), t0);
        }
    }
    let _ = actions_of_sender(&mut s); // the FIN
    let mut now = t0;
    while now < t0 + timeout * 2 && !s.is_done() {
        now += Duration::from_millis(100);
        s.handle(sender::Input::Message(&encode(7, &Message::Credit(Credit { consumed: 0 }))), now);
        s.handle_timeout(now);
    }
    assert!(s.is_done(), "still waiting after {:?}", now - t0);
    assert!(now <= t0 + timeout + Duration::from_millis(100), "timed out only after {:?}", now - t0);
    let outcome = actions_of_sender(&mut s).into_iter().find_map(|a| match a {
        sender::Action::Finish(o) => Some(o),
        _ => None,
    });
    assert!(matches!(outcome, Some(Outcome::Failed(ProtocolError::Timeout { .. }))), "{outcome:?}");
}

// ---- The receiver alone, fed hand-made messages. ----

fn encode(session: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode(session, m, &mut out).expect("encodes");
    out
}

fn hello(name: &str, size: u64) -> Hello {
    Hello { version_min: 1, version_max: 1, caps: caps::DIGEST_XXH3_128, size, chunk: 16, depth: 4, name: name.into() }
}

fn actions_of_receiver(r: &mut Receiver) -> Vec<receiver::Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

fn actions_of_sender(s: &mut Sender) -> Vec<sender::Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

/// The ACK among `actions`, decoded, with the session it echoes.
fn ack_in(actions: &[receiver::Action]) -> Option<(u64, Ack)> {
    actions.iter().find_map(|a| match a {
        receiver::Action::Send(b) => match wire::decode(b) {
            Ok((h, Message::Ack(ack))) => Some((h.session, ack)),
            _ => None,
        },
        _ => None,
    })
}

#[test]
fn bad_hellos_are_refused_with_their_status() {
    let t = Instant::now();
    let mut cfg = receiver_cfg(4);
    cfg.max_size = 1000;
    let cases = [
        (hello("../etc", 1), Status::BadName),
        (hello("", 1), Status::BadName),
        (hello("a/b", 1), Status::BadName),
        (hello("nul\0", 1), Status::BadName),
        (hello("big", 1001), Status::TooLarge),
        (hello("big", u64::MAX), Status::TooLarge),
        (Hello { version_min: 5, version_max: 6, ..hello("v", 1) }, Status::ProtocolMismatch),
        (Hello { version_min: 0, version_max: 0, ..hello("v", 1) }, Status::ProtocolMismatch),
        (Hello { caps: caps::DIGEST_BLAKE3, ..hello("c", 1) }, Status::ProtocolMismatch),
        (Hello { chunk: 0, ..hello("z", 1) }, Status::ProtocolMismatch),
        (Hello { depth: 0, ..hello("z", 1) }, Status::ProtocolMismatch),
    ];
    for (h, status) in cases {
        let what = format!("{h:?}");
        let mut r = Receiver::new(cfg.clone(), t);
        r.handle(receiver::Input::Message(&encode(77, &Message::Hello(h))), t);
        let actions = actions_of_receiver(&mut r);
        let (session, ack) = ack_in(&actions).unwrap_or_else(|| panic!("{what}: no ACK"));
        assert_eq!((session, ack.status, ack.received), (77, status, 0), "{what}");
        assert!(!actions.iter().any(|a| matches!(a, receiver::Action::Open { .. })), "{what}: opened");
        assert!(
            matches!(actions.last(), Some(receiver::Action::Finish(Outcome::Acked { status: s, .. })) if *s == status)
        );
        assert!(r.is_done());
    }
    assert_eq!([Status::BadName, Status::TooLarge, Status::ProtocolMismatch].map(Status::exit_code), [16, 15, 14]);
}

#[test]
fn hellos_within_the_limits_are_granted_the_common_version() {
    let t = Instant::now();
    for (min, max) in [(1, 1), (0, 1), (1, 9), (0, u16::MAX)] {
        let h = Hello { version_min: min, version_max: max, caps: u32::MAX, ..hello("ok", 10) };
        let mut r = Receiver::new(receiver_cfg(4), t);
        r.handle(receiver::Input::Message(&encode(5, &Message::Hello(h))), t);
        assert!(matches!(actions_of_receiver(&mut r)[..], [receiver::Action::Open { .. }]));
        r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
        let actions = actions_of_receiver(&mut r);
        let [receiver::Action::Send(b)] = &actions[..] else { panic!("{actions:?}") };
        let Ok((_, Message::Grant(g))) = wire::decode(b) else { panic!("not a GRANT") };
        assert_eq!(g.version, 1, "offered {min}..={max}");
        assert_eq!(g.caps, caps::DIGEST_XXH3_128, "only the capabilities both know");
    }
}

#[test]
fn refused_senders_exit_with_the_status_code() {
    let t = Instant::now();
    let run = |sender: Sender, max_size: u64| {
        let mut cfg = receiver_cfg(4);
        cfg.max_size = max_size;
        let mut sim =
            Sim::new("refusal".into(), 0, vec![1; 10], "x", sender_cfg(4, 2), cfg, Faults::default(), Hooks::default());
        sim.sender = sender;
        sim.run(100);
        acked(&sim.sender_outcome).map(Status::exit_code)
    };
    let versions = Sender::offering(SESSION, "x", 10, sender_cfg(4, 2), t, 5..=6).unwrap();
    assert_eq!(run(versions, 100), Some(14));
    let name = Sender::offering(SESSION, "../x", 10, sender_cfg(4, 2), t, 1..=1).unwrap();
    assert_eq!(run(name, 100), Some(16));
    let large = Sender::new(SESSION, "x", 10, sender_cfg(4, 2), t).unwrap();
    assert_eq!(run(large, 9), Some(15));
}

/// A receiver in its data phase: HELLO of `size` bytes in chunks of 16, 2 slots, granted.
fn receiving(size: u64) -> (Receiver, Instant) {
    let t = Instant::now();
    let mut r = Receiver::new(receiver_cfg(2), t);
    let h = Hello { depth: 2, ..hello("f", size) };
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
    actions_of_receiver(&mut r);
    (r, t)
}

/// The ACK status a receiver sent, and whether it discarded its temporary.
fn verdict(r: &mut Receiver) -> (Option<Status>, bool) {
    let actions = actions_of_receiver(r);
    let discarded = actions.contains(&receiver::Action::Discard);
    (ack_in(&actions).map(|(_, a)| a.status), discarded)
}

#[test]
fn every_write_arrival_is_checked() {
    let write = |imm, len| receiver::Input::WriteArrived { imm, len };
    let mismatch = (Some(Status::ProtocolMismatch), true);

    // Accepted: chunk 0 then 1 (of 40 bytes: 16, 16, 8), each asking for its store.
    let (mut r, t) = receiving(40);
    r.handle(write(0, 16), t);
    r.handle(write(1, 16), t);
    let stores: Vec<_> = actions_of_receiver(&mut r);
    assert_eq!(
        stores,
        [
            receiver::Action::StoreChunk { seq: 0, slot: 0, offset: 0, len: 16 },
            receiver::Action::StoreChunk { seq: 1, slot: 1, offset: 16, len: 16 },
        ]
    );
    // Chunk 2 goes to slot 0: only once chunk 0 left it and was credited.
    r.handle(write(2, 8), t);
    assert_eq!(verdict(&mut r), mismatch, "a WRITE into a slot not credited");

    let (mut r, t) = receiving(40);
    r.handle(write(1, 16), t);
    assert_eq!(verdict(&mut r), mismatch, "an immediate that is not the next chunk");

    let (mut r, t) = receiving(40);
    r.handle(write(0, 15), t);
    assert_eq!(verdict(&mut r), mismatch, "a length that is not the chunk's");

    let (mut r, t) = receiving(40);
    for seq in 0..3 {
        r.handle(write(seq, if seq == 2 { 8 } else { 16 }), t);
        r.handle(receiver::Input::ChunkStored { seq: u64::from(seq) }, t);
    }
    r.handle(write(3, 16), t);
    assert_eq!(verdict(&mut r).0, Some(Status::ProtocolMismatch), "a WRITE beyond the file");

    let (mut r, t) = receiving(0);
    r.handle(write(0, 0), t);
    assert_eq!(verdict(&mut r).0, Some(Status::ProtocolMismatch), "a WRITE into an empty file");

    let (mut r, t) = receiving(16);
    let fin = Fin { chunks: 0, size: 16, digest: vec![0; wire::DIGEST_LEN] };
    r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
    assert_eq!(verdict(&mut r), mismatch, "a FIN before the chunks");

    let (mut r, t) = receiving(16);
    r.handle(write(0, 16), t);
    let fin = Fin { chunks: 1, size: 16, digest: vec![0; wire::DIGEST_LEN] };
    r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin))), t);
    r.handle(write(1, 16), t);
    assert_eq!(verdict(&mut r), mismatch, "a WRITE after the FIN");

    // Before the grant: no ring yet.
    let mut r = Receiver::new(receiver_cfg(2), t);
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(hello("f", 16)))), t);
    actions_of_receiver(&mut r);
    r.handle(write(0, 16), t);
    assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), false), "a WRITE before the grant");
}

/// A hostile sender that follows its FIN at once with junk, a WRITE, a second FIN, or lets the
/// clock run, before the driver committed: the commit asked for decides the verdict.
#[test]
fn nothing_after_the_fin_turns_a_commit_into_a_failure() {
    let junk = [0xde, 0xad, 0xbe, 0xef, 1, 2, 3];
    let fin = || Fin { chunks: 1, size: 16, digest: vec![7; wire::DIGEST_LEN] };
    let second_fin = encode(9, &Message::Fin(fin()));
    type Late<'a> = &'a dyn Fn(&mut Receiver, Instant);
    let cases: [(&str, Late<'_>); 5] = [
        ("junk", &|r, t| r.handle(receiver::Input::Message(&junk), t)),
        ("a WRITE", &|r, t| r.handle(receiver::Input::WriteArrived { imm: 1, len: 16 }, t)),
        ("a second FIN", &|r, t| r.handle(receiver::Input::Message(&second_fin), t)),
        ("a chunk stored twice", &|r, t| r.handle(receiver::Input::ChunkStored { seq: 0 }, t)),
        ("the clock past every deadline", &|r, t| r.handle_timeout(t + Duration::from_secs(3600))),
    ];
    for (what, late) in cases {
        for committed in [Status::Ok, Status::DiskIo] {
            let (mut r, t) = receiving(16);
            r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
            r.handle(receiver::Input::ChunkStored { seq: 0 }, t);
            r.handle(receiver::Input::Message(&encode(9, &Message::Fin(fin()))), t);
            let asked = actions_of_receiver(&mut r);
            assert!(asked.iter().any(|a| matches!(a, receiver::Action::Finalize { .. })), "{what}: {asked:?}");
            assert_eq!(r.poll_timeout(), None, "the commit is the driver's to time");
            late(&mut r, t);
            assert_eq!(actions_of_receiver(&mut r), [], "{what} while the commit is under way");
            assert!(!r.is_done(), "{what} ended the session before the commit's answer");
            r.handle(receiver::Input::Finalized(committed, String::new()), t);
            assert_eq!(verdict(&mut r), (Some(committed), committed != Status::Ok), "{what}, then {committed}");
            assert!(r.is_done());
        }
    }
}

#[test]
fn credits_go_in_quarter_rings_and_at_once_when_the_ring_is_drained() {
    let t = Instant::now();
    let mut r = Receiver::new(receiver_cfg(8), t);
    let h = Hello { depth: 8, ..hello("f", 16 * 64) };
    r.handle(receiver::Input::Message(&encode(9, &Message::Hello(h))), t);
    r.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, t);
    actions_of_receiver(&mut r);
    let credits = |r: &mut Receiver| -> Vec<u64> {
        let decoded = actions_of_receiver(r).into_iter().filter_map(|a| match a {
            receiver::Action::Send(b) => wire::decode(&b).ok(),
            _ => None,
        });
        decoded.filter_map(|(_, m)| if let Message::Credit(c) = m { Some(c.consumed) } else { None }).collect()
    };
    let arrive = |r: &mut Receiver, seq: u32| r.handle(receiver::Input::WriteArrived { imm: seq, len: 16 }, t);
    let store = |r: &mut Receiver, seq: u64| r.handle(receiver::Input::ChunkStored { seq }, t);
    // 8 slots: a batch is 2 chunks.
    arrive(&mut r, 0);
    store(&mut r, 0);
    assert_eq!(credits(&mut r), [1], "every chunk arrived is stored: credit at once");
    for seq in 1..=3 {
        arrive(&mut r, seq);
    }
    store(&mut r, 1);
    assert_eq!(credits(&mut r), [], "1 chunk pending, 2 still in the ring");
    store(&mut r, 2);
    assert_eq!(credits(&mut r), [3], "a batch");
    store(&mut r, 3);
    assert_eq!(credits(&mut r), [4], "the ring is drained");
    // The ring filled up: chunks 4..12 arrive (credit 4 allows up to chunk 11).
    for seq in 4..12 {
        arrive(&mut r, seq);
    }
    arrive(&mut r, 12);
    assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), true), "chunk 12 before its credit");
}

#[test]
fn the_receiver_refuses_messages_out_of_place() {
    let cases: [(&str, Message, u64); 4] = [
        ("a second HELLO", Message::Hello(hello("f", 16)), 9),
        ("a message of another session", Message::Credit(Credit { consumed: 0 }), 10),
        ("a CREDIT from the sender", Message::Credit(Credit { consumed: 0 }), 9),
        ("a FIN with a short digest", Message::Fin(Fin { chunks: 0, size: 0, digest: vec![1; 4] }), 9),
    ];
    for (what, m, session) in cases {
        let (mut r, t) = receiving(if matches!(m, Message::Fin(_)) { 0 } else { 16 });
        r.handle(receiver::Input::Message(&encode(session, &m)), t);
        assert_eq!(verdict(&mut r), (Some(Status::ProtocolMismatch), true), "{what}");
        assert!(r.is_done());
    }
    // Driver inputs out of order are the receiver's own failure.
    let (mut r, t) = receiving(40);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t);
    r.handle(receiver::Input::ChunkStored { seq: 1 }, t);
    assert_eq!(verdict(&mut r), (Some(Status::Internal), true));
}

#[test]
fn timeouts_fire_at_the_deadline_and_not_before() {
    let t = Instant::now();
    let timeout = Duration::from_secs(10);
    let mut s = Sender::new(SESSION, "f", 5, sender_cfg(4, 2), t).unwrap();
    assert_eq!(s.poll_timeout(), Some(t + timeout));
    s.handle_timeout(t + timeout - Duration::from_nanos(1));
    assert!(!s.is_done());
    s.handle_timeout(t + timeout);
    assert!(s.is_done() && s.poll_timeout().is_none());
    let actions = actions_of_sender(&mut s);
    assert!(matches!(
        actions.last(),
        Some(sender::Action::Finish(Outcome::Failed(ProtocolError::Timeout {
            waiting_for: "the receiver's grant",
            ..
        })))
    ));

    let mut r = Receiver::new(receiver_cfg(2), t);
    r.handle_timeout(t + timeout - Duration::from_nanos(1));
    assert!(!r.is_done());
    r.handle_timeout(t + timeout);
    let actions = actions_of_receiver(&mut r);
    assert!(ack_in(&actions).is_none(), "no HELLO, nobody to answer");
    assert!(matches!(actions[..], [receiver::Action::Finish(Outcome::Failed(ProtocolError::Timeout { .. }))]));

    // Progress moves the deadline: a WRITE at 9 s gives the receiver until 19 s.
    let (mut r, t) = receiving(40);
    r.handle(receiver::Input::WriteArrived { imm: 0, len: 16 }, t + Duration::from_secs(9));
    r.handle_timeout(t + Duration::from_secs(18));
    assert!(!r.is_done());
    r.handle_timeout(t + Duration::from_secs(19));
    assert_eq!(verdict(&mut r), (None, true), "a timeout discards the temporary, and sends nothing");
}

/// A sender granted 2 slots of 4 bytes for a file of `size` bytes.
fn granted(size: u64) -> (Sender, Instant) {
    let t = Instant::now();
    let mut s = Sender::new(SESSION, "f", size, sender_cfg(4, 2), t).unwrap();
    let g = Grant { version: 1, caps: caps::DIGEST_XXH3_128, addr: RING_ADDR, rkey: RKEY, slot_size: 4, slot_count: 2 };
    s.handle(sender::Input::Message(&encode(SESSION, &Message::Grant(g))), t);
    actions_of_sender(&mut s);
    (s, t)
}

fn failure(s: &mut Sender) -> Option<ProtocolError> {
    match actions_of_sender(s).pop() {
        Some(sender::Action::Finish(Outcome::Failed(e))) if s.is_done() => Some(e),
        _ => None,
    }
}

#[test]
fn the_sender_refuses_bad_grants_and_messages_out_of_place() {
    let t = Instant::now();
    let good =
        Grant { version: 1, caps: caps::DIGEST_XXH3_128, addr: RING_ADDR, rkey: RKEY, slot_size: 4, slot_count: 2 };
    let bad_grants = [
        Grant { version: 2, ..good },
        Grant { caps: 0, ..good },
        Grant { caps: caps::DIGEST_XXH3_128 | caps::RESUME, ..good },
        Grant { slot_size: 0, ..good },
        Grant { slot_size: 5, ..good },
        Grant { slot_count: 0, ..good },
        Grant { addr: u64::MAX - 7, ..good },
    ];
    for g in bad_grants {
        let mut s = Sender::new(SESSION, "f", 10, sender_cfg(4, 2), t).unwrap();
        actions_of_sender(&mut s);
        s.handle(sender::Input::Message(&encode(SESSION, &Message::Grant(g))), t);
        assert!(matches!(failure(&mut s), Some(ProtocolError::Peer(_))), "{g:?}");
    }

    let ok_ack = Message::Ack(Ack { status: Status::Ok, received: 0, detail: String::new() });
    let out_of_place = [
        ("a CREDIT beyond the chunks written", Message::Credit(Credit { consumed: 1 }), SESSION),
        ("an OK before the FIN", ok_ack, SESSION),
        ("a second GRANT", Message::Grant(good), SESSION),
        ("a HELLO", Message::Hello(hello("f", 1)), SESSION),
        ("another session", Message::Credit(Credit { consumed: 0 }), SESSION + 1),
    ];
    for (what, m, session) in out_of_place {
        let (mut s, t) = granted(10);
        s.handle(sender::Input::Message(&encode(session, &m)), t);
        assert!(matches!(failure(&mut s), Some(ProtocolError::Peer(_))), "{what}");
    }
    let (mut s, t) = granted(10);
    s.handle(sender::Input::Message(b"RDCP\x01"), t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Wire(_))), "a message that does not decode");

    // Driver inputs out of order are the sender's own failure.
    let (mut s, t) = granted(10);
    s.handle(sender::Input::ChunkRead { seq: 1 }, t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))), "a read out of order");
    let (mut s, t) = granted(10);
    s.handle(sender::Input::WriteDone { seq: 0 }, t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Local(_))), "a completion of nothing written");
}

#[test]
fn a_digest_that_cannot_be_sent_ends_the_sender() {
    let (mut s, t) = granted(0);
    assert_eq!(actions_of_sender(&mut s), []);
    s.handle(sender::Input::Digest(vec![0; wire::MAX_DIGEST_LEN + 1]), t);
    assert!(matches!(failure(&mut s), Some(ProtocolError::Wire(_))));
    assert!(s.is_done() && s.poll_timeout().is_none());
}

// ---- A hostile network. ----

/// Outcomes of the random cases, by kind.
#[derive(Debug, Default)]
struct Tally {
    ok: u32,
    faithful_ok: u32,
    checksum_mismatch: u32,
    protocol_mismatch: u32,
    too_large: u32,
    timeout: u32,
    other: u32,
}

/// One random case: sizes, windows, timeouts and the network's faults all drawn from `seed`.
fn hostile_case(seed: u64, tally: &mut Tally) {
    let mut rng = Rng::new(seed);
    let chunk = rng.pick(&[1u32, 2, 3, 7, 16, 64]);
    let size = rng.below(u64::from(chunk) * 24 + 2) as usize;
    let depth = 1 + rng.below(12) as u32;
    let faithful = rng.chance(250);
    // A faithful network makes progress every few steps of a few milliseconds: give it time.
    let timeout = Duration::from_millis(if faithful { 10_000 } else { rng.pick(&[50, 1_000, 10_000]) });
    let receiver = receiver_config(
        if rng.chance(50) { rng.below(size as u64 + 1) } else { 1 << 20 },
        if rng.chance(300) { 1 + rng.below(u64::from(chunk)) as u32 } else { 1 << 20 },
        1 + rng.below(u64::from(chunk) * 8),
        1 + rng.below(12) as u32,
        timeout,
    );
    let mut faults = Faults::default();
    if !faithful {
        faults = Faults {
            reorder: rng.pick(&[0, 0, 10, 100, 400]),
            drop: rng.pick(&[0, 0, 5, 20, 80]),
            duplicate: rng.pick(&[0, 0, 5, 20, 80]),
            truncate: rng.pick(&[0, 0, 5, 20, 80]),
            corrupt: rng.pick(&[0, 0, 5, 20, 80]),
            lose_arrival: rng.pick(&[0, 0, 5, 20]),
            clock_jump: rng.pick(&[0, 0, 0, 2, 10]),
        };
    }
    let too_large = size as u64 > receiver.max_size;
    let label = format!("seed {seed}: {size} bytes, chunk {chunk}, depth {depth}, {receiver:?}, {faults:?}");
    let sender = SenderConfig::new(chunk, depth, timeout);
    let file = file_of(size, seed);
    let chunks = size as u64 / u64::from(chunk.min(receiver.max_chunk)) + 1;
    let mut sim = Sim::new(label, seed.wrapping_add(1), file, "random.bin", sender, receiver, faults, Hooks::default());
    // Every packet is delivered at most twice and every job runs once, per chunk a handful of
    // moves; two clock jumps end both machines.
    sim.run(32 * (chunks + 8));

    let receiver_status = acked(&sim.receiver_outcome);
    if !faults.any() && !too_large {
        assert_ok(&sim);
        tally.faithful_ok += 1;
    }
    match (receiver_status, &sim.receiver_outcome) {
        (Some(Status::Ok), _) => tally.ok += 1,
        (Some(Status::ChecksumMismatch), _) => tally.checksum_mismatch += 1,
        (Some(Status::TooLarge), _) => tally.too_large += 1,
        (_, Some(Outcome::Failed(ProtocolError::Timeout { .. }))) => tally.timeout += 1,
        (_, Some(Outcome::Failed(ProtocolError::Peer(_) | ProtocolError::Wire(_)))) => tally.protocol_mismatch += 1,
        _ => tally.other += 1,
    }
}

/// Seeds 0..10,000 by default (about a second in a debug build); `MACHINES_CASES=N` runs N
/// (a longer soak), `MACHINES_FIRST_SEED=S` starts elsewhere.
#[test]
fn a_hostile_network_never_breaks_either_side() {
    let env = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (first, cases) = (env("MACHINES_FIRST_SEED", 0), env("MACHINES_CASES", 10_000));
    let mut tally = Tally::default();
    for seed in first..first + cases {
        hostile_case(seed, &mut tally);
    }
    eprintln!("{cases} cases: {tally:?}");
    // The faults must reach every path: success, corruption caught, peers refused, timeouts
    // (in proportions measured over 10,000 cases: about 45%, 3%, 28%, 4% and 19%).
    if cases >= 1_000 {
        let per_mille = |n: u32| u64::from(n) * 1000 / cases;
        assert!(per_mille(tally.faithful_ok) > 125 && tally.ok > tally.faithful_ok, "{tally:?}");
        assert!(per_mille(tally.checksum_mismatch) > 1 && per_mille(tally.protocol_mismatch) > 10, "{tally:?}");
        assert!(per_mille(tally.too_large) > 1 && per_mille(tally.timeout) > 10, "{tally:?}");
    }
}
