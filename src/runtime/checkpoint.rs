//! Checkpoints by barriers, as Flink and Arroyo take them (Chandy-Lamport
//! for a dataflow whose channels are FIFO).
//!
//! Every `interval` the [`Coordinator`] asks for checkpoint `n`. Each source
//! notices the request between two batches (or while it waits for input),
//! records its position for `n` and sends `Message::Barrier(n)` after the
//! rows it already sent. A chain snapshots each operator as the barrier
//! passes it; where inputs meet, the merge waits for the barrier on every
//! input (holding back what comes after it) before it snapshots the join and
//! hands the barrier on; the sink makes its output durable and returns its
//! commit point. When the barrier reaches a query's sink, everything the
//! query held at `n` has been collected, and the query's checkpoint is
//! written (see [`crate::state::store`]): one folder per query, named by the
//! query's stable name, so adding a query to a script leaves the others'
//! checkpoints valid.
//!
//! Checkpoints may overlap: a source that misses request `n` (it was busy,
//! or blocked on a read) sends the newest request it sees instead, and a
//! merge whose inputs disagree aligns on the newest barrier and drops the
//! older one. A query's checkpoint completes only with a barrier every one
//! of its inputs sent.
//!
//! The instances of a key-partitioned stage each snapshot their share of
//! an operator; the shares are stored as one operator state
//! ([`OperatorState::combine`]), so a checkpoint does not depend on the
//! parallelism it was taken at, and a restore at any parallelism gives
//! each instance the key groups it owns ([`OperatorState::split`]).
//!
//! On restore, each query reads the newest complete checkpoint in its
//! folder, refuses it if a stateful operator changed (unless told to start
//! the changed ones empty), gives every operator its state, rewinds its
//! sink to the commit point, and reads its sources from their positions.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::connector::{Sink, SinkCommit, SourcePosition};
use crate::error::{Error, Result};
use crate::exec::{Chain, Operator, QueryStats};
use crate::planner::QueryGraph;
use crate::state::OperatorState;
use crate::state::store::{
    Checkpoint, Location, NOT_IN_CHECKPOINT, OperatorEntry, OperatorShape, QueryStore, SinkEntry,
    SourceEntry, compare, fingerprint,
};

/// Time between two checkpoints unless set otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// Complete checkpoints kept per query unless set otherwise.
pub const DEFAULT_KEEP: usize = 3;

/// The id under which a query's counters are stored with its operators.
const STATS_ID: &str = "query.stats";

/// How the query's counters are described in a checkpoint.
const STATS_DESCRIBE: &str = "query counters";

/// How and where checkpoints are taken.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// One folder per query under it: a local directory or an object
    /// store.
    pub dir: Location,
    /// Time between two checkpoints.
    pub interval: Duration,
    /// Complete checkpoints kept per query; older ones are deleted once a
    /// newer one is complete.
    pub keep: usize,
    /// Start stateful operators that changed since the checkpoint empty,
    /// instead of refusing to restore.
    pub allow_non_restored: bool,
    /// Restore from this savepoint (a folder of query folders) rather than
    /// from the newest checkpoint in `dir`.
    pub from_savepoint: Option<Location>,
    /// When the run is asked to stop, take a savepoint under this folder
    /// (rather than a plain checkpoint) before the sources stop.
    pub savepoint_on_stop: Option<Location>,
    /// Stop, as when asked to, once a source has read this many rows.
    pub stop_after_rows: Option<u64>,
}

impl CheckpointConfig {
    /// Checkpoints in `dir` with the default interval and retention.
    pub fn new(dir: impl Into<Location>) -> Self {
        Self {
            dir: dir.into(),
            interval: DEFAULT_INTERVAL,
            keep: DEFAULT_KEEP,
            allow_non_restored: false,
            from_savepoint: None,
            savepoint_on_stop: None,
            stop_after_rows: None,
        }
    }
}

/// What the checkpoints of a runtime did, for `/metrics`.
#[derive(Debug, Default)]
pub struct CheckpointStats {
    /// Query checkpoints written.
    pub completed: AtomicU64,
    /// Query checkpoints that could not be written.
    pub failed: AtomicU64,
    /// Queries restored from a checkpoint or savepoint.
    pub restores: AtomicU64,
    /// How long writing the last one took, in microseconds.
    pub last_duration_us: AtomicU64,
    /// Its size in bytes.
    pub last_bytes: AtomicU64,
    /// When the last one completed, in epoch milliseconds; 0 before the
    /// first.
    pub last_completed_ms: AtomicI64,
}

/// Asks for checkpoints and savepoints, and remembers which id is which.
#[derive(Debug)]
pub struct Coordinator {
    config: CheckpointConfig,
    requested: AtomicU64,
    /// Savepoint ids and the folder each goes to.
    savepoints: Mutex<BTreeMap<u64, Location>>,
    /// A savepoint after which sources stop (0 for none).
    stop_at: AtomicU64,
    /// Per id, how many queries completed it.
    completions: Mutex<HashMap<u64, usize>>,
    completed: tokio::sync::Notify,
    stats: Arc<CheckpointStats>,
}

impl Coordinator {
    /// A coordinator for `config`; nothing is asked for until
    /// [`Coordinator::request`].
    pub fn new(config: CheckpointConfig) -> Self {
        Self {
            config,
            requested: AtomicU64::new(0),
            savepoints: Mutex::new(BTreeMap::new()),
            stop_at: AtomicU64::new(0),
            completions: Mutex::new(HashMap::new()),
            completed: tokio::sync::Notify::new(),
            stats: Arc::new(CheckpointStats::default()),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<CheckpointStats> {
        &self.stats
    }

    /// The newest checkpoint asked for; sources send its barrier.
    pub fn requested(&self) -> u64 {
        self.requested.load(Ordering::Acquire)
    }

    /// The barrier a source started now counts as sent: the newest asked
    /// for, since it belongs to no query of the new source. With
    /// `stop_after_rows`, a source started after the stop was asked for
    /// (a query started later in the shell) still owes the stopping
    /// barrier: it stops after its own rows, as the others did.
    pub fn first_barrier(&self) -> u64 {
        let newest = self.requested();
        let stop = self.stop_at.load(Ordering::Acquire);
        match self.config.stop_after_rows {
            Some(_) if stop != 0 && newest >= stop => stop - 1,
            _ => newest,
        }
    }

    /// Asks for the next checkpoint; its id.
    pub fn request(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Asks for a savepoint written under `root`; with `stop`, every source
    /// stops right after its barrier (without the end-of-input watermark,
    /// so open windows stay open in the savepoint). Its id.
    pub fn savepoint(&self, root: &Location, stop: bool) -> u64 {
        let mut savepoints = lock(&self.savepoints);
        let id = self.request();
        savepoints.insert(id, root.clone());
        if stop {
            self.stop_at.store(id, Ordering::Release);
        }
        id
    }

    /// Asks the sources to stop after one last checkpoint (a savepoint if
    /// the configuration says so); its id. Asking again gives the same id.
    pub fn stop(&self) -> u64 {
        let mut savepoints = lock(&self.savepoints);
        let stop = self.stop_at.load(Ordering::Acquire);
        if stop != 0 {
            return stop;
        }
        let id = self.request();
        if let Some(root) = &self.config.savepoint_on_stop {
            savepoints.insert(id, root.clone());
        }
        self.stop_at.store(id, Ordering::Release);
        id
    }

    /// The folder of the savepoint taken on stop, once one was asked for.
    pub fn stop_savepoint(&self) -> Option<Location> {
        let stop = self.stop_at.load(Ordering::Acquire);
        (stop != 0).then(|| self.savepoint_root(stop)).flatten()
    }

    /// True once a source that has read `rows` rows must stop.
    pub fn stop_due(&self, rows: u64) -> bool {
        self.config
            .stop_after_rows
            .is_some_and(|limit| rows >= limit)
    }

    /// True while a source that has read `rows` rows must not send the
    /// stopping barrier `id` yet: with `stop_after_rows`, each source
    /// stops once it has read that many rows itself.
    pub fn holds_stop(&self, id: u64, rows: u64) -> bool {
        self.stops_at(id)
            && self
                .config
                .stop_after_rows
                .is_some_and(|limit| rows < limit)
    }

    /// True if sources stop after barrier `id`.
    pub fn stops_at(&self, id: u64) -> bool {
        let stop = self.stop_at.load(Ordering::Acquire);
        stop != 0 && id >= stop
    }

    /// Makes later ids larger than `id` (one restored from a checkpoint).
    fn seen(&self, id: u64) {
        self.requested.fetch_max(id, Ordering::AcqRel);
    }

    fn savepoint_root(&self, id: u64) -> Option<Location> {
        lock(&self.savepoints).get(&id).cloned()
    }

    fn count_completion(&self, id: u64) {
        *lock(&self.completions).entry(id).or_default() += 1;
        self.completed.notify_waiters();
    }

    /// Waits until `queries` queries have completed checkpoint `id`, or
    /// `timeout` passes; the number that did.
    pub async fn wait_for(&self, id: u64, queries: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.completed.notified();
            let done = lock(&self.completions).get(&id).copied().unwrap_or(0);
            if done >= queries {
                return done;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return lock(&self.completions).get(&id).copied().unwrap_or(0);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one query has collected of a checkpoint in flight.
#[derive(Default)]
struct Partial {
    operators: Vec<OperatorEntry>,
    sources: Vec<SourceEntry>,
}

/// The snapshots of an operator's instances taken so far, by instance.
type InstanceStates = Vec<Option<OperatorState>>;

/// Collects one query's checkpoints and writes them.
pub struct QueryCheckpoints {
    name: String,
    store: QueryStore,
    coordinator: Arc<Coordinator>,
    stats: Arc<QueryStats>,
    partial: Mutex<BTreeMap<u64, Partial>>,
    /// Sources that read all of their input, and where they ended.
    ended: Mutex<Vec<SourceEntry>>,
    /// The merge's watermarks restored, until the merge takes them.
    merge_watermarks: Mutex<Option<OperatorState>>,
    /// Snapshots of some instances of an operator, by barrier and operator
    /// id, until all of them are in.
    parts: Mutex<HashMap<(u64, String), InstanceStates>>,
    /// The complete checkpoints kept, oldest first (see
    /// [`QueryCheckpoints::oldest_kept`]).
    kept: Mutex<std::collections::VecDeque<u64>>,
}

impl QueryCheckpoints {
    /// The checkpoints of query `name` (its folder is opened or made).
    pub fn open(coordinator: Arc<Coordinator>, name: &str, stats: Arc<QueryStats>) -> Result<Self> {
        let config = coordinator.config();
        let store = QueryStore::open(&config.dir, name, config.keep)?;
        // Ids grow within a folder, across runs too.
        coordinator.seen(store.next_id()?.saturating_sub(1));
        Ok(Self {
            name: name.to_string(),
            store,
            coordinator,
            stats,
            partial: Mutex::new(BTreeMap::new()),
            ended: Mutex::new(Vec::new()),
            merge_watermarks: Mutex::new(None),
            parts: Mutex::new(HashMap::new()),
            kept: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// Notes where source `stream` stood at barrier `id`, and for a source
    /// that cannot be read again, where the query's disk buffer stood.
    pub fn add_source(
        &self,
        id: u64,
        stream: &str,
        position: Option<SourcePosition>,
        buffer: Option<u64>,
    ) {
        let mut partial = lock(&self.partial);
        let sources = &mut partial.entry(id).or_default().sources;
        if !sources.iter().any(|s| s.stream == stream) {
            sources.push(SourceEntry {
                stream: stream.to_string(),
                position,
                ended: false,
                buffer,
            });
        }
    }

    /// Where the query's sources stood when they sent barrier `id`, as far
    /// as they have sent it.
    pub fn source_positions(&self, id: u64) -> Vec<SourcePosition> {
        lock(&self.partial)
            .get(&id)
            .map(|p| {
                p.sources
                    .iter()
                    .filter_map(|s| s.position.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The oldest complete checkpoint of this query that is kept (of those
    /// this run wrote or restored): a restore may go back to it, so a disk
    /// buffer keeps what came after it.
    pub fn oldest_kept(&self) -> Option<u64> {
        lock(&self.kept).front().copied()
    }

    /// Notes that checkpoint `id` is complete and kept; the oldest beyond
    /// those kept are forgotten, as the store deletes them.
    fn kept(&self, id: u64) {
        let mut kept = lock(&self.kept);
        kept.push_back(id);
        while kept.len() > self.coordinator.config().keep.max(1) {
            kept.pop_front();
        }
    }

    /// Notes that source `stream` read all of its input, ending at
    /// `position`: checkpoints without a barrier of it record that.
    pub fn source_ended(&self, stream: &str, position: Option<SourcePosition>) {
        lock(&self.ended).push(SourceEntry {
            stream: stream.to_string(),
            position,
            ended: true,
            buffer: None,
        });
    }

    fn add_operator(&self, id: u64, operator: OperatorEntry) {
        lock(&self.partial)
            .entry(id)
            .or_default()
            .operators
            .push(operator);
    }

    /// A sink for the snapshots of `chain`, instance `instance` of
    /// `instances` of its stage, whose operators get ids `PREFIX.oK`. The
    /// instances' snapshots of one operator are stored as one (see
    /// [`OperatorState::combine`]), so a checkpoint can be restored at
    /// another parallelism.
    pub fn chain_sink(
        self: &Arc<Self>,
        prefix: &str,
        chain: &Chain,
        instance: usize,
        instances: usize,
    ) -> crate::exec::SnapshotSink {
        let names: Vec<(String, String)> = chain
            .ops()
            .iter()
            .enumerate()
            .map(|(k, op)| (format!("{prefix}.o{k}"), op.describe()))
            .collect();
        let this = self.clone();
        Box::new(move |id, index, state| {
            let Some(state) = state else {
                return Ok(());
            };
            let (name, describe) = names[index].clone();
            let state = match instances {
                1 => state,
                _ => match this.add_part(id, &name, instance, instances, state)? {
                    Some(combined) => combined,
                    None => return Ok(()),
                },
            };
            this.add_operator(
                id,
                OperatorEntry {
                    id: name,
                    describe,
                    state,
                },
            );
            Ok(())
        })
    }

    /// Keeps instance `instance`'s snapshot of operator `op` at barrier
    /// `id`; once every instance's is in, their combination.
    fn add_part(
        &self,
        id: u64,
        op: &str,
        instance: usize,
        instances: usize,
        state: OperatorState,
    ) -> Result<Option<OperatorState>> {
        let mut parts = lock(&self.parts);
        let key = (id, op.to_string());
        let slots = parts
            .entry(key.clone())
            .or_insert_with(|| vec![None; instances]);
        slots[instance] = Some(state);
        if slots.iter().any(Option::is_none) {
            return Ok(None);
        }
        let all = parts.remove(&key).unwrap_or_default().into_iter().flatten();
        // Older barriers of this operator can no longer complete: each
        // instance passed them before this one. (Other operators, in later
        // stages, may still be collecting them.)
        parts.retain(|(other, name), _| name != op || *other > id);
        OperatorState::combine(all.collect()).map(Some)
    }

    /// Notes the merge's watermarks (per input, and the one it sent) at
    /// barrier `id`.
    pub fn add_merge_watermarks(&self, id: u64, state: OperatorState) {
        self.add_operator(
            id,
            OperatorEntry {
                id: WATERMARKS_ID.to_string(),
                describe: WATERMARKS_DESCRIBE.to_string(),
                state,
            },
        );
    }

    /// The merge's watermarks from the checkpoint restored, once.
    pub fn take_merge_watermarks(&self) -> Option<OperatorState> {
        lock(&self.merge_watermarks).take()
    }

    /// Notes the state of instance `instance` of `instances` of the merge
    /// operator at barrier `id`; the instances' states are stored as one.
    pub fn add_merge(
        &self,
        id: u64,
        (instance, instances): (usize, usize),
        describe: String,
        state: OperatorState,
    ) -> Result<()> {
        let state = match instances {
            1 => state,
            _ => match self.add_part(id, MERGE_ID, instance, instances, state)? {
                Some(combined) => combined,
                None => return Ok(()),
            },
        };
        self.add_operator(
            id,
            OperatorEntry {
                id: MERGE_ID.to_string(),
                describe,
                state,
            },
        );
        Ok(())
    }

    /// Barrier `id` reached the sink, which committed at `commit`: writes
    /// the checkpoint and forgets older ones still in flight (they can no
    /// longer complete). A checkpoint that cannot be written is reported
    /// and counted, and the query carries on. Returns whether it was
    /// written.
    pub fn complete(&self, id: u64, commit: Option<SinkCommit>) -> bool {
        let partial = {
            let mut pending = lock(&self.partial);
            let partial = pending.remove(&id).unwrap_or_default();
            pending.retain(|&other, _| other > id);
            partial
        };
        let stats = &self.coordinator.stats;
        let savepoint = self.coordinator.savepoint_root(id).is_some();
        let written = match self.write(id, partial, commit) {
            Ok(info) => {
                if !savepoint {
                    self.kept(id);
                }
                stats.completed.fetch_add(1, Ordering::Relaxed);
                stats
                    .last_duration_us
                    .store(info.duration.as_micros() as u64, Ordering::Relaxed);
                stats.last_bytes.store(info.bytes, Ordering::Relaxed);
                stats
                    .last_completed_ms
                    .store(chrono::Utc::now().timestamp_millis(), Ordering::Relaxed);
                true
            }
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                crate::diag::warning!(
                    "checkpoint {id} of query {} was not written: {e}",
                    self.name
                );
                false
            }
        };
        self.coordinator.count_completion(id);
        written
    }

    fn write(
        &self,
        id: u64,
        partial: Partial,
        commit: Option<SinkCommit>,
    ) -> Result<crate::state::store::CheckpointInfo> {
        let mut sources = partial.sources;
        for ended in lock(&self.ended).iter() {
            if !sources.iter().any(|s| s.stream == ended.stream) {
                sources.push(ended.clone());
            }
        }
        let mut operators = partial.operators;
        operators.push(OperatorEntry {
            id: STATS_ID.to_string(),
            describe: STATS_DESCRIBE.to_string(),
            state: stats_state(&self.stats),
        });
        let shapes: Vec<OperatorShape> = operators
            .iter()
            .filter(|o| o.id != STATS_ID)
            .map(|o| OperatorShape::of(&o.id, &o.describe, &o.state))
            .collect();
        let savepoint = self.coordinator.savepoint_root(id);
        let checkpoint = Checkpoint {
            id,
            time_ms: chrono::Utc::now().timestamp_millis(),
            query: self.name.clone(),
            fingerprint: fingerprint(&shapes),
            savepoint: savepoint.is_some(),
            operators,
            sources,
            sinks: vec![SinkEntry {
                name: "output".to_string(),
                commit,
            }],
        };
        let started = Instant::now();
        let mut info = match savepoint {
            Some(root) => QueryStore::open(&root, &self.name, usize::MAX)?.write(&checkpoint)?,
            None => self.store.write(&checkpoint)?,
        };
        info.duration = info.duration.max(started.elapsed());
        Ok(info)
    }

    /// What savepoint `root` holds of this query: a savepoint that does not
    /// exist is an error; one without this query (added since) a warning.
    fn savepoint_state(&self, root: &Location) -> Result<crate::state::store::Restored> {
        if !root.exists()? {
            return Err(Error::Plan(format!(
                "savepoint {root} does not exist (`vigil checkpoints DIR` lists them)"
            )));
        }
        let has_query = crate::state::store::query_folders(root)?
            .iter()
            .any(|(name, _)| name == &self.name);
        if !has_query {
            crate::diag::warning!(
                "savepoint {root} has no state of query {}; it starts from the beginning",
                self.name
            );
            return Ok(crate::state::store::Restored::default());
        }
        QueryStore::open(root, &self.name, usize::MAX)?.latest()
    }

    /// Restores `graph` and `sink` from the newest usable checkpoint (or
    /// the savepoint configured); the source positions to read from, or
    /// `None` when there is nothing to restore.
    pub fn restore(
        &self,
        graph: &mut QueryGraph,
        sink: &mut dyn Sink,
    ) -> Result<Option<Vec<SourceEntry>>> {
        let allow = self.coordinator.config().allow_non_restored;
        self.restore_allowing(graph, sink, allow)
    }

    /// Restores like [`QueryCheckpoints::restore`]; with
    /// `allow_non_restored`, the operators that changed start empty instead
    /// of the restore being refused.
    pub fn restore_allowing(
        &self,
        graph: &mut QueryGraph,
        sink: &mut dyn Sink,
        allow_non_restored: bool,
    ) -> Result<Option<Vec<SourceEntry>>> {
        let config = self.coordinator.config();
        let restored = match &config.from_savepoint {
            Some(root) => self.savepoint_state(root)?,
            None => self.store.latest()?,
        };
        for warning in &restored.warnings {
            crate::diag::warning!("{warning}");
        }
        let Some(checkpoint) = restored.checkpoint else {
            return Ok(None);
        };
        self.coordinator.seen(checkpoint.id);
        let ended = ended_inputs(graph, &checkpoint);
        let mut operators = operators_of(graph);
        let mut shapes = shapes_of(&mut operators)?;
        shapes.push(OperatorShape::of(
            STATS_ID,
            STATS_DESCRIBE,
            &stats_state(&QueryStats::default()),
        ));
        if let Some(stored) = checkpoint.operators.iter().find(|o| o.id == WATERMARKS_ID) {
            // Its schema does not depend on the plan; only its presence does.
            shapes.push(OperatorShape::of(
                WATERMARKS_ID,
                WATERMARKS_DESCRIBE,
                &stored.state,
            ));
        }
        let mut mismatches = compare(&checkpoint, &shapes);
        // The operators of an input read to its end had handed everything
        // on: a checkpoint taken since has none of their state, and they
        // start empty.
        mismatches.retain(|m| {
            !(m.what == NOT_IN_CHECKPOINT && ended.iter().any(|p| m.operator.starts_with(p)))
        });
        if !mismatches.is_empty() && !allow_non_restored {
            return Err(Error::Plan(refusal(&self.name, &checkpoint, &mismatches)));
        }
        for mismatch in &mismatches {
            crate::diag::warning!(
                "query {}: operator {} starts empty: {}",
                self.name,
                mismatch.operator,
                mismatch.what
            );
        }
        for (id, instances) in operators {
            if mismatches.iter().any(|m| m.operator == id) {
                continue;
            }
            let Some(entry) = checkpoint.operators.iter().find(|o| o.id == id) else {
                continue;
            };
            let n = instances.len();
            for (instance, mut op) in instances.into_iter().enumerate() {
                match n {
                    1 => op.restore(entry.state.clone())?,
                    _ => op.restore(entry.state.split(instance, n)?)?,
                }
            }
        }
        if let Some(entry) = checkpoint.operators.iter().find(|o| o.id == STATS_ID) {
            restore_stats(&self.stats, &entry.state)?;
        }
        if let Some(entry) = checkpoint.operators.iter().find(|o| o.id == WATERMARKS_ID) {
            *lock(&self.merge_watermarks) = Some(entry.state.clone());
        }
        if let Some(commit) = checkpoint.sinks.first().and_then(|s| s.commit.as_ref()) {
            sink.restore(commit)?;
        }
        self.kept(checkpoint.id);
        self.coordinator
            .stats
            .restores
            .fetch_add(1, Ordering::Relaxed);
        let kind = if checkpoint.savepoint {
            "savepoint"
        } else {
            "checkpoint"
        };
        crate::diag::note!("query {} restored from {kind} {}", self.name, checkpoint.id);
        Ok(Some(checkpoint.sources))
    }
}

/// The id prefixes (`inI.`) of the inputs of `graph` whose stream
/// `checkpoint` records as read to its end.
fn ended_inputs(graph: &QueryGraph, checkpoint: &Checkpoint) -> Vec<String> {
    graph
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, input)| {
            checkpoint
                .sources
                .iter()
                .any(|s| s.ended && s.stream == input.stream.name)
        })
        .map(|(i, _)| format!("in{i}."))
        .collect()
}

/// The id of a query's merge operator (a window join, a batch query).
const MERGE_ID: &str = "merge";

/// The id of the watermarks where a query's inputs meet.
const WATERMARKS_ID: &str = "merge.watermarks";

/// How they are described.
const WATERMARKS_DESCRIBE: &str = "the watermark of each input";

/// A stateful operator of a graph, mutably, with its stable id.
enum AnyOp<'a> {
    Chained(&'a mut Box<dyn Operator>),
    Merge(&'a mut Box<dyn crate::exec::MergeOperator>),
}

impl AnyOp<'_> {
    fn describe(&self) -> String {
        match self {
            AnyOp::Chained(op) => op.describe(),
            AnyOp::Merge(op) => op.describe(),
        }
    }

    fn snapshot(&mut self) -> Result<Option<OperatorState>> {
        match self {
            AnyOp::Chained(op) => op.snapshot(),
            AnyOp::Merge(op) => op.snapshot(),
        }
    }

    fn restore(&mut self, state: OperatorState) -> Result<()> {
        match self {
            AnyOp::Chained(op) => op.restore(state),
            AnyOp::Merge(op) => op.restore(state),
        }
    }
}

/// Every operator of `graph`, each with its instances, under the id its
/// snapshots are stored under: `inI.sJ.oK` for operator K of stage J of
/// input I, `merge`, and `sJ.oK` after the merge.
fn operators_of(graph: &mut QueryGraph) -> Vec<(String, Vec<AnyOp<'_>>)> {
    let mut all = Vec::new();
    for (i, input) in graph.inputs.iter_mut().enumerate() {
        for (j, stage) in input.stages.iter_mut().enumerate() {
            stage_operators(&mut all, &input_prefix(i, j), stage);
        }
    }
    if let Some(join) = &mut graph.join {
        let instances = join.instances.iter_mut().map(AnyOp::Merge).collect();
        all.push((MERGE_ID.to_string(), instances));
    }
    for (j, stage) in graph.stages.iter_mut().enumerate() {
        stage_operators(&mut all, &stage_prefix(j), stage);
    }
    all
}

/// The operators of `stage`, operator by operator, each with its instances.
fn stage_operators<'a>(
    all: &mut Vec<(String, Vec<AnyOp<'a>>)>,
    prefix: &str,
    stage: &'a mut crate::planner::Stage,
) {
    let mut by_op: Vec<Vec<AnyOp<'a>>> = Vec::new();
    for chain in stage.instances.iter_mut() {
        for (k, op) in chain.iter_mut().enumerate() {
            if by_op.len() <= k {
                by_op.push(Vec::new());
            }
            by_op[k].push(AnyOp::Chained(op));
        }
    }
    for (k, instances) in by_op.into_iter().enumerate() {
        all.push((format!("{prefix}.o{k}"), instances));
    }
}

/// The id prefix of stage `stage` of input `input`.
pub fn input_prefix(input: usize, stage: usize) -> String {
    format!("in{input}.s{stage}")
}

/// The id prefix of stage `stage` after the merge.
pub fn stage_prefix(stage: usize) -> String {
    format!("s{stage}")
}

/// The state shapes of fresh operators (their snapshots are empty).
/// The shape of every stateful operator of `graph` (as built: call it
/// before a restore), under the ids a checkpoint stores them by: what a
/// checkpoint of it holds, to tell before a change which state it keeps.
pub fn graph_shapes(graph: &mut QueryGraph) -> Result<Vec<OperatorShape>> {
    shapes_of(&mut operators_of(graph))
}

fn shapes_of(operators: &mut [(String, Vec<AnyOp<'_>>)]) -> Result<Vec<OperatorShape>> {
    let mut shapes = Vec::new();
    for (id, instances) in operators.iter_mut() {
        let Some(op) = instances.first_mut() else {
            continue;
        };
        if let Some(state) = op.snapshot()? {
            shapes.push(OperatorShape::of(id, &op.describe(), &state));
        }
    }
    Ok(shapes)
}

fn refusal(
    query: &str,
    checkpoint: &Checkpoint,
    mismatches: &[crate::state::store::Mismatch],
) -> String {
    let kind = if checkpoint.savepoint {
        "savepoint"
    } else {
        "checkpoint"
    };
    let mut message = format!(
        "query {query} changed since its {kind} {}; its state cannot be read into it:",
        checkpoint.id
    );
    for m in mismatches {
        message.push_str(&format!("\n  operator {}: {}", m.operator, m.what));
    }
    message.push_str(
        "\nrun with --allow-non-restored-state to start the changed operators empty and restore the rest, or give the query another name",
    );
    message
}

fn stats_state(stats: &QueryStats) -> OperatorState {
    let mut state = OperatorState::new();
    let get = |a: &AtomicU64| Some(a.load(Ordering::Relaxed) as i64);
    state.add_scalars(
        "counters",
        &[
            ("rows_out", get(&stats.rows_out)),
            ("late_rows", get(&stats.late_rows)),
        ],
    );
    state
}

fn restore_stats(stats: &QueryStats, state: &OperatorState) -> Result<()> {
    let get = |column| Ok::<_, Error>(state.scalar("counters", column)?.unwrap_or(0) as u64);
    stats.rows_out.store(get("rows_out")?, Ordering::Relaxed);
    stats.late_rows.store(get("late_rows")?, Ordering::Relaxed);
    Ok(())
}
