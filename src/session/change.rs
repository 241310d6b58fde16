//! Changing a running query (`ALTER ALERT`, `ALTER QUERY`): the query is
//! planned again with the change, the state it holds is compared with what
//! the changed query can take, and it is stopped at a checkpoint and
//! started again from it under the same id, name and result channel.
//!
//! State is kept per stateful operator: an operator whose id (its place in
//! the query), description and state tables are the same in the changed
//! query gets its state back; any other starts empty. A change that would
//! start an operator empty is refused, before anything is changed, unless
//! it says `ALLOW STATE LOSS`. A session without a state directory keeps
//! no state across a change: every stateful operator starts empty, and
//! push streams are read from the rows pushed after the change.

use std::path::PathBuf;
use std::time::Duration;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::mpsc;

use super::Session;
use crate::connector::Sink;
use crate::engine::{Change, ChangeTarget};
use crate::error::{Error, Result};
use crate::planner::QueryGraph;
use crate::runtime::RunnableQuery;
use crate::runtime::checkpoint::graph_shapes;
use crate::runtime::live::{Live, NamedQuery, QueryId};
use crate::sql::Statement;
use crate::state::store::{OperatorShape, compare_shapes};

/// How long a change waits for the query to reach its checkpoint.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// What a running query was planned from.
pub(super) struct Origin {
    pub(super) statement: Statement,
    pub(super) base_dir: PathBuf,
    /// The parallelism it runs at.
    pub(super) parallelism: usize,
    /// Its result columns: a change keeps them.
    pub(super) schema: SchemaRef,
    /// Its handle's channel (closed once the handle is gone).
    pub(super) results: mpsc::WeakSender<RecordBatch>,
    /// What listings show for it.
    pub(super) label: String,
    /// Its controller, when it is scaled automatically.
    pub(super) scaling: Option<super::autoscale::Scaling>,
}

/// A checked change, ready to make: see [`PendingChange::apply`].
pub struct PendingChange {
    live: Live,
    id: QueryId,
    name: Option<String>,
    graph: QueryGraph,
    sink: Box<dyn Sink>,
    label: String,
    durable: bool,
    allow_state_loss: bool,
    report: Changed,
}

/// What a change to a running query did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The query, which keeps its id.
    pub id: QueryId,
    /// What changed, in words.
    pub what: String,
    /// The stateful operators that keep their state.
    pub kept: Vec<String>,
    /// The stateful operators that start empty, each with why.
    pub emptied: Vec<String>,
}

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "query {} changed ({})", self.id, self.what)?;
        if !self.kept.is_empty() {
            write!(f, "; state kept: {}", self.kept.join(", "))?;
        }
        if !self.emptied.is_empty() {
            write!(f, "; started empty: {}", self.emptied.join("; "))?;
        }
        Ok(())
    }
}

impl PendingChange {
    /// What the change will do.
    pub fn report(&self) -> &Changed {
        &self.report
    }

    /// Makes the change: the query stops right after a checkpoint (its
    /// windows stay open in it, and its sink commits what it wrote), and
    /// the changed query starts from that checkpoint under the same id,
    /// reading on where it stopped, so no result is lost or repeated.
    /// Waiters of the query ([`Session::wait`]) wait on through it.
    pub async fn apply(self) -> Result<Changed> {
        self.end_run().await?;
        self.start_changed()
    }

    /// Ends the query's current run, at a checkpoint in a durable session.
    fn end_run(&self) -> impl Future<Output = Result<()>> + Send + 'static {
        let (live, id, durable) = (self.live.clone(), self.id, self.durable);
        async move { live.end_run_for_restart(id, durable, STOP_TIMEOUT).await }
    }

    /// Starts the changed query in the ended run's place.
    fn start_changed(self) -> Result<Changed> {
        let PendingChange {
            live,
            id,
            name,
            graph,
            sink,
            label,
            allow_state_loss,
            report,
            ..
        } = self;
        if let Some(name) = name.as_deref().filter(|_| allow_state_loss) {
            live.allow_non_restored(name);
        }
        let query = NamedQuery {
            query: RunnableQuery { graph, sink },
            label,
            name,
        };
        live.start_in_place(id, query)?;
        Ok(report)
    }
}

impl Session {
    /// Checks `change` against the query it is for and plans the changed
    /// query: refused, with the catalog as it was, if the query is not
    /// running, its columns would change, or it would lose state and the
    /// change does not allow it.
    pub fn change(&mut self, mut change: Change) -> Result<PendingChange> {
        let undo = change.undo.take();
        let prepared = self.prepare_change(change);
        if prepared.is_err()
            && let Some(undo) = undo
        {
            self.engine.restore_catalog(undo);
        }
        prepared
    }

    fn prepare_change(&mut self, change: Change) -> Result<PendingChange> {
        let id = self.change_target(&change.target)?;
        let (statement, base_dir, parallelism, schema, results, label) = {
            let origins = self.origins();
            let origin = origins.get(&id).ok_or_else(|| {
                Error::Plan(format!("query {id} was not started from a statement"))
            })?;
            (
                origin.statement.clone(),
                origin.base_dir.clone(),
                origin.parallelism,
                origin.schema.clone(),
                origin.results.clone(),
                origin.label.clone(),
            )
        };
        let (statement, base_dir) = match change.query.and_then(|q| q.origin) {
            Some(origin) => *origin,
            None => (statement, base_dir),
        };
        let parallelism = change.parallelism.unwrap_or(parallelism);
        let mut query = self.engine.replan(&statement, &base_dir, parallelism)?;
        if query.graph.schema.fields() != schema.fields() {
            return Err(Error::Plan(format!(
                "the change gives query {id} other columns; stop it and start the changed query instead"
            )));
        }
        let old = self.live.shapes(id).unwrap_or_default();
        let new = graph_shapes(&mut query.graph)?;
        let durable = self.durable.is_some();
        let report = state_report(id, &change.what, &old, &new, durable);
        if !report.emptied.is_empty() && !change.allow_state_loss {
            return Err(Error::Plan(format!(
                "the change would start state of query {id} empty: {}; nothing was changed (add ALLOW STATE LOSS to change it anyway)",
                report.emptied.join("; ")
            )));
        }
        let tx = results.upgrade().unwrap_or_else(|| mpsc::channel(1).0);
        let sink = self.query_sink(&query, tx)?;
        if let Some(origin) = self.origins().get_mut(&id) {
            origin.statement = statement;
            origin.base_dir = base_dir;
            origin.parallelism = query.graph.parallelism();
            if let Some(scaling) = origin.scaling.as_mut() {
                scaling.replanned(&query.graph);
            }
        }
        Ok(PendingChange {
            live: self.live.clone(),
            id,
            name: self.query_name(id),
            graph: query.graph,
            sink,
            label,
            durable,
            allow_state_loss: change.allow_state_loss,
            report,
        })
    }

    /// The running query `target` names.
    fn change_target(&self, target: &ChangeTarget) -> Result<QueryId> {
        let running = |id: QueryId| self.queries().iter().any(|q| q.id == id);
        let found = match target {
            ChangeTarget::Alert(name) => self
                .alert_queries()
                .get(name)
                .copied()
                .filter(|&id| running(id)),
            ChangeTarget::Query(query) => query
                .parse::<QueryId>()
                .ok()
                .filter(|&id| running(id))
                .or_else(|| self.query_by_name(query)),
        };
        found.ok_or_else(|| {
            Error::Plan(match target {
                ChangeTarget::Alert(name) => format!("alert '{name}' has no running query"),
                ChangeTarget::Query(query) => {
                    format!("no running query '{query}' (SHOW QUERIES lists them)")
                }
            })
        })
    }
}

/// Which stateful operators keep their state and which start empty when
/// a query with operators `old` changes into one with operators `new`.
fn state_report(
    id: QueryId,
    what: &str,
    old: &[OperatorShape],
    new: &[OperatorShape],
    durable: bool,
) -> Changed {
    let mut report = Changed {
        id,
        what: what.to_string(),
        kept: Vec::new(),
        emptied: Vec::new(),
    };
    if !durable {
        report.emptied = new
            .iter()
            .map(|op| {
                format!(
                    "{}: this session keeps no state (it has no state directory)",
                    op.describe
                )
            })
            .collect();
        return report;
    }
    let mismatches = compare_shapes(old, new);
    for op in new {
        match mismatches.iter().find(|m| m.operator == op.id) {
            Some(m) => report
                .emptied
                .push(format!("{} ({}): {}", op.describe, op.id, m.what)),
            None => report.kept.push(format!("{} ({})", op.describe, op.id)),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    use super::*;
    use crate::session::Executed;

    /// One row per host of `hosts` at second `k`, as JSON lines.
    fn second(k: i64, hosts: usize) -> String {
        (0..hosts)
            .map(|h| format!("{{\"ts\": {}, \"host\": \"h{h}\", \"cpu\": 1}}\n", k * 1000))
            .collect()
    }

    /// The logs are trimmed on a timer, which can fire while a changed
    /// query is between its runs: the query must still count as reading
    /// its stream, or it loses its name (and so its checkpoints) and the
    /// logged rows its next run replays.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn trimming_the_logs_between_two_runs_keeps_the_query_and_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let mut session = Session::builder()
            .state_dir(dir.path().join("state"))
            .checkpoint_interval(Duration::from_millis(100))
            .build()
            .unwrap();
        let sql = "CREATE STREAM ev (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
                     WITH (connector = 'push');
                   SELECT window_end, host, count(*) AS n
                     FROM TUMBLE(ev, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;";
        let mut handle = match session.execute(sql).unwrap().pop() {
            Some(Executed::Query(handle)) => handle,
            _ => panic!("a query"),
        };
        let id = handle.id;
        for k in 0..12 {
            session.push_json("ev", &second(k, 4)).await.unwrap();
        }
        let change = match session.execute("ALTER QUERY 1 SET parallelism = 2;") {
            Ok(mut executed) => match executed.pop() {
                Some(Executed::Change(change)) => *change,
                _ => panic!("a change"),
            },
            Err(e) => panic!("{e}"),
        };
        let name = change.name.clone();
        assert!(name.is_some());
        let limit = Duration::from_secs(60);
        tokio::time::timeout(limit, change.end_run())
            .await
            .unwrap_or_else(|_| panic!("the first run did not end within {limit:?}"))
            .unwrap();
        // Rows only the log holds for the next run.
        for k in 12..15 {
            session.push_json("ev", &second(k, 4)).await.unwrap();
        }
        session.trim_wals().unwrap();
        assert_eq!(session.query_name(id), name);
        change.start_changed().unwrap();
        for k in 15..25 {
            session.push_json("ev", &second(k, 4)).await.unwrap();
        }
        session.end_stream("ev").await;
        tokio::time::timeout(limit, session.wait(id))
            .await
            .unwrap_or_else(|_| panic!("the changed query did not end within {limit:?}"))
            .unwrap();
        let mut counts: BTreeMap<(i64, String), i64> = BTreeMap::new();
        while let Some(batch) = tokio::time::timeout(limit, handle.next())
            .await
            .unwrap_or_else(|_| panic!("the ended query's results did not end within {limit:?}"))
        {
            let end = batch
                .column(0)
                .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>();
            let host = batch.column(1).as_string::<i32>();
            let n = batch.column(2).as_primitive::<Int64Type>();
            for i in 0..batch.num_rows() {
                let key = (end.value(i) / 1000, host.value(i).to_string());
                assert!(counts.insert(key, n.value(i)).is_none(), "a window twice");
            }
        }
        let windows: Vec<i64> = counts.values().copied().collect();
        assert_eq!(
            windows,
            [10, 10, 10, 10, 10, 10, 10, 10, 5, 5, 5, 5],
            "{counts:?}"
        );
    }
}
