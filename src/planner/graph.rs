//! The operator graph a query is planned into: its stages of tasks (each
//! run as one instance or several that share the keys), where its inputs
//! meet, and how a group cuts it between processes.

use super::*;

/// Tasks in data-flow order; each runs a chain of fused operators.
pub type Stages = Vec<Stage>;

/// One task of a query, run as one instance or, when it starts with an
/// operator whose state is per key, as several instances that each own a
/// share of the keys.
pub struct Stage {
    /// One chain of fused operators per instance, all alike.
    pub instances: Vec<Vec<Box<dyn Operator>>>,
    /// What rows are routed to an instance by (the key of the operator the
    /// stage starts with): `None` for a stage that runs as one instance.
    pub keys: Option<Vec<Arc<dyn PhysicalExpr>>>,
    /// It keeps state over the rows of every key as one instance (an
    /// aggregate without keys, peers, an invariant, early results): what it
    /// computes needs every row of the stream, not one key's.
    pub global: bool,
    /// The rows its first operator takes, for a stage that starts at an
    /// operator keeping state (`None` for a chain of stateless ones).
    pub input: Option<SchemaRef>,
}

impl Stage {
    /// A stage of one instance.
    pub fn single(ops: Vec<Box<dyn Operator>>) -> Self {
        Self {
            instances: vec![ops],
            keys: None,
            global: false,
            input: None,
        }
    }

    /// The names of the columns its key reads: each key that is a column,
    /// by name, and each other one as its expression.
    pub fn key_names(&self) -> Vec<String> {
        self.keys
            .iter()
            .flatten()
            .map(|k| {
                (k.as_ref() as &dyn std::any::Any)
                    .downcast_ref::<datafusion::physical_expr::expressions::Column>()
                    .map_or_else(|| k.to_string(), |c| c.name().to_string())
            })
            .collect()
    }

    /// The operators of its first instance (every instance has the same).
    pub fn ops(&self) -> &[Box<dyn Operator>] {
        &self.instances[0]
    }

    /// Its first instance's operators, for running the stage as one.
    pub fn into_ops(self) -> Vec<Box<dyn Operator>> {
        self.instances.into_iter().next().unwrap_or_default()
    }
}

/// Where a query's inputs meet in a merge operator: as one instance, or,
/// for an operator whose state is per key (see
/// [`MergeOperator::input_keys`]), as several that each own a share of the
/// keys.
pub struct Merge {
    /// One operator per instance, all alike.
    pub instances: Vec<Box<dyn MergeOperator>>,
}

impl Merge {
    /// A merge of one instance.
    pub fn single(op: Box<dyn MergeOperator>) -> Self {
        Merge {
            instances: vec![op],
        }
    }

    /// Per input, what its rows are routed to an instance by; `None` for
    /// a merge that runs as one instance.
    pub fn keys(&self) -> Option<Vec<Vec<Arc<dyn PhysicalExpr>>>> {
        self.instances.first().and_then(|op| op.input_keys())
    }

    /// Its first instance's description (every instance has the same).
    pub fn describe(&self) -> String {
        self.instances
            .first()
            .map(|op| op.describe())
            .unwrap_or_default()
    }
}

/// A query rewritten for incremental execution: one or more streams, each
/// feeding a line of tasks; where there are several, their rows merge (with
/// the minimum of their watermarks) into the tasks that follow.
pub struct QueryGraph {
    /// The streams the query reads, each with the tasks before the merge.
    pub inputs: Vec<QueryInput>,
    /// How the inputs merge: `None` for a union, or a window join, control
    /// stream or batch query that takes each input's rows.
    pub join: Option<Merge>,
    /// Tasks after the inputs merge (every task when there is one input).
    pub stages: Stages,
    /// Schema of the result rows.
    pub schema: SchemaRef,
    /// The chosen execution mode.
    pub mode: ExecutionMode,
    /// Counters the operators update.
    pub stats: Arc<QueryStats>,
    /// Where each window operator sends its late rows, by stream.
    pub late_outputs: Vec<(String, Arc<LateRows>)>,
}

/// One stream a query reads and the tasks its rows pass before they meet
/// the other inputs.
pub struct QueryInput {
    /// The stream.
    pub stream: Arc<StreamDef>,
    /// Its own tasks.
    pub stages: Stages,
}

impl QueryGraph {
    /// Instances of its widest stage: the parallelism it was planned at
    /// (1 for a query with no key-partitioned stage).
    pub fn parallelism(&self) -> usize {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .map(|s| s.instances.len())
            .chain(self.join.iter().map(|j| j.instances.len()))
            .max()
            .unwrap_or(1)
    }

    /// The first operator that keeps state over every key (see
    /// [`Stage::global`]), described; `None` when all state is per key.
    pub fn global_stage(&self) -> Option<String> {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .find(|s| s.global)
            .and_then(|s| s.ops().first())
            .map(|op| op.describe())
    }
}

/// A query cut in two before one of its stages (see [`QueryGraph::split`]).
pub struct Split {
    /// The stages before.
    pub head: QueryGraph,
    /// The stages from the cut on.
    pub tail: Stages,
    /// The rows the head emits and the tail takes.
    pub boundary: SchemaRef,
}

impl QueryGraph {
    /// Where a query of one stream would be cut before its first stage
    /// over every key: that stage's index, or `None` when all its state is
    /// per key. An error says why it cannot be cut: it merges several
    /// streams, or its very first operator needs every key.
    pub fn global_split_point(&self) -> Result<Option<usize>> {
        let Some(operator) = self.global_stage() else {
            return Ok(None);
        };
        if self.inputs.len() != 1 || self.join.is_some() || !self.inputs[0].stages.is_empty() {
            return Err(Error::Plan(format!(
                "it keeps state over every key ({operator}) after merging several streams, which a group cannot split between its processes yet"
            )));
        }
        let at = self.stages.iter().position(|s| s.global);
        match at {
            Some(at) if at > 0 && self.stages[at].input.is_some() => Ok(Some(at)),
            _ => Err(Error::Plan(format!(
                "it keeps state over every key ({operator}) from its first operator on, so no part of it runs per partition"
            ))),
        }
    }

    /// Where a query of one stream would be cut to re-partition its rows
    /// by key, when its input is partitioned by the columns
    /// `partitioned_by` (none: not by any column): the index of its first
    /// key-partitioned stage whose key does not include them all, or
    /// `None` when every key does (the rows of each key are then in one
    /// partition already). An error says why it cannot be cut there: it
    /// merges several streams, keeps state over every key too, or keys
    /// its state afterwards by something the cut's key does not decide.
    pub fn repartition_point(&self, partitioned_by: &[String]) -> Result<Option<usize>> {
        let covered = |stage: &Stage| {
            let names = stage.key_names();
            !partitioned_by.is_empty() && partitioned_by.iter().all(|c| names.contains(c))
        };
        let uncovered =
            |stages: &Stages| stages.iter().position(|s| s.keys.is_some() && !covered(s));
        let merges = self.inputs.len() != 1 || self.join.is_some();
        if merges && self.inputs.iter().any(|i| uncovered(&i.stages).is_some()) {
            return Err(Error::Plan(
                "its rows must be re-partitioned by key before it merges several streams, which a group cannot do yet".into(),
            ));
        }
        let Some(at) = uncovered(&self.stages) else {
            return Ok(None);
        };
        let key = self.stages[at].key_names().join(", ");
        if merges || !self.inputs[0].stages.is_empty() {
            return Err(Error::Plan(format!(
                "its rows must be re-partitioned by {key} after it merges several streams, which a group cannot do yet"
            )));
        }
        if let Some(operator) = self.global_stage() {
            return Err(Error::Plan(format!(
                "its rows must be re-partitioned by {key} and it keeps state over every key ({operator}), which a group cannot do both of yet"
            )));
        }
        if at == 0 || self.stages[at].input.is_none() {
            return Err(Error::Plan(format!(
                "it keeps state by {key} from its first operator on, so no part of it runs per partition"
            )));
        }
        let names = self.stages[at].key_names();
        let rekeyed = self.stages[at + 1..]
            .iter()
            .filter(|s| s.keys.is_some())
            .find(|s| !names.iter().all(|n| s.key_names().contains(n)));
        if let Some(later) = rekeyed {
            return Err(Error::Plan(format!(
                "its rows would be re-partitioned by {key} and again by {}, which a group cannot do yet",
                later.key_names().join(", ")
            )));
        }
        Ok(Some(at))
    }

    /// Cuts the query before stage `at` (from
    /// [`QueryGraph::global_split_point`] or
    /// [`QueryGraph::repartition_point`]), which must know its input. The
    /// head keeps the query's input, counters and late rows; it emits the
    /// boundary rows.
    pub fn split(mut self, at: usize) -> Split {
        let tail = self.stages.split_off(at);
        let boundary = tail[0]
            .input
            .clone()
            .expect("a split point's stage knows its input");
        self.schema = boundary.clone();
        Split {
            head: self,
            tail,
            boundary,
        }
    }

    /// The tail of a split query, reading the head's rows and watermarks
    /// from `stream` (whose rows are [`crate::exec::remote::remote_schema`]
    /// of `boundary`): a [`RemoteInOp`](crate::exec::RemoteInOp) turns them
    /// back into messages ahead of the tail's first operator.
    pub fn remote_tail(
        stream: Arc<StreamDef>,
        boundary: SchemaRef,
        mut tail: Stages,
        schema: SchemaRef,
        mode: ExecutionMode,
    ) -> QueryGraph {
        let remote: Box<dyn Operator> = Box::new(crate::exec::RemoteInOp::new(boundary));
        match tail.first_mut() {
            // A global stage runs as one instance: its chain starts with
            // the turning back.
            Some(first) if first.keys.is_none() => first.instances[0].insert(0, remote),
            // A keyed one routes rows to its instances by key: they are
            // turned back before.
            _ => tail.insert(0, Stage::single(vec![remote])),
        }
        QueryGraph {
            inputs: vec![QueryInput {
                stream,
                stages: Vec::new(),
            }],
            join: None,
            stages: tail,
            schema,
            mode,
            stats: Arc::new(QueryStats::default()),
            late_outputs: Vec::new(),
        }
    }
}

impl fmt::Debug for QueryGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", explain::describe(self))
    }
}

impl QueryGraph {
    /// A readable description of the operator graph, for `EXPLAIN`.
    pub fn describe(&self) -> String {
        explain::describe(self)
    }

    /// How many of its stages are key-partitioned (whatever their
    /// instances).
    pub fn keyed_stages(&self) -> usize {
        self.inputs
            .iter()
            .flat_map(|i| &i.stages)
            .chain(&self.stages)
            .filter(|s| s.keys.is_some())
            .count()
    }
}
