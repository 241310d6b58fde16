//! Where the inputs of a multi-stream query meet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use datafusion::arrow::array::{Array, AsArray, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use super::channel::{CHANNEL_MESSAGES, Receiver, Sender};
use super::checkpoint::QueryCheckpoints;
use super::exchange::{Inbox, Outbox, Router};
use super::{Wiring, run_stage};
use crate::error::Result;
use crate::exec::Chain;
use crate::exec::{END_OF_INPUT, MergeOperator, Message, TimeOrderedUnion};
use crate::planner::Merge;
use crate::state::OperatorState;

/// How often idle inputs are looked for.
const IDLE_CHECK: Duration = Duration::from_millis(100);

/// Forwards every input's rows as they come (or, for a join, hands them to
/// the join) and, as the watermark, the minimum of the inputs' watermarks.
/// An input that has ended no longer holds the minimum back, and neither
/// does one that has sent nothing for its stream's `idle_timeout` (until it
/// sends again). An input that ends without its final watermark was
/// stopped (a stop with a savepoint, a partition leaving the process): the
/// run is stopping, so from then on the merged watermark stays where it is
/// and nothing still open fires, even if every other input has ended.
///
/// Checkpoint barriers are aligned: once an input sends barrier `n`, what
/// it sends next waits until every other input has sent `n` too (or ended);
/// then the join is snapshot into `checkpoints` and the barrier goes on. An
/// input that sends a newer barrier first makes the merge give up on `n`
/// and align on the newer one.
///
/// A merge operator that runs as several instances (see
/// [`MergeOperator::input_keys`]) has a task like this per instance, each
/// reading its share of every input's rows and every watermark and barrier,
/// and a plain merge of their outputs after them.
pub async fn run(
    inputs: Vec<(Receiver, Option<Duration>)>,
    mut join: Option<Box<dyn MergeOperator>>,
    output: Sender,
    checkpoints: Option<MergeSnapshots>,
) -> Result<()> {
    let (tagged_tx, mut tagged) = mpsc::channel(CHANNEL_MESSAGES);
    let mut state = Watermarks::new(inputs.iter().map(|(_, idle)| *idle).collect());
    if let Some(restored) = checkpoints.as_ref().and_then(|c| c.restored.as_ref()) {
        state.restore(restored)?;
    }
    let mut alignment = Alignment::new(inputs.len());
    for (index, (mut input, _)) in inputs.into_iter().enumerate() {
        let tx = tagged_tx.clone();
        tokio::spawn(async move {
            while let Some(message) = input.recv().await {
                if tx.send((index, Some(message))).await.is_err() {
                    return;
                }
            }
            let _ = tx.send((index, None)).await;
        });
    }
    drop(tagged_tx);
    let mut ticker = tokio::time::interval(IDLE_CHECK);
    loop {
        let item = match alignment.next_released() {
            Some(item) => Some(item),
            None => tokio::select! {
                item = tagged.recv() => match item {
                    None => return Ok(()),
                    Some(item) => Some(item),
                },
                _ = ticker.tick(), if state.watches_idleness() => None,
            },
        };
        let mut out = Vec::new();
        let advanced = match item {
            None => state.current(),
            Some((index, message)) => {
                let Some((index, message)) = alignment.admit(index, message) else {
                    continue;
                };
                match message {
                    None => {
                        let advanced = state.end(index);
                        alignment.end(index);
                        advanced
                    }
                    Some(Message::Barrier(id)) => {
                        alignment.barrier(index, id);
                        None
                    }
                    Some(Message::Watermark(w)) => state.observe(index, Some(w)),
                    // Epochs end where instances meet, before any merge.
                    Some(Message::Epoch) => None,
                    Some(rows) => {
                        state.observe(index, None);
                        match (&mut join, rows) {
                            (Some(join), Message::Batch(batch) | Message::Changes(batch, _)) => {
                                join.on_rows(index, batch)?;
                            }
                            (_, rows) => out.push(rows),
                        }
                        None
                    }
                }
            }
        };
        if let Some(watermark) = advanced {
            match &mut join {
                Some(join) => join.on_watermark(watermark, &mut out)?,
                None => out.push(Message::Watermark(watermark)),
            }
        }
        if let Some(id) = alignment.aligned() {
            if let Some(join) = &mut join {
                join.on_barrier(&mut out)?;
            }
            if let Some(snapshots) = &checkpoints {
                let checkpoints = &snapshots.checkpoints;
                // Every instance reads the same watermarks: the first
                // notes them.
                if snapshots.instance.0 == 0 {
                    checkpoints.add_merge_watermarks(id, state.snapshot());
                }
                if let Some(join) = &mut join
                    && let Some(snapshot) = join.snapshot()?
                {
                    checkpoints.add_merge(id, snapshots.instance, join.describe(), snapshot)?;
                }
            }
            out.push(Message::Barrier(id));
        }
        for message in out {
            if output.send(message).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Starts the tasks where a query's inputs (`branches`, each with its idle
/// timeout) meet in `join`, and returns their output, named `stage`: one
/// merge task, or for a merge operator of several instances, a router per
/// input, a merge task per instance and a plain merge of their outputs.
pub(super) fn spawn(
    branches: Vec<(Receiver, Option<Duration>)>,
    join: Option<Merge>,
    stage: &str,
    wiring: &mut Wiring<'_>,
) -> Receiver {
    let restored = wiring.checkpoints.and_then(|c| c.take_merge_watermarks());
    let snapshots = |instance| {
        wiring.checkpoints.map(|checkpoints| MergeSnapshots {
            checkpoints: checkpoints.clone(),
            instance,
            restored: restored.clone(),
        })
    };
    let keyed = join
        .as_ref()
        .and_then(|j| j.keys().filter(|_| j.instances.len() > 1));
    let (join, keys) = match (join, keyed) {
        (Some(join), Some(keys)) => (join, keys),
        (join, _) => {
            let op = join.and_then(|j| j.instances.into_iter().next());
            let (tx, rx) = wiring.channel("merge".to_string(), stage);
            let merge = run(branches, op, tx, snapshots((0, 1)));
            wiring.tasks.push(tokio::spawn(merge));
            return rx;
        }
    };
    let n = join.instances.len();
    let time = join.instances[0].output_time();
    let mut inboxes: Vec<Vec<(Receiver, Option<Duration>)>> = (0..n).map(|_| Vec::new()).collect();
    for (i, ((input, idle), keys)) in branches.into_iter().zip(keys).enumerate() {
        let mut senders = Vec::with_capacity(n);
        for (to, inbox) in inboxes.iter_mut().enumerate() {
            let (tx, rx) = wiring.channel(format!("merge i{to} from in{i}"), stage);
            senders.push(tx);
            inbox.push((rx, idle));
        }
        let route = Outbox::Route(Router::new(senders, keys, false));
        let task = run_stage(Chain::new(Vec::new()), Inbox::One(input), route);
        wiring.tasks.push(tokio::spawn(task));
    }
    let mut outputs = Vec::with_capacity(n);
    for (instance, (inputs, op)) in inboxes.into_iter().zip(join.instances).enumerate() {
        let (tx, rx) = wiring.channel(format!("merge i{instance}"), stage);
        let merge = run(inputs, Some(op), tx, snapshots((instance, n)));
        wiring.tasks.push(tokio::spawn(merge));
        outputs.push((rx, None));
    }
    // The instances' outputs meet as a union: the minimum of their
    // watermarks, their barriers aligned (each instance took its part of
    // the snapshot before sending its barrier on), their rows in
    // event-time order if the operator hands them on so.
    let union = time.map(|t| Box::new(TimeOrderedUnion::new(t)) as Box<dyn MergeOperator>);
    let (tx, rx) = wiring.channel("merge".to_string(), stage);
    wiring
        .tasks
        .push(tokio::spawn(run(outputs, union, tx, None)));
    rx
}

/// How one merge task takes part in its query's checkpoints.
pub struct MergeSnapshots {
    /// Where its snapshots go.
    pub checkpoints: Arc<QueryCheckpoints>,
    /// Which instance of the merge operator it runs, of how many.
    pub instance: (usize, usize),
    /// The inputs' watermarks in the checkpoint restored, if any.
    pub restored: Option<OperatorState>,
}

/// A message from input `.0`; `None` when the input ended.
type Tagged = (usize, Option<Message>);

/// Barrier alignment across a merge's inputs.
struct Alignment {
    /// The barrier being aligned on, if any.
    target: Option<u64>,
    /// Inputs that sent the target barrier and are held back.
    arrived: Vec<bool>,
    ended: Vec<bool>,
    /// Per input, what it sent after its barrier.
    held: Vec<std::collections::VecDeque<Option<Message>>>,
    /// Held messages let go, to be taken before new ones.
    released: std::collections::VecDeque<Tagged>,
}

impl Alignment {
    fn new(inputs: usize) -> Self {
        Self {
            target: None,
            arrived: vec![false; inputs],
            ended: vec![false; inputs],
            held: vec![Default::default(); inputs],
            released: Default::default(),
        }
    }

    fn next_released(&mut self) -> Option<Tagged> {
        self.released.pop_front()
    }

    /// The message to process now, or `None` if input `index` is held
    /// back (the message is kept for later).
    fn admit(&mut self, index: usize, message: Option<Message>) -> Option<Tagged> {
        if self.arrived[index] {
            self.held[index].push_back(message);
            return None;
        }
        Some((index, message))
    }

    fn barrier(&mut self, index: usize, id: u64) {
        match self.target {
            Some(target) if id < target => {}
            Some(target) if id == target => self.arrived[index] = true,
            _ => {
                // A newer checkpoint: the older one cannot complete here.
                self.release_all();
                self.target = Some(id);
                self.arrived[index] = true;
            }
        }
    }

    fn end(&mut self, index: usize) {
        self.ended[index] = true;
    }

    /// The barrier every input has now sent (or ended without), once.
    fn aligned(&mut self) -> Option<u64> {
        let target = self.target?;
        let all = (0..self.arrived.len()).all(|i| self.arrived[i] || self.ended[i]);
        if !all {
            return None;
        }
        self.target = None;
        self.release_all();
        Some(target)
    }

    fn release_all(&mut self) {
        for (index, held) in self.held.iter_mut().enumerate() {
            self.released
                .extend(held.drain(..).map(|message| (index, message)));
        }
        self.arrived.iter_mut().for_each(|a| *a = false);
    }
}

/// Per-input watermarks and the merged one.
struct Watermarks {
    watermarks: Vec<i64>,
    ended: Vec<bool>,
    last_seen: Vec<Instant>,
    idle_after: Vec<Option<Duration>>,
    emitted: i64,
    /// An input ended without its final watermark.
    stopped: bool,
}

impl Watermarks {
    fn new(idle_after: Vec<Option<Duration>>) -> Self {
        let n = idle_after.len();
        Self {
            watermarks: vec![i64::MIN; n],
            ended: vec![false; n],
            last_seen: vec![Instant::now(); n],
            idle_after,
            emitted: i64::MIN,
            stopped: false,
        }
    }

    /// Table `inputs` (each input's watermark, NULL before its first) and
    /// the merged watermark sent, as scalar `sent`.
    fn snapshot(&self) -> OperatorState {
        let seen = |w: i64| (w != i64::MIN).then_some(w);
        let schema = Arc::new(Schema::new(vec![Field::new(
            "watermark",
            DataType::Int64,
            true,
        )]));
        let column = Int64Array::from_iter(self.watermarks.iter().map(|w| seen(*w)));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(column)]).expect("one column, as declared");
        let mut state = OperatorState::new();
        state.add("inputs", batch, Vec::new());
        state.add_scalars("meta", &[("sent", seen(self.emitted))]);
        state
    }

    fn restore(&mut self, state: &OperatorState) -> Result<()> {
        let inputs = state.table("inputs")?;
        if inputs.num_rows() != self.watermarks.len() {
            return Err(crate::error::Error::Plan(format!(
                "the checkpoint has watermarks for {} inputs, the query has {}",
                inputs.num_rows(),
                self.watermarks.len()
            )));
        }
        let column = inputs.column(0).as_primitive::<Int64Type>();
        for (i, w) in self.watermarks.iter_mut().enumerate() {
            *w = if column.is_valid(i) {
                column.value(i)
            } else {
                i64::MIN
            };
        }
        self.emitted = state.scalar("meta", "sent")?.unwrap_or(i64::MIN);
        Ok(())
    }

    fn watches_idleness(&self) -> bool {
        self.idle_after.iter().any(|d| d.is_some())
    }

    /// Notes a message from `index`; returns the merged watermark if it
    /// advanced.
    fn observe(&mut self, index: usize, watermark: Option<i64>) -> Option<i64> {
        self.last_seen[index] = Instant::now();
        if let Some(w) = watermark {
            self.watermarks[index] = self.watermarks[index].max(w);
        }
        self.current()
    }

    fn end(&mut self, index: usize) -> Option<i64> {
        self.ended[index] = true;
        self.stopped |= self.watermarks[index] != END_OF_INPUT;
        self.current()
    }

    /// The minimum over inputs that still count, if it is past what was
    /// sent.
    fn current(&mut self) -> Option<i64> {
        if self.stopped {
            return None;
        }
        let now = Instant::now();
        let counted = (0..self.watermarks.len()).filter_map(|i| {
            let idle =
                self.idle_after[i].is_some_and(|d| now.duration_since(self.last_seen[i]) > d);
            match (self.ended[i], idle) {
                (true, _) => None,
                (false, true) => None,
                (false, false) => Some(self.watermarks[i]),
            }
        });
        let merged = counted.min()?;
        (merged > self.emitted).then(|| {
            self.emitted = merged;
            merged
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(rows: usize) -> Message {
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let column = Arc::new(Int64Array::from(vec![1; rows]));
        Message::Batch(
            datafusion::arrow::record_batch::RecordBatch::try_new(schema, vec![column]).unwrap(),
        )
    }

    #[test]
    fn an_input_past_its_barrier_waits_for_the_others() {
        let mut a = Alignment::new(2);
        assert!(a.admit(0, Some(Message::Barrier(1))).is_some());
        a.barrier(0, 1);
        assert_eq!(a.aligned(), None, "input 1 has not sent barrier 1");
        assert!(a.admit(0, Some(batch(1))).is_none(), "input 0 is held back");
        assert!(a.admit(1, Some(batch(2))).is_some(), "input 1 flows on");
        a.barrier(1, 1);
        assert_eq!(a.aligned(), Some(1));
        match a.next_released() {
            Some((0, Some(Message::Batch(b)))) => assert_eq!(b.num_rows(), 1),
            other => panic!("input 0's held batch comes next, got {other:?}"),
        }
        assert!(a.next_released().is_none());
    }

    #[test]
    fn a_newer_barrier_gives_up_on_the_older_one() {
        let mut a = Alignment::new(2);
        a.barrier(0, 1);
        assert!(a.admit(0, Some(batch(1))).is_none());
        // Input 1 missed checkpoint 1 and sends 2: 1 cannot complete.
        a.barrier(1, 2);
        assert_eq!(a.aligned(), None);
        assert!(
            matches!(a.next_released(), Some((0, Some(Message::Batch(_))))),
            "input 0 is let go"
        );
        a.barrier(0, 2);
        assert_eq!(a.aligned(), Some(2));
    }

    #[test]
    fn an_ended_input_does_not_hold_a_barrier_back() {
        let mut a = Alignment::new(2);
        a.end(1);
        a.barrier(0, 3);
        assert_eq!(a.aligned(), Some(3));
        assert_eq!(a.aligned(), None, "once");
    }

    #[test]
    fn the_minimum_of_inputs_and_ended_inputs_stop_counting() {
        let mut w = Watermarks::new(vec![None, None]);
        assert_eq!(w.observe(0, Some(10)), None, "input 1 has no watermark yet");
        assert_eq!(w.observe(1, Some(5)), Some(5));
        assert_eq!(w.observe(1, Some(20)), Some(10));
        assert_eq!(w.observe(0, Some(8)), None, "watermarks never go back");
        assert_eq!(w.observe(0, Some(END_OF_INPUT)), Some(20));
        assert_eq!(w.end(0), None);
        assert_eq!(
            w.observe(1, Some(30)),
            Some(30),
            "input 0 holds nothing back"
        );
        assert_eq!(w.observe(1, Some(END_OF_INPUT)), Some(END_OF_INPUT));
        assert_eq!(w.end(1), None);
    }

    #[test]
    fn inputs_stopped_without_their_final_watermark_fire_nothing_more() {
        let mut w = Watermarks::new(vec![None, None]);
        assert_eq!(w.observe(0, Some(10)), None);
        assert_eq!(w.observe(1, Some(5)), Some(5));
        assert_eq!(w.end(1), None, "input 0's rows past 5 may not be in yet");
        assert_eq!(w.end(0), None);
    }

    #[test]
    fn an_input_stopped_after_the_others_ended_fires_nothing() {
        // A source that ended before the stop and one the stop held: the
        // stopped one's end must not let the ended one's final watermark
        // through (it fired a batch query over half of its input).
        let mut w = Watermarks::new(vec![None, None]);
        assert_eq!(w.observe(1, Some(5)), None);
        assert_eq!(w.observe(0, Some(END_OF_INPUT)), Some(5));
        assert_eq!(w.end(0), None, "ended with its final watermark");
        assert_eq!(w.end(1), None, "stopped: nothing more fires");
    }

    #[test]
    fn an_idle_input_stops_holding_the_watermark_back() {
        let mut w = Watermarks::new(vec![None, Some(Duration::from_millis(1))]);
        assert_eq!(w.observe(1, Some(1)), None);
        assert_eq!(w.observe(0, Some(50)), Some(1));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(w.current(), Some(50));
        assert_eq!(
            w.observe(1, Some(2)),
            None,
            "back, but behind: no regression"
        );
    }
}
