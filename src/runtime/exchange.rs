//! Exchanges: how the instances of a key-partitioned stage get their rows,
//! and where their outputs meet.
//!
//! A stage whose first operator keeps state per key runs as N instances.
//! Every task feeding it routes its rows with a [`Router`]: each batch is
//! split by the key group of its rows' keys (the hash checkpoints lay keyed
//! state out by, so a rescaled restore finds each key where its rows go),
//! and watermarks and barriers go to every instance. Each instance reads
//! its inputs through a [`Gather`], which takes the minimum of their
//! watermarks and aligns their barriers.
//!
//! Results do not depend on thread timing: the only task feeding a stage
//! of instances ends an epoch ([`Message::Epoch`]) after each batch it
//! routes, every instance hands the epochs on, and a gather releases what
//! each of its inputs sent in an epoch in input order, once all of them
//! reached its end. Watermarks and barriers end epochs too. So a run at a
//! given parallelism writes its results in one order, which a restore from
//! a checkpoint reproduces.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::array::UInt32Array;
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::physical_expr::PhysicalExpr;

use super::channel::{Receiver, Sender};

use crate::connector::RowKind;
use crate::error::{Error, Result};
use crate::exec::Message;
use crate::state::{instance_of, key_groups_of};

/// Where a task reads its messages from.
pub(super) enum Inbox {
    /// One upstream task.
    One(Receiver),
    /// Several, aligned.
    Gather(Gather),
}

impl Inbox {
    /// The next message; `None` once every input ended. Cancel-safe: a
    /// message taken from an input is kept until it is returned.
    pub(super) async fn recv(&mut self) -> Result<Option<Message>> {
        match self {
            Inbox::One(rx) => Ok(rx.recv().await),
            Inbox::Gather(gather) => gather.recv().await,
        }
    }
}

/// Where a task sends what its operators produce.
pub(super) enum Outbox {
    /// One downstream task (epochs end here: nothing after it needs them).
    One(Sender),
    /// The instances of a key-partitioned stage.
    Route(Router),
}

impl Outbox {
    /// Sends `messages` in order; false once downstream stopped listening.
    pub(super) async fn send(&mut self, messages: Vec<Message>) -> Result<bool> {
        match self {
            Outbox::One(tx) => {
                for message in messages {
                    if matches!(message, Message::Epoch) {
                        continue;
                    }
                    if tx.send(message).await.is_err() {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            Outbox::Route(router) => router.send(messages).await,
        }
    }

    /// Nanoseconds its senders have waited for room so far, together.
    pub(super) fn blocked_ns(&self) -> u64 {
        let waited = |tx: &Sender| {
            tx.gauge()
                .blocked_ns
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        match self {
            Outbox::One(tx) => waited(tx),
            Outbox::Route(router) => router.outputs.iter().map(waited).sum(),
        }
    }
}

/// Splits rows between the instances of a stage by the key group of their
/// key, and sends every watermark and barrier to all of them.
pub(super) struct Router {
    outputs: Vec<Sender>,
    keys: Vec<Arc<dyn PhysicalExpr>>,
    /// This is the only task feeding the instances: it ends an epoch after
    /// the rows of each step (otherwise it hands on the epochs it gets).
    sole: bool,
    /// Rows went out since the last message sent to every instance.
    open_epoch: bool,
}

impl Router {
    /// Routes to `outputs` (one per instance) by the value of `keys`.
    pub(super) fn new(outputs: Vec<Sender>, keys: Vec<Arc<dyn PhysicalExpr>>, sole: bool) -> Self {
        Self {
            outputs,
            keys,
            sole,
            open_epoch: false,
        }
    }

    async fn send(&mut self, messages: Vec<Message>) -> Result<bool> {
        for message in messages {
            let alive = match message {
                Message::Batch(batch) => self.rows(batch, None).await?,
                Message::Changes(batch, kind) => self.rows(batch, Some(kind)).await?,
                Message::Epoch if self.sole => true,
                control => self.broadcast(control).await,
            };
            if !alive {
                return Ok(false);
            }
        }
        if self.sole && self.open_epoch {
            return Ok(self.broadcast(Message::Epoch).await);
        }
        Ok(true)
    }

    async fn rows(&mut self, batch: RecordBatch, kind: Option<RowKind>) -> Result<bool> {
        for (instance, part) in self.split(&batch)? {
            let message = match kind {
                None => Message::Batch(part),
                Some(kind) => Message::Changes(part, kind),
            };
            if self.outputs[instance].send(message).await.is_err() {
                return Ok(false);
            }
            self.open_epoch = true;
        }
        Ok(true)
    }

    async fn broadcast(&mut self, message: Message) -> bool {
        self.open_epoch = false;
        for output in &self.outputs {
            if output.send(message.clone()).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The rows of `batch` per instance that owns them, in row order
    /// within each: one `take` of the whole batch, then slices.
    fn split(&self, batch: &RecordBatch) -> Result<Vec<(usize, RecordBatch)>> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let keys = self
            .keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(rows))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let n = self.outputs.len();
        let owners: Vec<usize> = key_groups_of(&keys, rows)?
            .into_iter()
            .map(|g| instance_of(g, n))
            .collect();
        let mut counts = vec![0usize; n];
        for &owner in &owners {
            counts[owner] += 1;
        }
        if let Some(only) = counts.iter().position(|&c| c == rows) {
            return Ok(vec![(only, batch.clone())]);
        }
        let mut starts = vec![0usize; n];
        for i in 1..n {
            starts[i] = starts[i - 1] + counts[i - 1];
        }
        let mut next = starts.clone();
        let mut order = vec![0u32; rows];
        for (row, &owner) in owners.iter().enumerate() {
            order[next[owner]] = row as u32;
            next[owner] += 1;
        }
        let sorted = take_record_batch(batch, &UInt32Array::from(order))?;
        Ok((0..n)
            .filter(|&i| counts[i] > 0)
            .map(|i| (i, sorted.slice(starts[i], counts[i])))
            .collect())
    }
}

/// Reads several inputs that carry the same watermarks, barriers and
/// epochs (the instances of one stage), and hands on, at the end of each
/// epoch, what every input sent in it, input by input.
pub(super) struct Gather {
    inputs: Vec<Receiver>,
    /// Per input, its rows in the current epoch.
    rows: Vec<Vec<Message>>,
    /// Per input, the message that ended its epoch, while the others catch
    /// up; it is not read meanwhile.
    held: Vec<Option<Message>>,
    closed: Vec<bool>,
    ready: VecDeque<Message>,
    /// Where the next poll starts, so no input starves the others.
    start: usize,
}

impl Gather {
    /// Gathers `inputs`, in this order.
    pub(super) fn new(inputs: Vec<Receiver>) -> Self {
        let n = inputs.len();
        Self {
            inputs,
            rows: (0..n).map(|_| Vec::new()).collect(),
            held: vec![None; n],
            closed: vec![false; n],
            ready: VecDeque::new(),
            start: 0,
        }
    }

    async fn recv(&mut self) -> Result<Option<Message>> {
        loop {
            if let Some(message) = self.ready.pop_front() {
                return Ok(Some(message));
            }
            if self.all_waiting() {
                if self.closed.iter().all(|c| *c) {
                    self.release_rows();
                    if self.ready.is_empty() {
                        return Ok(None);
                    }
                    continue;
                }
                self.release()?;
                continue;
            }
            let (index, message) = std::future::poll_fn(|cx| self.poll_any(cx)).await;
            match message {
                None => self.closed[index] = true,
                Some(rows @ (Message::Batch(_) | Message::Changes(..))) => {
                    self.rows[index].push(rows)
                }
                Some(end) => self.held[index] = Some(end),
            }
        }
    }

    /// True when no input can be read: each ended its epoch or closed.
    fn all_waiting(&self) -> bool {
        (0..self.inputs.len()).all(|i| self.closed[i] || self.held[i].is_some())
    }

    fn release_rows(&mut self) {
        for rows in &mut self.rows {
            self.ready.extend(rows.drain(..));
        }
    }

    /// Every open input ended the epoch: its rows, input by input, then the
    /// message that ended it.
    fn release(&mut self) -> Result<()> {
        self.release_rows();
        let ends: Vec<Message> = self.held.iter_mut().filter_map(Option::take).collect();
        self.ready.push_back(agreed(ends)?);
        Ok(())
    }

    fn poll_any(&mut self, cx: &mut Context<'_>) -> Poll<(usize, Option<Message>)> {
        let n = self.inputs.len();
        for k in 0..n {
            let i = (self.start + k) % n;
            if self.closed[i] || self.held[i].is_some() {
                continue;
            }
            if let Poll::Ready(message) = self.inputs[i].poll_recv(cx) {
                self.start = (i + 1) % n;
                return Poll::Ready((i, message));
            }
        }
        Poll::Pending
    }
}

/// The one message that ends an epoch on every input: the inputs are
/// instances of one stage fed alike, so they agree (the smallest
/// watermark is taken all the same).
fn agreed(ends: Vec<Message>) -> Result<Message> {
    let mut ends = ends.into_iter();
    let first = ends
        .next()
        .ok_or_else(|| Error::Plan("an epoch ended on no input".into()))?;
    ends.try_fold(first, |a, b| match (a, b) {
        (Message::Watermark(x), Message::Watermark(y)) => Ok(Message::Watermark(x.min(y))),
        (Message::Barrier(x), Message::Barrier(y)) if x == y => Ok(Message::Barrier(x)),
        (Message::Epoch, Message::Epoch) => Ok(Message::Epoch),
        (a, b) => Err(Error::Plan(format!(
            "the instances of a stage disagree: one sent {a:?}, another {b:?} (a bug in vigil)"
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::metrics::QueueGauge;
    use datafusion::arrow::array::{Array, AsArray, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::physical_expr::expressions::Column;

    fn channel(messages: usize) -> (Sender, Receiver) {
        super::super::channel::bounded(messages, 1 << 20, Arc::new(QueueGauge::default()))
    }

    fn batch(hosts: &[&str], values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("host", DataType::Utf8, false),
            Field::new("v", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(StringArray::from(hosts.to_vec())),
                Arc::new(Int64Array::from(values.to_vec())),
            ],
        )
        .unwrap()
    }

    fn router(n: usize, sole: bool) -> (Router, Vec<Receiver>) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel(64)).unzip();
        let keys = vec![Arc::new(Column::new("host", 0)) as Arc<dyn PhysicalExpr>];
        (Router::new(txs, keys, sole), rxs)
    }

    fn drain(rx: &mut Receiver) -> Vec<Message> {
        let mut out = Vec::new();
        while let Some(m) = rx.try_recv() {
            out.push(m);
        }
        out
    }

    fn values(messages: &[Message]) -> Vec<i64> {
        messages
            .iter()
            .filter_map(|m| match m {
                Message::Batch(b) => Some(b),
                _ => None,
            })
            .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    }

    #[tokio::test]
    async fn a_key_always_goes_to_one_instance_in_row_order() {
        let (mut router, mut rxs) = router(3, true);
        let hosts: Vec<String> = (0..60).map(|i| format!("h{}", i % 20)).collect();
        let names: Vec<&str> = hosts.iter().map(|h| h.as_str()).collect();
        let rows: Vec<i64> = (0..60).collect();
        let input = vec![Message::Batch(batch(&names, &rows)), Message::Watermark(5)];
        assert!(router.send(input).await.unwrap());
        let mut owner = std::collections::HashMap::new();
        let mut all = Vec::new();
        for (i, rx) in rxs.iter_mut().enumerate() {
            let got = drain(rx);
            assert!(matches!(got.last(), Some(Message::Watermark(5))), "{got:?}");
            let mine = values(&got);
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "row order kept");
            for v in &mine {
                let host = v % 20;
                assert_eq!(*owner.entry(host).or_insert(i), i, "host {host}");
            }
            all.extend(mine);
        }
        all.sort();
        assert_eq!(all, rows, "every row once");
        assert!(
            owner
                .values()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 1
        );
    }

    #[tokio::test]
    async fn the_sole_router_ends_an_epoch_after_rows() {
        let (mut router, mut rxs) = router(2, true);
        router
            .send(vec![Message::Batch(batch(
                &["a", "b", "c", "d"],
                &[1, 2, 3, 4],
            ))])
            .await
            .unwrap();
        router.send(vec![Message::Barrier(7)]).await.unwrap();
        for rx in &mut rxs {
            let got = drain(rx);
            let ends: Vec<&Message> = got
                .iter()
                .filter(|m| !matches!(m, Message::Batch(_)))
                .collect();
            assert!(
                matches!(ends.as_slice(), [Message::Epoch, Message::Barrier(7)]),
                "{got:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_gather_releases_epochs_in_input_order_whatever_the_timing() {
        for late_first in [false, true] {
            let (tx0, rx0) = channel(16);
            let (tx1, rx1) = channel(16);
            let mut gather = Gather::new(vec![rx0, rx1]);
            let send = |tx: &Sender, v: i64| {
                assert!(tx.try_send(Message::Batch(batch(&["x"], &[v]))));
                assert!(tx.try_send(Message::Epoch));
            };
            if late_first {
                send(&tx1, 10);
                send(&tx0, 0);
            } else {
                send(&tx0, 0);
                send(&tx1, 10);
            }
            assert!(tx0.try_send(Message::Watermark(9)));
            assert!(tx1.try_send(Message::Watermark(7)));
            drop((tx0, tx1));
            let mut got = Vec::new();
            while let Some(m) = gather.recv().await.unwrap() {
                got.push(m);
            }
            assert_eq!(values(&got), vec![0, 10]);
            assert!(matches!(got[2], Message::Epoch), "{got:?}");
            assert!(matches!(got[3], Message::Watermark(7)), "{got:?}");
            assert_eq!(got.len(), 4);
        }
    }

    #[tokio::test]
    async fn instances_that_disagree_are_an_error() {
        let (tx0, rx0) = channel(4);
        let (tx1, rx1) = channel(4);
        let mut gather = Gather::new(vec![rx0, rx1]);
        assert!(tx0.try_send(Message::Barrier(1)));
        assert!(tx1.try_send(Message::Barrier(2)));
        let e = gather.recv().await.unwrap_err().to_string();
        assert!(e.contains("disagree"), "{e}");
        let _ = (tx0, tx1);
    }

    #[test]
    fn an_empty_batch_goes_nowhere() {
        let (router, _rxs) = router(2, true);
        let empty = batch(&[], &[]);
        assert!(router.split(&empty).unwrap().is_empty());
        assert_eq!(empty.column(0).len(), 0);
    }
}
