//! The `Alert` logical node: a query's rows in, the alert's state changes
//! out.
//!
//! The node's input is the query with its conditions appended as boolean
//! columns, so DataFusion types and coerces them like any projection. The
//! node's own schema is the alert stream:
//!
//! | column | type | what |
//! |---|---|---|
//! | `alert` | TEXT | the alert's name |
//! | key columns | as in the query | the key the state is kept per |
//! | `state` | TEXT | `firing` or `resolved` |
//! | `event_time` | TIMESTAMP | event time of the change |
//! | `since` | TIMESTAMP | when the condition first held (deadman: the key's last row) |
//! | value columns | as in the query | the columns the conditions and message read |
//! | `severity` | TEXT | `SEVERITY`, or NULL |
//! | `message` | TEXT | the rendered `MESSAGE` (for `resolved` rows, `RESOLVE MESSAGE` if given), or NULL |
//! | `label_<name>` | TEXT | each `LABELS` template, rendered |
//! | `annotation_<name>` | TEXT | each `ANNOTATIONS` template, rendered |
//!
//! Every column carries its role in the field metadata
//! [`columns::ROLE`] (`alert`, `key`, `state`, `event_time`, `since`,
//! `value`, `severity`, `message`, `label`, `annotation`), and label and
//! annotation columns their name in [`columns::NAME`], so that a sink
//! (Alertmanager's) can tell the alert's key from its values after any
//! query that passes the columns on unchanged.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, TimeUnit};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::window_node::{WINDOW_END, WINDOW_START, Window, WindowNode, WindowSpec};

/// Names of the alert stream's own columns.
pub mod columns {
    /// The alert's name.
    pub const ALERT: &str = "alert";
    /// `firing` or `resolved`.
    pub const STATE: &str = "state";
    /// Event time of the change.
    pub const EVENT_TIME: &str = "event_time";
    /// When the episode began.
    pub const SINCE: &str = "since";
    /// The `SEVERITY` label.
    pub const SEVERITY: &str = "severity";
    /// The rendered `MESSAGE`.
    pub const MESSAGE: &str = "message";
    /// Prefix of the column of each `LABELS` entry.
    pub const LABEL_PREFIX: &str = "label_";
    /// Prefix of the column of each `ANNOTATIONS` entry.
    pub const ANNOTATION_PREFIX: &str = "annotation_";
    /// Field metadata key: the column's role in the alert row.
    pub const ROLE: &str = "vigil.alert.role";
    /// Field metadata key: the label or annotation name of such a column.
    pub const NAME: &str = "vigil.alert.name";

    /// What a column of an alert row is, as [`ROLE`] says.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Role {
        /// The alert's name.
        Alert,
        /// One of the key columns.
        Key,
        /// `firing` or `resolved`.
        State,
        /// Event time of the change.
        EventTime,
        /// When the episode began.
        Since,
        /// A query column the conditions or templates read.
        Value,
        /// The `SEVERITY`.
        Severity,
        /// The rendered `MESSAGE`.
        Message,
        /// A `LABELS` entry.
        Label,
        /// An `ANNOTATIONS` entry.
        Annotation,
    }

    impl Role {
        const ALL: [(Role, &'static str); 10] = [
            (Role::Alert, "alert"),
            (Role::Key, "key"),
            (Role::State, "state"),
            (Role::EventTime, "event_time"),
            (Role::Since, "since"),
            (Role::Value, "value"),
            (Role::Severity, "severity"),
            (Role::Message, "message"),
            (Role::Label, "label"),
            (Role::Annotation, "annotation"),
        ];

        /// The metadata value.
        pub fn as_str(self) -> &'static str {
            Self::ALL
                .iter()
                .find(|(r, _)| *r == self)
                .map_or("", |(_, s)| s)
        }

        /// The role a field's metadata gives it, if any.
        pub fn of(field: &datafusion::arrow::datatypes::Field) -> Option<Role> {
            let value = field.metadata().get(ROLE)?;
            Self::ALL.iter().find(|(_, s)| s == value).map(|(r, _)| *r)
        }
    }
}

/// What makes the alert fire, with its conditions as input columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum AlertRule {
    /// A condition, held for a while, resolved by another.
    When {
        /// Input column of the condition.
        when: usize,
        /// Input column of the resolve condition; `None` means "when is not
        /// true".
        resolve: Option<usize>,
        /// How long the condition must hold.
        hold: AlertHold,
    },
    /// No row of a key for `interval_ms` of event time.
    Absent {
        /// The silence that fires the alert.
        interval_ms: i64,
    },
}

/// How long a condition must hold before its alert fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd)]
pub enum AlertHold {
    /// Fires on the first row where the condition holds.
    Now,
    /// Event time since the first row of the episode reaches this.
    Interval(i64),
    /// This many consecutive rows of the key.
    Rows(u64),
}

/// Everything the alert operator needs, in input column indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct AlertSpec {
    /// The alert's name.
    pub name: String,
    /// Key columns.
    pub keys: Vec<usize>,
    /// The event-time column.
    pub event_time: usize,
    /// The rule.
    pub rule: AlertRule,
    /// Columns copied into each alert row.
    pub values: Vec<usize>,
    /// Distance between a key's consecutive windows, when the query's rows
    /// are windows of a grid: a longer gap breaks a pending episode.
    pub step_ms: Option<i64>,
    /// `SEVERITY`.
    pub severity: Option<String>,
    /// `MESSAGE` template.
    pub message: Option<String>,
    /// `RESOLVE MESSAGE` template, for `resolved` rows.
    pub resolve_message: Option<String>,
    /// `KEEP FIRING FOR`: event time the resolve condition must hold, row
    /// after row, before a firing alert resolves.
    pub keep_ms: Option<i64>,
    /// `LABELS`: (name, template).
    pub labels: Vec<(String, String)>,
    /// `ANNOTATIONS`: (name, template).
    pub annotations: Vec<(String, String)>,
}

/// Turns a query's rows into alert state changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AlertNode {
    /// The query, with the conditions appended.
    pub input: LogicalPlan,
    /// The alert.
    pub spec: AlertSpec,
    schema: DFSchemaRef,
}

impl AlertNode {
    /// Wraps `input` with `spec`.
    pub fn try_new(input: LogicalPlan, spec: AlertSpec) -> Result<Self> {
        let schema = Arc::new(alert_schema(input.schema(), &spec)?);
        Ok(Self {
            input,
            spec,
            schema,
        })
    }
}

fn alert_schema(input: &DFSchema, spec: &AlertSpec) -> Result<DFSchema> {
    use columns::Role;
    let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
    let time = |name: &str| {
        Field::new(
            name,
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        )
    };
    let column = |i: usize| input.field(i).as_ref().clone().with_nullable(true);
    let mut fields = vec![(text(columns::ALERT, false), Role::Alert)];
    fields.extend(spec.keys.iter().map(|&i| (column(i), Role::Key)));
    fields.push((text(columns::STATE, false), Role::State));
    fields.push((time(columns::EVENT_TIME), Role::EventTime));
    fields.push((time(columns::SINCE), Role::Since));
    fields.extend(spec.values.iter().map(|&i| (column(i), Role::Value)));
    fields.push((text(columns::SEVERITY, true), Role::Severity));
    fields.push((text(columns::MESSAGE, true), Role::Message));
    let mut fields: Vec<Arc<Field>> = fields
        .into_iter()
        .map(|(field, role)| Arc::new(with_role(field, role, None)))
        .collect();
    let named = [
        (&spec.labels, columns::LABEL_PREFIX, Role::Label),
        (
            &spec.annotations,
            columns::ANNOTATION_PREFIX,
            Role::Annotation,
        ),
    ];
    for (pairs, prefix, role) in named {
        for (name, _) in pairs {
            let field = text(&format!("{prefix}{name}"), true);
            fields.push(Arc::new(with_role(field, role, Some(name))));
        }
    }
    DFSchema::from_unqualified_fields(fields.into(), Default::default())
}

/// `field` with its alert role (and label or annotation name) in its
/// metadata, beside what metadata it had.
fn with_role(field: Field, role: columns::Role, name: Option<&str>) -> Field {
    let mut metadata: HashMap<String, String> = field.metadata().clone();
    metadata.insert(columns::ROLE.to_string(), role.as_str().to_string());
    if let Some(name) = name {
        metadata.insert(columns::NAME.to_string(), name.to_string());
    }
    field.with_metadata(metadata)
}

impl PartialOrd for AlertNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.spec.partial_cmp(&other.spec)
    }
}

impl UserDefinedLogicalNodeCore for AlertNode {
    fn name(&self) -> &str {
        "Alert"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let input = self.input.schema();
        let name = |i: &usize| input.field(*i).name().clone();
        let keys: Vec<_> = self.spec.keys.iter().map(name).collect();
        write!(
            f,
            "Alert: {} by [{}] at {}, ",
            self.spec.name,
            keys.join(", "),
            name(&self.spec.event_time)
        )?;
        match self.spec.rule {
            AlertRule::When { hold, resolve, .. } => {
                write!(f, "when")?;
                match hold {
                    AlertHold::Now => {}
                    AlertHold::Interval(ms) => write!(f, " for {ms} ms")?,
                    AlertHold::Rows(n) => write!(f, " for {n} windows")?,
                }
                if let Some(ms) = self.spec.keep_ms {
                    write!(f, ", keep firing for {ms} ms")?;
                }
                if resolve.is_some() {
                    write!(f, ", resolve when")?;
                }
                Ok(())
            }
            AlertRule::Absent { interval_ms } => write!(f, "absent for {interval_ms} ms"),
        }
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        Self::try_new(inputs.swap_remove(0), self.spec.clone())
    }
}

/// The columns of a query's output that identify a key: the non-window
/// GROUP BY columns of its outermost aggregate, or the PARTITION BY columns
/// of its window functions, as far as they reach the output unchanged.
pub fn key_columns(plan: &LogicalPlan) -> Vec<usize> {
    match plan {
        LogicalPlan::Aggregate(aggregate) => {
            let schema = plan.schema();
            (0..aggregate.group_expr.len())
                .filter(|&i| {
                    let name = schema.field(i).name();
                    name != WINDOW_START && name != WINDOW_END
                })
                .collect()
        }
        LogicalPlan::Projection(projection) => {
            let below = key_columns(&projection.input);
            let input = projection.input.schema();
            projection
                .expr
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    let inner = match e {
                        Expr::Alias(alias) => alias.expr.as_ref(),
                        other => other,
                    };
                    matches!(inner, Expr::Column(c)
                        if input.index_of_column(c).is_ok_and(|i| below.contains(&i)))
                })
                .map(|(i, _)| i)
                .collect()
        }
        LogicalPlan::Window(window) => {
            let input = window.input.schema();
            let mut keys = key_columns(&window.input);
            for expr in &window.window_expr {
                let Expr::WindowFunction(function) = expr.clone().unalias() else {
                    continue;
                };
                for partition in &function.params.partition_by {
                    if let Expr::Column(c) = partition
                        && let Ok(i) = input.index_of_column(c)
                        && !keys.contains(&i)
                        && !is_window_column(input.field(i).name())
                    {
                        keys.push(i);
                    }
                }
            }
            keys.sort_unstable();
            keys
        }
        LogicalPlan::Filter(_)
        | LogicalPlan::SubqueryAlias(_)
        | LogicalPlan::Limit(_)
        | LogicalPlan::Extension(_) => match plan.inputs().as_slice() {
            [input] if input.schema().fields().len() <= plan.schema().fields().len() => {
                key_columns(input)
            }
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn is_window_column(name: &str) -> bool {
    name == WINDOW_START || name == WINDOW_END
}

/// The distance between consecutive windows of the query's outermost
/// aligned window, if it has one.
pub fn window_step_ms(plan: &LogicalPlan) -> Option<i64> {
    let mut step = None;
    let _ = plan.apply(|node| {
        if let LogicalPlan::Extension(ext) = node
            && let Some(window) = ext.node.as_any().downcast_ref::<WindowNode>()
        {
            step = match window.window {
                Window::Aligned(WindowSpec::Aligned { slide_ms, .. }) => Some(slide_ms),
                Window::Session { .. } => None,
            };
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    step
}
