//! Disk buffers between a stream and a query that falls behind it
//! (`buffer = 'disk'` on the stream, or `SET buffer = 'disk'`).
//!
//! A source hands each query its messages through the query's channel.
//! For a query with a disk buffer, a [`BufferedSender`] stands in front of
//! the channel: a message that finds the channel full is appended to the
//! query's [`Spill`] instead of making the source wait, and once the spill
//! holds anything, every later message goes through it too, so the query
//! sees them in order. A drain task ([`BufferedSender::open`] returns it)
//! takes the messages from the spill and sends them on, waiting for the
//! query as needed. Only when the spill is at its bound does the source
//! wait again, as it would without a buffer (back-pressure resumes). The
//! query sees every message once and in order: its results are those of an
//! unbuffered run, only later.
//!
//! # Checkpoints
//!
//! Barriers go through the buffer like any message, so a checkpoint
//! completes when its barrier drains. A source that can be read again from
//! a position (a file, a push stream with a write-ahead log) is read again
//! on restore and its buffer starts empty. For one that cannot (stdin, a
//! pipe), the checkpoint records the buffer's sequence number at the
//! barrier ([`BufferedSender::mark_barrier`]), and from the first barrier
//! on every message goes through the buffer, the query behind or not: the
//! buffer is then the log of what the source read. The records after a
//! barrier are kept until no kept checkpoint needs them, and on restore
//! those after the checkpoint's barrier are handed to the query again
//! (their rows: the old run's barriers and end of input are dropped) before
//! what the source reads anew. So a crash loses nothing read since the
//! checkpoint, except while the buffer was full: then messages go straight
//! to the query, as without a buffer.
//!
//! # Where
//!
//! With checkpoints and a named query, in `<checkpoint dir>/.buffers/<query
//! folder>/in<input>-<stream>` (a name no query folder can have), kept
//! across runs. Otherwise in a fresh folder under the system's temporary
//! folder, deleted when the query ends: it survives no crash.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::Notify;

use super::channel::{Closed, Reservation, Sender};
use super::checkpoint::QueryCheckpoints;
use super::frames::safe_name;
use super::spill::{Record, Spill, SpillOptions};
use crate::connector::SourceStats;
use crate::error::{Error, Result};
use crate::exec::Message;
use crate::state::store::{SourceEntry, folder_name};

/// The folder, under a checkpoint directory, of the disk buffers.
pub const BUFFERS_DIR: &str = ".buffers";

/// The folder of input `input` (reading `stream`) of query `query`'s disk
/// buffer, under checkpoint directory `root`.
pub fn buffer_dir(root: &Path, query: &str, input: usize, stream: &str) -> Result<PathBuf> {
    Ok(root
        .join(BUFFERS_DIR)
        .join(folder_name(query)?)
        .join(format!("in{input}-{}", safe_name(stream))))
}

/// How the records a query has taken are let go.
const RELEASE_TAKEN: u8 = 0;
/// Kept behind the oldest kept checkpoint: the source cannot be read again.
const RELEASE_CHECKPOINTED: u8 = 1;
/// Not known until the first barrier: kept meanwhile.
const RELEASE_UNKNOWN: u8 = 2;

/// What a buffer holds and did, for one query's input.
#[derive(Debug, Default)]
pub struct BufferCounters {
    /// Rows in it not yet handed to the query.
    pub rows: AtomicU64,
    /// Bytes it keeps on disk.
    pub bytes: AtomicU64,
    /// The most bytes it kept at once.
    pub peak_bytes: AtomicU64,
    /// Messages that went through it.
    pub spilled: AtomicU64,
    /// A message waits because it is full.
    pub full: AtomicBool,
    /// Times a message had to wait because it was full.
    pub full_waits: AtomicU64,
    /// Nanoseconds messages waited for room (the buffer full, or the query
    /// behind with nothing buffered): how long the source was held up.
    pub blocked_ns: AtomicU64,
}

/// What the sender and the drain task share.
struct Shared {
    spill: Spill,
    /// Records appended and not yet handed to the query: while there are
    /// any, messages go through the spill.
    undelivered: AtomicU64,
    /// Wakes the drain task: something was appended, or the sender is gone.
    appended: Notify,
    /// Wakes a sender waiting for room.
    room: Notify,
    /// The sender is gone: the drain ends once the spill is empty.
    closed: AtomicBool,
    /// Why appending failed: the drain task fails the query with it.
    failed: Mutex<Option<String>>,
    /// Records up to this one are from before a restore: of them, only
    /// batches go to the query.
    replay_through: u64,
    /// Barriers and the spill's sequence number at each, oldest first.
    barriers: Mutex<VecDeque<(u64, u64)>>,
    /// How taken records are let go (`RELEASE_*`).
    release: AtomicU8,
    checkpoints: Option<Arc<QueryCheckpoints>>,
    counters: Arc<BufferCounters>,
    /// The source's counters, once the source is started.
    source: OnceLock<Arc<SourceStats>>,
    /// What was last added to the source's counters.
    reported: Mutex<(u64, u64)>,
    /// A temporary folder, deleted with the buffer.
    _temp: Option<tempfile::TempDir>,
}

/// Sends a query's input through its disk buffer when the query is behind;
/// see the [module docs](self).
pub struct BufferedSender {
    tx: Sender,
    shared: Arc<Shared>,
}

/// Where a buffer is, and what a restore left in it.
pub struct BufferPlace {
    /// Its folder; `None` for a temporary one.
    pub dir: Option<PathBuf>,
    /// The checkpoint restored and where it left the stream: a source that
    /// could not be read again has its buffer's records after
    /// [`SourceEntry::buffer`] handed to the query again.
    pub restored: Option<(u64, SourceEntry)>,
}

/// The task that hands a buffer's messages to the query.
pub type Drain = std::pin::Pin<Box<dyn Future<Output = Result<()>> + Send>>;

impl BufferedSender {
    /// A buffer of at most `max_bytes` in front of `tx`, and its drain task
    /// (to be spawned with the query's tasks: it fails the query if the
    /// buffer cannot be read or written).
    pub fn open(
        tx: Sender,
        max_bytes: u64,
        place: BufferPlace,
        checkpoints: Option<Arc<QueryCheckpoints>>,
    ) -> Result<(BufferedSender, Drain)> {
        let (dir, temp) = match place.dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("vigil-buffer-")
                    .tempdir()
                    .map_err(|e| Error::io("cannot create a folder for a disk buffer", e))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let spill = Spill::open(&dir, SpillOptions::new(max_bytes))?;
        let mut barriers = VecDeque::new();
        let replay =
            place
                .restored
                .as_ref()
                .and_then(|(id, entry)| match (&entry.position, entry.buffer) {
                    (None, Some(seq)) => Some((*id, seq)),
                    _ => None,
                });
        match replay {
            Some((id, seq)) if spill.read_from(seq).is_ok() => barriers.push_back((id, seq)),
            Some((_, seq)) => {
                crate::diag::warning!(
                    "disk buffer {} no longer holds the records after {seq}; the restored query misses them",
                    dir.display()
                );
                spill.clear()?;
            }
            None => spill.clear()?,
        }
        let release = match (&checkpoints, replay) {
            (None, _) => RELEASE_TAKEN,
            (Some(_), Some(_)) => RELEASE_CHECKPOINTED,
            (Some(_), None) => RELEASE_UNKNOWN,
        };
        let shared = Arc::new(Shared {
            undelivered: AtomicU64::new(spill.last_seq() - spill.head()),
            replay_through: spill.last_seq(),
            spill,
            appended: Notify::new(),
            room: Notify::new(),
            closed: AtomicBool::new(false),
            failed: Mutex::new(None),
            barriers: Mutex::new(barriers),
            release: AtomicU8::new(release),
            checkpoints,
            counters: Arc::new(BufferCounters::default()),
            source: OnceLock::new(),
            reported: Mutex::new((0, 0)),
            _temp: temp,
        });
        shared.report();
        let drain = Box::pin(drain(shared.clone(), tx.clone()));
        Ok((BufferedSender { tx, shared }, drain))
    }

    /// The buffer's counters.
    pub fn counters(&self) -> &Arc<BufferCounters> {
        &self.shared.counters
    }

    /// Adds the buffer's rows and bytes to `stats` (the source's counters)
    /// from now on.
    pub fn report_to(&self, stats: Arc<SourceStats>) {
        if self.shared.source.set(stats).is_ok() {
            self.shared.report();
        }
    }

    /// The folder the buffer is in.
    pub fn dir(&self) -> &Path {
        self.shared.spill.dir()
    }

    /// The query's channel.
    pub fn channel(&self) -> &Sender {
        &self.tx
    }

    /// True once the query has stopped listening.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Notes that checkpoint barrier `id` is about to be sent by a source
    /// that can be read again from where it stands (`readable_again`) or
    /// not; for one that cannot, the buffer's sequence number to record in
    /// the checkpoint (`None` without checkpoints).
    pub fn mark_barrier(&self, id: u64, readable_again: bool) -> Option<u64> {
        let shared = &self.shared;
        shared.checkpoints.as_ref()?;
        let mode = if readable_again {
            RELEASE_TAKEN
        } else {
            RELEASE_CHECKPOINTED
        };
        shared.release.store(mode, Ordering::Release);
        if readable_again {
            return None;
        }
        let seq = shared.spill.last_seq();
        shared.lock_barriers().push_back((id, seq));
        Some(seq)
    }

    /// Sends `message`: at once if the query has room and nothing is
    /// buffered, else through the buffer, waiting only while the buffer is
    /// full. For a source that cannot be read again, once a checkpoint has
    /// counted on the buffer, every message goes through it (so that a
    /// restore finds everything after the checkpoint). False once the query
    /// has stopped listening (or the buffer failed, which fails the query).
    pub async fn send(&self, message: Message) -> bool {
        let shared = &self.shared;
        if self.tx.is_closed() {
            return false;
        }
        let direct = shared.undelivered.load(Ordering::Acquire) == 0
            && shared.release.load(Ordering::Acquire) != RELEASE_CHECKPOINTED;
        if direct && self.tx.try_send(message.clone()) {
            return true;
        }
        let record = match Record::encode(&message) {
            Ok(record) => record,
            Err(e) => return shared.fail(e),
        };
        let fits = shared.spill.fits(&record);
        loop {
            let room = shared.room.notified();
            if fits {
                match shared.append(&record, matches!(message, Message::Barrier(_))) {
                    Ok(true) => {
                        shared.set_full(false);
                        return true;
                    }
                    Ok(false) => {}
                    Err(e) => return shared.fail(e),
                }
            }
            if shared.undelivered.load(Ordering::Acquire) == 0 {
                // Everything buffered has been handed on: the message can
                // go straight to the query, waiting as it would unbuffered.
                shared.set_full(false);
                let started = std::time::Instant::now();
                let sent = self.tx.send(message).await.is_ok();
                shared.charge(started);
                return sent;
            }
            if self.tx.is_closed() {
                return false;
            }
            if !shared.counters.full.load(Ordering::Relaxed) {
                shared.counters.full_waits.fetch_add(1, Ordering::Relaxed);
            }
            shared.set_full(true);
            let started = std::time::Instant::now();
            room.await;
            shared.charge(started);
        }
    }

    /// Sends `message` like [`BufferedSender::send`], from a thread outside
    /// the async runtime (a source reading a file).
    pub fn blocking_send(&self, message: Message) -> bool {
        futures::executor::block_on(self.send(message))
    }

    /// Waits at most until `deadline` for room for `batch` (a push that
    /// may give up): `Some(None)` when the buffer has room, so that
    /// [`BufferedSender::send`] takes it without waiting; `Some(Some(room))`
    /// when nothing is buffered but the buffer is full of records kept for
    /// checkpoints, and the room is in the query's channel; `None` at the
    /// deadline. The room holds while no other message is sent.
    pub async fn room_within(
        &self,
        batch: &RecordBatch,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Option<Reservation>>, Closed> {
        let shared = &self.shared;
        // Arrow's IPC form is about the batch's memory, plus its schema.
        let size = batch.get_array_memory_size() as u64 + 4096;
        let max = shared.spill.options().max_bytes;
        loop {
            let room = shared.room.notified();
            if self.tx.is_closed() {
                return Err(Closed);
            }
            if shared.spill.bytes() + size <= max {
                return Ok(Some(None));
            }
            if shared.undelivered.load(Ordering::Acquire) == 0 {
                let reserved = self.tx.reserve_within(batch.num_rows(), deadline).await?;
                return Ok(reserved.map(Some));
            }
            if !shared.counters.full.swap(true, Ordering::Relaxed) {
                shared.counters.full_waits.fetch_add(1, Ordering::Relaxed);
            }
            shared.set_full(true);
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Ok(None);
            }
        }
    }
}

impl Drop for BufferedSender {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.appended.notify_one();
    }
}

impl Shared {
    fn lock_barriers(&self) -> MutexGuard<'_, VecDeque<(u64, u64)>> {
        self.barriers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `record`; false when the spill is full.
    fn append(&self, record: &Record, barrier: bool) -> Result<bool> {
        self.undelivered.fetch_add(1, Ordering::AcqRel);
        let appended = self.spill.append_record(record);
        if !matches!(appended, Ok(Some(_))) {
            self.undelivered.fetch_sub(1, Ordering::AcqRel);
            return appended.map(|_| false);
        }
        if barrier && self.release.load(Ordering::Acquire) != RELEASE_TAKEN {
            // A checkpoint will count on what is before it.
            self.spill.sync()?;
        }
        self.counters.spilled.fetch_add(1, Ordering::Relaxed);
        self.report();
        self.appended.notify_one();
        Ok(true)
    }

    /// Notes that the buffer failed; the drain task fails the query.
    fn fail(&self, e: Error) -> bool {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e.to_string());
        self.appended.notify_one();
        false
    }

    /// Counts the time since `started` as the source held up.
    fn charge(&self, started: std::time::Instant) {
        let waited = started.elapsed().as_nanos() as u64;
        self.counters
            .blocked_ns
            .fetch_add(waited, Ordering::Relaxed);
    }

    fn set_full(&self, full: bool) {
        self.counters.full.store(full, Ordering::Relaxed);
        if let Some(source) = self.source.get() {
            source.buffer_full.store(full, Ordering::Relaxed);
        }
    }

    /// Updates the counters from the spill (and the source's by the change).
    fn report(&self) {
        let (rows, bytes) = (self.spill.len_rows(), self.spill.bytes());
        let counters = &self.counters;
        counters.rows.store(rows, Ordering::Relaxed);
        counters.bytes.store(bytes, Ordering::Relaxed);
        counters.peak_bytes.fetch_max(bytes, Ordering::Relaxed);
        let Some(source) = self.source.get() else {
            return;
        };
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        let (old_rows, old_bytes) = *reported;
        source.buffered_rows.fetch_add(rows, Ordering::Relaxed);
        source.buffered_rows.fetch_sub(old_rows, Ordering::Relaxed);
        source.buffered_bytes.fetch_add(bytes, Ordering::Relaxed);
        source
            .buffered_bytes
            .fetch_sub(old_bytes, Ordering::Relaxed);
        *reported = (rows, bytes);
    }

    /// Lets go of what no one needs after record `taken` was handed on.
    fn release(&self, taken: u64) -> Result<()> {
        let through = match self.release.load(Ordering::Acquire) {
            RELEASE_TAKEN => taken,
            RELEASE_UNKNOWN => 0,
            _ => self.kept_from(),
        };
        self.spill.release_through(through.min(taken))
    }

    /// The sequence number at the barrier of the oldest checkpoint kept:
    /// a restore may read from there (0 while no checkpoint is complete).
    fn kept_from(&self) -> u64 {
        let Some(oldest) = self.checkpoints.as_ref().and_then(|c| c.oldest_kept()) else {
            return 0;
        };
        let mut barriers = self.lock_barriers();
        while barriers.len() > 1 && barriers[1].0 <= oldest {
            barriers.pop_front();
        }
        match barriers.front() {
            Some(&(id, seq)) if id <= oldest => seq,
            _ => 0,
        }
    }

    fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Hands the buffer's messages to the query in order, waiting for it; ends
/// once the sender is gone and everything is handed on, or the query stops
/// listening.
async fn drain(shared: Arc<Shared>, tx: Sender) -> Result<()> {
    loop {
        let appended = shared.appended.notified();
        if let Some(why) = shared.failure() {
            return Err(Error::Connector(why));
        }
        let Some((seq, message)) = shared.spill.pop()? else {
            if shared.closed.load(Ordering::Acquire) && shared.spill.is_empty() {
                return Ok(());
            }
            appended.await;
            continue;
        };
        let replayed = seq <= shared.replay_through;
        let rows = matches!(message, Message::Batch(_) | Message::Changes(..));
        if (rows || !replayed) && tx.send(message).await.is_err() {
            return Ok(());
        }
        shared.undelivered.fetch_sub(1, Ordering::AcqRel);
        shared.release(seq)?;
        shared.report();
        shared.room.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::exec::metrics::QueueGauge;
    use crate::runtime::channel::{self, Receiver};
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;

    use super::*;
    use crate::connector::SourcePosition;

    fn batch(n: i64) -> Message {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let values: Vec<i64> = (n..n + 100).collect();
        Message::Batch(
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values))]).unwrap(),
        )
    }

    fn show(message: &Message) -> String {
        match message {
            Message::Batch(b) => {
                let n = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                format!("b{}", n.value(0))
            }
            Message::Watermark(ms) => format!("w{ms}"),
            Message::Barrier(id) => format!("x{id}"),
            other => format!("{other:?}"),
        }
    }

    fn temporary() -> BufferPlace {
        BufferPlace {
            dir: None,
            restored: None,
        }
    }

    /// A channel of `messages` messages.
    fn bounded(messages: usize) -> (Sender, Receiver) {
        channel::bounded(messages, 1 << 20, Arc::new(QueueGauge::default()))
    }

    async fn receive(rx: &mut Receiver, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(show(&rx.recv().await.unwrap()));
        }
        out
    }

    #[tokio::test]
    async fn a_query_that_is_behind_does_not_hold_up_the_sender() {
        let (tx, mut rx) = bounded(2);
        let (sender, drain) = BufferedSender::open(tx, 1 << 30, temporary(), None).unwrap();
        let drain = tokio::spawn(drain);
        let dir = sender.dir().to_path_buf();
        // Nobody reads: everything past the channel's two goes to disk.
        for n in 0..50 {
            assert!(sender.send(batch(n * 100)).await);
        }
        assert!(sender.send(Message::Watermark(i64::MAX)).await);
        let counters = sender.counters().clone();
        assert!(counters.spilled.load(Ordering::Relaxed) >= 45);
        assert!(counters.rows.load(Ordering::Relaxed) >= 4500);
        assert!(counters.bytes.load(Ordering::Relaxed) > 0);
        assert!(!counters.full.load(Ordering::Relaxed));
        let want: Vec<String> = (0..50)
            .map(|n| format!("b{}", n * 100))
            .chain(["w9223372036854775807".to_string()])
            .collect();
        assert_eq!(receive(&mut rx, 51).await, want, "in order");
        drop(sender);
        drain.await.unwrap().unwrap();
        assert!(rx.recv().await.is_none(), "the channel ends with the drain");
        assert_eq!(counters.rows.load(Ordering::Relaxed), 0);
        assert_eq!(counters.bytes.load(Ordering::Relaxed), 0, "read and let go");
        assert!(!dir.exists(), "a temporary buffer is deleted with it");
    }

    #[tokio::test]
    async fn a_full_buffer_makes_the_sender_wait_until_the_query_catches_up() {
        let (tx, mut rx) = bounded(1);
        let record = Record::encode(&batch(0)).unwrap().size();
        let max = 1 << 20;
        let (sender, drain) = BufferedSender::open(tx, max, temporary(), None).unwrap();
        tokio::spawn(drain);
        let stats = Arc::new(SourceStats::default());
        sender.report_to(stats.clone());
        let sender = Arc::new(sender);
        let count = 2 * (max / record) as i64;
        let sending = sender.clone();
        let producer = tokio::spawn(async move {
            for n in 0..count {
                assert!(sending.send(batch(n)).await);
            }
        });
        // The buffer fills up and the producer waits.
        let counters = sender.counters().clone();
        while !counters.full.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(stats.buffer_full.load(Ordering::Relaxed));
        assert!(!producer.is_finished());
        assert!(stats.buffered_bytes.load(Ordering::Relaxed) <= max);
        assert!(stats.buffered_rows.load(Ordering::Relaxed) > 0);
        // Catching up lets it go on; everything arrives once, in order.
        let got = receive(&mut rx, count as usize).await;
        assert_eq!(got, (0..count).map(|n| format!("b{n}")).collect::<Vec<_>>());
        producer.await.unwrap();
        assert!(counters.peak_bytes.load(Ordering::Relaxed) <= max);
        assert!(counters.full_waits.load(Ordering::Relaxed) >= 1);
        assert!(!stats.buffer_full.load(Ordering::Relaxed));
        assert_eq!(stats.buffered_rows.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_restore_hands_on_the_rows_after_the_checkpoint_again() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("in0");
        let (tx, rx) = bounded(1);
        let place = BufferPlace {
            dir: Some(dir.clone()),
            restored: None,
        };
        let (sender, drain) = BufferedSender::open(tx, 1 << 30, place, None).unwrap();
        let drain = tokio::spawn(drain);
        for message in [batch(1), batch(2), Message::Barrier(4), batch(3), batch(5)] {
            assert!(sender.send(message).await);
        }
        assert!(sender.send(Message::Watermark(i64::MAX)).await);
        // As at a crash: the query took the first batch, no more.
        drain.abort();
        drop((sender, rx));

        let (tx, mut rx) = bounded(8);
        let entry = SourceEntry {
            stream: "s".into(),
            position: None,
            ended: false,
            buffer: Some(2),
        };
        let place = BufferPlace {
            dir: Some(dir.clone()),
            restored: Some((4, entry)),
        };
        let (sender, drain) = BufferedSender::open(tx, 1 << 30, place, None).unwrap();
        tokio::spawn(drain);
        assert!(sender.send(batch(7)).await, "new input goes after the old");
        assert!(sender.send(Message::Watermark(i64::MAX)).await);
        drop(sender);
        let mut got = Vec::new();
        while let Some(message) = rx.recv().await {
            got.push(show(&message));
        }
        // The old run's barrier and end of input are not handed on again.
        assert_eq!(got, ["b3", "b5", "b7", "w9223372036854775807"]);

        // A source that can be read again starts with an empty buffer.
        let (tx, mut rx) = bounded(8);
        let entry = SourceEntry {
            stream: "s".into(),
            position: Some(SourcePosition::default()),
            ended: false,
            buffer: None,
        };
        let place = BufferPlace {
            dir: Some(dir),
            restored: Some((4, entry)),
        };
        let (sender, drain) = BufferedSender::open(tx, 1 << 30, place, None).unwrap();
        tokio::spawn(drain);
        assert!(sender.send(batch(9)).await);
        drop(sender);
        assert_eq!(show(&rx.recv().await.unwrap()), "b9");
        assert!(rx.recv().await.is_none());
    }

    #[tokio::test]
    async fn records_are_kept_behind_the_oldest_kept_checkpoint_only() {
        use crate::runtime::checkpoint::{CheckpointConfig, Coordinator};
        let root = tempfile::tempdir().unwrap();
        let mut config = CheckpointConfig::new(root.path().join("ck"));
        config.keep = 1;
        let coordinator = Arc::new(Coordinator::new(config));
        let checkpoints = Arc::new(
            QueryCheckpoints::open(coordinator, "q", Arc::new(Default::default())).unwrap(),
        );
        let (tx, mut rx) = bounded(4);
        let place = BufferPlace {
            dir: Some(root.path().join("buffer")),
            restored: None,
        };
        let (sender, drain) =
            BufferedSender::open(tx, 1 << 20, place, Some(checkpoints.clone())).unwrap();
        tokio::spawn(drain);
        // A source that cannot be read again: from its first barrier on,
        // everything goes through the buffer and stays there.
        assert_eq!(sender.mark_barrier(1, false), Some(0));
        let mut sent = 0;
        let mut send_all = async |n: usize| {
            for _ in 0..n {
                assert!(sender.send(batch(sent)).await);
                sent += 100;
            }
        };
        send_all(500).await;
        assert_eq!(receive(&mut rx, 500).await.len(), 500);
        let counters = sender.counters().clone();
        let kept = counters.bytes.load(Ordering::Relaxed);
        assert!(
            kept > 500 << 10,
            "read, but kept for checkpoint 1: {kept} bytes"
        );
        checkpoints.complete(1, None);
        let at = sender.mark_barrier(2, false).unwrap();
        assert_eq!(at, 500);
        assert!(sender.send(Message::Barrier(2)).await);
        send_all(10).await;
        receive(&mut rx, 11).await;
        let before = counters.bytes.load(Ordering::Relaxed);
        assert!(before >= kept, "checkpoint 2 is not complete: all is kept");
        // Checkpoint 2 complete, 1 no longer kept: what is before 2's
        // barrier goes (whole segments), what is after it stays.
        checkpoints.complete(2, None);
        send_all(1).await;
        receive(&mut rx, 1).await;
        let after = counters.bytes.load(Ordering::Relaxed);
        assert!(after < before / 2, "{after} of {before} bytes kept");
        assert!(after > 0, "the records after barrier 2 are kept");
    }
}
