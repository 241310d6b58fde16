//! The channels between a query's tasks: bounded in messages and in rows.
//!
//! A bound in messages alone lets a queue of large batches hold any number
//! of rows, so each channel also has a budget of rows: a sender takes as
//! many of them as its batch has rows (at most the whole budget, so a batch
//! larger than the budget still passes, alone) and the receiver gives them
//! back as it takes the batch. A full channel makes its sender wait, which
//! is how back-pressure travels from a slow sink to the source: the source
//! stops reading, and a push waits and then gives up (see
//! [`Sender::reserve_within`]).
//!
//! Each channel fills a [`QueueGauge`]: the rows and messages waiting in
//! it, the rows it delivered, and how long its sender waited.
//!
//! A receiver made [`Receiver::per_record`] hands its batches on one row
//! at a time, which is how a per-record query sees its input: the source
//! sends whole batches, and the split costs one hand-off per batch instead
//! of one per row.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};

use crate::connector::RowKind;
use crate::exec::Message;
use crate::exec::metrics::QueueGauge;

/// Messages a channel holds before its sender waits.
pub const CHANNEL_MESSAGES: usize = 16;

/// Rows a channel holds before its sender waits.
pub const CHANNEL_ROWS: usize = 64 * 1024;

/// The receiver is gone: nothing more can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// What travels in the channel: a message and the rows it holds of the
/// budget, given back when it is taken out.
struct Slot {
    message: Message,
    rows: u64,
    _budget: OwnedSemaphorePermit,
}

/// Makes a channel of the default bounds that reports to `gauge`.
pub fn channel(gauge: Arc<QueueGauge>) -> (Sender, Receiver) {
    bounded(CHANNEL_MESSAGES, CHANNEL_ROWS, gauge)
}

/// Makes a channel holding at most `messages` messages and (nearly, see
/// the module doc) `rows` rows.
pub fn bounded(messages: usize, rows: usize, gauge: Arc<QueueGauge>) -> (Sender, Receiver) {
    let (tx, rx) = mpsc::channel(messages.max(1));
    let budget = Arc::new(Semaphore::new(rows.max(1)));
    let sender = Sender {
        tx,
        budget: budget.clone(),
        max_rows: rows.max(1),
        gauge: gauge.clone(),
    };
    let receiver = Receiver {
        rx,
        budget,
        gauge,
        per_record: false,
        pending: None,
    };
    (sender, receiver)
}

/// The sending side; cloning it gives another sender into the same queue.
#[derive(Clone)]
pub struct Sender {
    tx: mpsc::Sender<Slot>,
    budget: Arc<Semaphore>,
    max_rows: usize,
    gauge: Arc<QueueGauge>,
}

/// Room for one message of a known number of rows, taken ahead of sending
/// it, so that a message goes to several channels at once or to none.
pub struct Reservation {
    slot: mpsc::OwnedPermit<Slot>,
    budget: OwnedSemaphorePermit,
    gauge: Arc<QueueGauge>,
}

impl Reservation {
    /// Sends `message` into the room taken (its rows should be those the
    /// reservation was made for).
    pub fn send(self, message: Message) {
        let rows = rows_of(&message);
        count_in(&self.gauge, rows);
        self.slot.send(Slot {
            message,
            rows,
            _budget: self.budget,
        });
    }
}

impl Sender {
    /// Sends `message`, waiting while the channel is full.
    pub async fn send(&self, message: Message) -> Result<(), Closed> {
        let rows = rows_of(&message);
        let budget = self.take_budget(rows).await?;
        let slot = match self.tx.try_reserve() {
            Ok(slot) => slot,
            Err(mpsc::error::TrySendError::Closed(())) => return Err(Closed),
            Err(mpsc::error::TrySendError::Full(())) => {
                let started = Instant::now();
                let slot = self.tx.reserve().await.map_err(|_| Closed);
                self.charge_wait(started);
                slot?
            }
        };
        count_in(&self.gauge, rows);
        slot.send(Slot {
            message,
            rows,
            _budget: budget,
        });
        Ok(())
    }

    /// Sends `message` from a thread outside the async runtime (a source
    /// reading a file), blocking it while the channel is full.
    pub fn blocking_send(&self, message: Message) -> Result<(), Closed> {
        futures::executor::block_on(self.send(message))
    }

    /// Sends `message` if there is room now; false if there is none or
    /// the receiver is gone.
    pub fn try_send(&self, message: Message) -> bool {
        let rows = rows_of(&message);
        let Ok(budget) = self.budget.clone().try_acquire_many_owned(self.share(rows)) else {
            return false;
        };
        let Ok(slot) = self.tx.try_reserve() else {
            return false;
        };
        count_in(&self.gauge, rows);
        slot.send(Slot {
            message,
            rows,
            _budget: budget,
        });
        true
    }

    /// Takes room for one message of `rows` rows, waiting at most until
    /// `deadline`; `Ok(None)` if it was still full then.
    pub async fn reserve_within(
        &self,
        rows: usize,
        deadline: tokio::time::Instant,
    ) -> Result<Option<Reservation>, Closed> {
        let take = async {
            let budget = self.take_budget(rows as u64).await?;
            let slot = self.tx.clone().reserve_owned().await.map_err(|_| Closed)?;
            Ok(Reservation {
                slot,
                budget,
                gauge: self.gauge.clone(),
            })
        };
        match tokio::time::timeout_at(deadline, take).await {
            Ok(reserved) => reserved.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// True once the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// What this channel reports to.
    pub fn gauge(&self) -> &Arc<QueueGauge> {
        &self.gauge
    }

    async fn take_budget(&self, rows: u64) -> Result<OwnedSemaphorePermit, Closed> {
        let share = self.share(rows);
        match self.budget.clone().try_acquire_many_owned(share) {
            Ok(budget) => Ok(budget),
            Err(TryAcquireError::Closed) => Err(Closed),
            Err(TryAcquireError::NoPermits) => {
                let started = Instant::now();
                let budget = self.budget.clone().acquire_many_owned(share).await;
                self.charge_wait(started);
                budget.map_err(|_| Closed)
            }
        }
    }

    /// The rows of the budget a message of `rows` rows takes.
    fn share(&self, rows: u64) -> u32 {
        rows.min(self.max_rows as u64) as u32
    }

    fn charge_wait(&self, started: Instant) {
        let waited = started.elapsed().as_nanos() as u64;
        self.gauge.blocked_ns.fetch_add(waited, Ordering::Relaxed);
    }
}

/// The receiving side.
pub struct Receiver {
    rx: mpsc::Receiver<Slot>,
    budget: Arc<Semaphore>,
    gauge: Arc<QueueGauge>,
    per_record: bool,
    /// A batch being handed on row by row: its rows, its kind, and the next
    /// row.
    pending: Option<(RecordBatch, Option<RowKind>, usize)>,
}

impl Receiver {
    /// Hands batches on one row at a time.
    pub fn per_record(mut self) -> Self {
        self.per_record = true;
        self
    }

    /// The next message; `None` once every sender is gone and the channel
    /// is empty.
    pub async fn recv(&mut self) -> Option<Message> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Waits for the next message on a thread outside the async runtime.
    pub fn blocking_recv(&mut self) -> Option<Message> {
        futures::executor::block_on(self.recv())
    }

    /// Polls for the next message.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        if let Some(row) = self.next_row() {
            return Poll::Ready(Some(row));
        }
        let slot = match self.rx.poll_recv(cx) {
            Poll::Ready(Some(slot)) => slot,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        self.gauge
            .queued_rows
            .fetch_sub(slot.rows, Ordering::Relaxed);
        self.gauge.queued_messages.fetch_sub(1, Ordering::Relaxed);
        self.gauge
            .received_rows
            .fetch_add(slot.rows, Ordering::Relaxed);
        let message = slot.message;
        match message {
            Message::Batch(batch) if self.per_record && batch.num_rows() > 1 => {
                self.pending = Some((batch, None, 0));
                Poll::Ready(self.next_row())
            }
            Message::Changes(batch, kind) if self.per_record && batch.num_rows() > 1 => {
                self.pending = Some((batch, Some(kind), 0));
                Poll::Ready(self.next_row())
            }
            other => Poll::Ready(Some(other)),
        }
    }

    /// Takes a message if one is waiting.
    pub fn try_recv(&mut self) -> Option<Message> {
        let waker = futures::task::noop_waker();
        match self.poll_recv(&mut Context::from_waker(&waker)) {
            Poll::Ready(message) => message,
            Poll::Pending => None,
        }
    }

    fn next_row(&mut self) -> Option<Message> {
        let (batch, kind, next) = self.pending.as_mut()?;
        let row = batch.slice(*next, 1);
        let message = match kind {
            None => Message::Batch(row),
            Some(kind) => Message::Changes(row, *kind),
        };
        *next += 1;
        if *next == batch.num_rows() {
            self.pending = None;
        }
        Some(message)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // Wakes senders waiting for rows of the budget: they see `Closed`
        // instead of waiting for a receiver that is gone.
        self.budget.close();
    }
}

fn rows_of(message: &Message) -> u64 {
    match message {
        Message::Batch(batch) | Message::Changes(batch, _) => batch.num_rows() as u64,
        _ => 0,
    }
}

fn count_in(gauge: &QueueGauge, rows: u64) {
    gauge.queued_rows.fetch_add(rows, Ordering::Relaxed);
    gauge.queued_messages.fetch_add(1, Ordering::Relaxed);
}

/// How long a push waits for room before it is refused, unless set.
pub const DEFAULT_INGEST_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn batch(rows: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        RecordBatch::try_new(
            schema,
            vec![Arc::new(Int64Array::from_iter_values(0..rows))],
        )
        .unwrap()
    }

    fn gauge() -> Arc<QueueGauge> {
        Arc::new(QueueGauge::new("test", "s0"))
    }

    #[tokio::test]
    async fn bounded_in_rows_not_only_messages() {
        let (tx, mut rx) = bounded(16, 100, gauge());
        tx.send(Message::Batch(batch(60))).await.unwrap();
        // 60 + 60 > 100: the second batch waits although 15 messages fit.
        assert!(!tx.try_send(Message::Batch(batch(60))));
        assert_eq!(tx.gauge().queued_rows.load(Ordering::Relaxed), 60);
        // Watermarks take no rows.
        tx.send(Message::Watermark(5)).await.unwrap();
        assert!(matches!(rx.recv().await, Some(Message::Batch(b)) if b.num_rows() == 60));
        tx.send(Message::Batch(batch(60))).await.unwrap();
        let g = tx.gauge();
        assert_eq!(g.queued_rows.load(Ordering::Relaxed), 60);
        assert_eq!(g.queued_messages.load(Ordering::Relaxed), 2);
        assert_eq!(g.received_rows.load(Ordering::Relaxed), 60);
    }

    #[tokio::test]
    async fn a_batch_larger_than_the_budget_passes_alone() {
        let (tx, mut rx) = bounded(16, 100, gauge());
        tx.send(Message::Batch(batch(500))).await.unwrap();
        assert!(!tx.try_send(Message::Batch(batch(1))));
        assert!(matches!(rx.recv().await, Some(Message::Batch(b)) if b.num_rows() == 500));
        assert!(tx.try_send(Message::Batch(batch(1))));
    }

    #[tokio::test]
    async fn a_waiting_sender_is_released_when_the_receiver_goes() {
        let (tx, rx) = bounded(16, 10, gauge());
        tx.send(Message::Batch(batch(10))).await.unwrap();
        let waiting = tokio::spawn(async move { tx.send(Message::Batch(batch(5))).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        assert_eq!(waiting.await.unwrap(), Err(Closed));
    }

    #[tokio::test]
    async fn waiting_is_measured() {
        let (tx, mut rx) = bounded(1, 10, gauge());
        tx.send(Message::Watermark(1)).await.unwrap();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            while rx.recv().await.is_some() {}
        });
        tx.send(Message::Watermark(2)).await.unwrap();
        let blocked = tx.gauge().blocked_ns.load(Ordering::Relaxed);
        assert!(blocked >= 20_000_000, "blocked {blocked} ns");
        drop(tx);
        reader.await.unwrap();
    }

    #[tokio::test]
    async fn a_reservation_times_out_on_a_full_channel() {
        let (tx, mut rx) = bounded(16, 10, gauge());
        tx.send(Message::Batch(batch(8))).await.unwrap();
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        assert!(tx.reserve_within(5, soon).await.unwrap().is_none());
        // A timed-out reservation gives back what it took.
        rx.recv().await.unwrap();
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        let room = tx.reserve_within(10, soon).await.unwrap().unwrap();
        room.send(Message::Batch(batch(10)));
        assert!(matches!(rx.recv().await, Some(Message::Batch(b)) if b.num_rows() == 10));
    }

    #[tokio::test]
    async fn per_record_hands_on_one_row_at_a_time() {
        let (tx, rx) = bounded(16, 100, gauge());
        let mut rx = rx.per_record();
        tx.send(Message::Batch(batch(3))).await.unwrap();
        tx.send(Message::Watermark(9)).await.unwrap();
        drop(tx);
        let mut seen = Vec::new();
        while let Some(m) = rx.recv().await {
            seen.push(match m {
                Message::Batch(b) => format!("rows {}", b.num_rows()),
                other => format!("{other:?}"),
            });
        }
        assert_eq!(seen, ["rows 1", "rows 1", "rows 1", "Watermark(9)"]);
    }

    #[test]
    fn blocking_send_and_recv_work_outside_the_runtime() {
        let (tx, mut rx) = bounded(2, 10, gauge());
        let sender = std::thread::spawn(move || {
            for i in 0..20 {
                tx.blocking_send(Message::Watermark(i)).unwrap();
            }
        });
        let mut got = 0;
        while let Some(Message::Watermark(w)) = rx.blocking_recv() {
            assert_eq!(w, got);
            got += 1;
        }
        sender.join().unwrap();
        assert_eq!(got, 20);
    }
}
