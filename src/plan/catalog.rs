//! The streams and sinks a script has declared.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::{LogicalPlan, TableSource};

use crate::connector::{SinkConfig, SourceConfig, catalogue};
use crate::connectors::registry;
use crate::error::{Error, Result};
use crate::sql::{CreateSink, CreateStream};
use crate::types;

pub use crate::types::TIME_TYPE;

/// A declared stream: its schema, event time and where its rows come from.
#[derive(Debug, Clone)]
pub struct StreamDef {
    /// Stream name.
    pub name: String,
    /// Declared columns.
    pub schema: SchemaRef,
    /// Index of the event-time column: the `WATERMARK FOR` column, else the
    /// first TIMESTAMP column.
    pub event_time: Option<usize>,
    /// Bounded out-of-orderness declared by the watermark, in milliseconds.
    pub delay_ms: i64,
    /// How long after a window fires it still takes rows (and fires again
    /// as an update), in milliseconds; `allowed_lateness` in `WITH`.
    pub lateness_ms: i64,
    /// After this long without rows, the stream stops holding back the
    /// watermark of queries that merge it with others; `idle_timeout` in
    /// `WITH`.
    pub idle_timeout: Option<std::time::Duration>,
    /// How to read it.
    pub source: SourceConfig,
    /// For `late(stream)`: the stream whose late rows this is. Its rows are
    /// not read from `source` but sent by the window operators of the other
    /// queries over that stream.
    pub late_of: Option<String>,
    /// What a query does with the stream's rows while it is behind:
    /// `buffer` and `buffer_max` in `WITH`.
    pub buffer: BufferSetting,
}

impl StreamDef {
    /// The stream of rows that queries over this one drop as late.
    pub fn late_rows(&self) -> StreamDef {
        StreamDef {
            name: format!("late({})", self.name),
            late_of: Some(self.name.clone()),
            ..self.clone()
        }
    }
}

/// Streams and sinks by name.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    streams: BTreeMap<String, Arc<StreamDef>>,
    views: BTreeMap<String, Arc<ViewSource>>,
    sinks: BTreeMap<String, SinkConfig>,
}

impl Catalog {
    /// Looks up a stream: a declared one, else a built-in one (see
    /// [`builtin_stream`]).
    pub fn stream(&self, name: &str) -> Option<&Arc<StreamDef>> {
        self.streams.get(name).or_else(|| builtin_stream(name))
    }

    /// All streams, by name.
    pub fn streams(&self) -> impl Iterator<Item = &Arc<StreamDef>> {
        self.streams.values()
    }

    /// Looks up a sink.
    pub fn sink(&self, name: &str) -> Option<&SinkConfig> {
        self.sinks.get(name)
    }

    /// All sinks, by name.
    pub fn sinks(&self) -> impl Iterator<Item = &SinkConfig> {
        self.sinks.values()
    }

    /// Looks up a view.
    pub fn view(&self, name: &str) -> Option<&Arc<ViewSource>> {
        self.views.get(name)
    }

    /// All views, by name.
    pub fn views(&self) -> impl Iterator<Item = (&str, &Arc<ViewSource>)> {
        self.views.iter().map(|(name, view)| (name.as_str(), view))
    }

    /// Adds a view: a planned query that later queries read by name.
    pub fn add_view(&mut self, name: &str, plan: LogicalPlan) -> Result<()> {
        self.check_free(name)?;
        let view = ViewSource {
            schema: Arc::new(plan.schema().as_arrow().clone()),
            plan,
        };
        self.views.insert(name.to_string(), Arc::new(view));
        Ok(())
    }

    fn check_free(&self, name: &str) -> Result<()> {
        if self.streams.contains_key(name) || self.views.contains_key(name) {
            return Err(Error::Plan(format!(
                "a stream or view named '{name}' already exists"
            )));
        }
        Ok(())
    }

    /// Adds a stream; its delay has been evaluated by the caller.
    pub fn add_stream(&mut self, def: StreamDef) -> Result<()> {
        self.check_free(&def.name)?;
        self.streams.insert(def.name.clone(), Arc::new(def));
        Ok(())
    }

    /// The declared streams, then the built-in ones that no declared
    /// stream or view hides.
    pub fn all_streams(&self) -> impl Iterator<Item = &Arc<StreamDef>> {
        let builtin = BUILTIN_STREAMS
            .iter()
            .filter(|(name, _)| {
                !self.streams.contains_key(*name) && !self.views.contains_key(*name)
            })
            .filter_map(|(name, _)| builtin_stream(name));
        self.streams.values().chain(builtin)
    }

    /// True for a built-in stream (not a declared one of the same name).
    pub fn is_builtin(stream: &Arc<StreamDef>) -> bool {
        builtin_stream(&stream.name).is_some_and(|b| Arc::ptr_eq(b, stream))
    }

    /// True if `name` is a stream declared in this catalog (not a
    /// built-in one).
    pub fn has_stream(&self, name: &str) -> bool {
        self.streams.contains_key(name)
    }

    /// Removes a declared stream; false if there is none of that name.
    /// Queries planned on it keep their own copy of its definition.
    pub fn remove_stream(&mut self, name: &str) -> bool {
        self.streams.remove(name).is_some()
    }

    /// Removes a view (or an alert or invariant, which are kept as views);
    /// false if there is none of that name.
    pub fn remove_view(&mut self, name: &str) -> bool {
        self.views.remove(name).is_some()
    }

    /// Removes a sink; false if there is none of that name.
    pub fn remove_sink(&mut self, name: &str) -> bool {
        self.sinks.remove(name).is_some()
    }

    /// The declared streams and views that `plan` reads, directly or
    /// through a view, sorted. Views are inlined where they are read (as
    /// the view's plan under an alias of its name), so a view counts where
    /// such an alias holds exactly its plan; a `late(stream)` read counts
    /// as reading `stream`.
    pub fn reads(&self, plan: &LogicalPlan) -> Vec<String> {
        let mut names = Vec::new();
        let _ = plan.apply_with_subqueries(|node| {
            match node {
                LogicalPlan::TableScan(scan) => {
                    if let Some(stream) = scan.source.as_ref().downcast_ref::<StreamSource>() {
                        let def = &stream.def;
                        names.push(def.late_of.clone().unwrap_or_else(|| def.name.clone()));
                    }
                }
                LogicalPlan::SubqueryAlias(alias) => {
                    let name = alias.alias.table();
                    if let Some(view) = self.views.get(name)
                        && inlines(&alias.input, &view.plan)
                    {
                        names.push(name.to_string());
                    }
                }
                _ => {}
            }
            Ok(TreeNodeRecursion::Continue)
        });
        names.retain(|n| self.stream(n).is_some() || self.views.contains_key(n));
        names.sort();
        names.dedup();
        names
    }

    /// Adds a sink from its statement.
    pub fn add_sink(&mut self, create: &CreateSink, base_dir: &Path) -> Result<()> {
        if self.sinks.contains_key(&create.name) {
            return Err(Error::Plan(format!(
                "sink '{name}' already exists (CREATE OR REPLACE SINK {name} replaces it, DROP SINK {name} removes it)",
                name = create.name
            )));
        }
        let config = SinkConfig::from_options(&create.name, &create.options, base_dir)?;
        self.sinks.insert(create.name.clone(), config);
        Ok(())
    }
}

/// True if `input` is `plan`, or a projection of it (how DataFusion
/// inlines a view read with a projection).
fn inlines(input: &LogicalPlan, plan: &LogicalPlan) -> bool {
    match input {
        LogicalPlan::Projection(projection) if *projection.input.as_ref() == *plan => true,
        other => other == plan,
    }
}

/// Streams that every script can read without declaring them, and their
/// connectors. A stream or view declared with the same name hides one.
pub const BUILTIN_STREAMS: &[(&str, &str)] = &[("host_metrics", "host"), ("demo", "demo")];

/// A built-in stream: every column of its connector's catalogue,
/// `WATERMARK FOR ts AS ts`, the connector's default options (`host_metrics`
/// samples this machine every second, `demo` replays the bundled NAB series
/// at 1000 rows per second).
pub fn builtin_stream(name: &str) -> Option<&'static Arc<StreamDef>> {
    static STREAMS: OnceLock<Vec<Arc<StreamDef>>> = OnceLock::new();
    let index = BUILTIN_STREAMS.iter().position(|(n, _)| *n == name)?;
    STREAMS
        .get_or_init(|| {
            BUILTIN_STREAMS
                .iter()
                .map(|(name, connector)| Arc::new(builtin_def(name, connector)))
                .collect()
        })
        .get(index)
}

fn builtin_def(name: &str, connector: &str) -> StreamDef {
    let schema = catalogue::full_schema(registry::catalogue(connector).unwrap_or_default());
    let event_time = schema.index_of("ts").ok();
    let options = [("connector".to_string(), connector.to_string())];
    let source =
        SourceConfig::from_options(name, schema.clone(), event_time, &options, Path::new("."))
            .expect("the options of a built-in stream are valid");
    StreamDef {
        name: name.to_string(),
        schema,
        event_time,
        delay_ms: 0,
        lateness_ms: 0,
        idle_timeout: None,
        source,
        late_of: None,
        buffer: BufferSetting::default(),
    }
}

/// `WITH` option about event time rather than the connector: how long a
/// fired window still takes rows.
pub const ALLOWED_LATENESS: &str = "allowed_lateness";
/// `WITH` option about event time rather than the connector: when an input
/// counts as idle.
pub const IDLE_TIMEOUT: &str = "idle_timeout";
/// `WITH` option about a query falling behind: `'disk'` buffers its rows
/// on disk rather than making the stream wait, `'none'` does not.
pub const BUFFER: &str = "buffer";
/// `WITH` option: the most bytes a disk buffer holds (a size such as
/// `'2GiB'`).
pub const BUFFER_MAX: &str = "buffer_max";

/// The bound of a disk buffer when `buffer_max` is not given.
pub const DEFAULT_BUFFER_MAX: u64 = 1 << 30;

/// The smallest `buffer_max` accepted.
pub const MIN_BUFFER_MAX: u64 = 1 << 20;

/// What a query does with a stream's rows while it is behind: by default
/// the stream waits for it (back-pressure); with a disk buffer the rows
/// wait on disk instead, up to a bound (see [`crate::runtime::buffer`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferSetting {
    /// `buffer`: `Some(true)` for `'disk'`, `Some(false)` for `'none'`,
    /// `None` when not said.
    pub disk: Option<bool>,
    /// `buffer_max` in bytes, `None` when not said.
    pub max_bytes: Option<u64>,
}

impl BufferSetting {
    /// Reads option `key` (`buffer` or `buffer_max`) into this setting;
    /// `what` names the stream or setting in errors.
    pub fn set(&mut self, what: &str, key: &str, value: &str) -> Result<()> {
        let bad = |accepted: &str| {
            Error::Plan(format!(
                "{what}: bad value '{value}' for option '{key}' (accepted: {accepted})"
            ))
        };
        match key {
            BUFFER => {
                self.disk = Some(match value.trim().to_ascii_lowercase().as_str() {
                    "disk" => true,
                    "none" => false,
                    _ => return Err(bad("disk, none")),
                });
            }
            _ => {
                let bytes = crate::connector::options::parse_size(value)
                    .filter(|&n| n >= MIN_BUFFER_MAX)
                    .ok_or_else(|| bad("a size of at least 1MiB, such as '512MiB' or '2GiB'"))?;
                self.max_bytes = Some(bytes);
            }
        }
        Ok(())
    }

    /// This setting, with `fallback`'s where this one says nothing (a
    /// stream's own options win over the session's).
    pub fn or(self, fallback: BufferSetting) -> BufferSetting {
        BufferSetting {
            disk: self.disk.or(fallback.disk),
            max_bytes: self.max_bytes.or(fallback.max_bytes),
        }
    }

    /// The bound of the disk buffer, when rows are buffered on disk.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.disk
            .unwrap_or(false)
            .then(|| self.max_bytes.unwrap_or(DEFAULT_BUFFER_MAX))
    }
}

/// A stream's event-time settings, evaluated from its statement.
#[derive(Debug, Clone, Copy, Default)]
pub struct StreamTiming {
    /// Watermark delay in milliseconds.
    pub delay_ms: i64,
    /// Allowed lateness in milliseconds.
    pub lateness_ms: i64,
    /// Idle timeout, if any.
    pub idle_timeout: Option<std::time::Duration>,
}

/// Builds a stream definition from its statement and its evaluated timing.
pub fn stream_def(
    create: &CreateStream,
    timing: StreamTiming,
    base_dir: &Path,
) -> Result<StreamDef> {
    let mut fields = Vec::with_capacity(create.columns.len());
    for column in &create.columns {
        if fields.iter().any(|f: &Field| f.name() == &column.name) {
            return Err(Error::Plan(format!(
                "stream '{}': column '{}' is declared twice",
                create.name, column.name
            )));
        }
        let data_type = types::arrow_type(&column.data_type).map_err(|reason| {
            Error::Plan(format!(
                "stream '{}': column '{}': {reason}",
                create.name, column.name
            ))
        })?;
        fields.push(Field::new(&column.name, data_type, true));
    }
    let schema = Arc::new(Schema::new(fields));
    let event_time = event_time_column(create, &schema)?;
    let mut buffer = BufferSetting::default();
    let mut connector_options: Vec<(String, String)> = Vec::new();
    for (key, value) in &create.options {
        match key.as_str() {
            ALLOWED_LATENESS | IDLE_TIMEOUT => {}
            BUFFER | BUFFER_MAX => {
                let what = format!("stream {}", create.name);
                if create.options.iter().filter(|(k, _)| k == key).count() > 1 {
                    return Err(Error::Plan(format!(
                        "{what}: option '{key}' is given more than once"
                    )));
                }
                buffer.set(&what, key, value)?
            }
            _ => connector_options.push((key.clone(), value.clone())),
        }
    }
    let source = SourceConfig::from_options(
        &create.name,
        schema.clone(),
        event_time,
        &connector_options,
        base_dir,
    )?;
    Ok(StreamDef {
        name: create.name.clone(),
        schema,
        event_time,
        delay_ms: timing.delay_ms,
        lateness_ms: timing.lateness_ms,
        idle_timeout: timing.idle_timeout,
        source,
        late_of: None,
        buffer,
    })
}

fn event_time_column(create: &CreateStream, schema: &Schema) -> Result<Option<usize>> {
    let Some(watermark) = &create.watermark else {
        return Ok(schema
            .fields()
            .iter()
            .position(|f| f.data_type() == &TIME_TYPE));
    };
    let index = schema.index_of(&watermark.column).map_err(|_| {
        Error::Plan(format!(
            "stream '{}': WATERMARK FOR names unknown column '{}'",
            create.name, watermark.column
        ))
    })?;
    if schema.field(index).data_type() != &TIME_TYPE {
        return Err(Error::Plan(format!(
            "stream '{}': WATERMARK column '{}' must be a TIMESTAMP",
            create.name, watermark.column
        )));
    }
    Ok(Some(index))
}

/// A stream as DataFusion's SQL planner sees it: a schema, and the
/// definition the incremental planner reads back from the scan.
#[derive(Debug)]
pub struct StreamSource {
    /// The stream behind the scan.
    pub def: Arc<StreamDef>,
}

impl TableSource for StreamSource {
    fn schema(&self) -> SchemaRef {
        self.def.schema.clone()
    }
}

/// A view as DataFusion's SQL planner sees it: its plan is inlined where the
/// view is read.
#[derive(Debug)]
pub struct ViewSource {
    plan: LogicalPlan,
    schema: SchemaRef,
}

impl TableSource for ViewSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn get_logical_plan(&self) -> Option<Cow<'_, LogicalPlan>> {
        Some(Cow::Borrowed(&self.plan))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::connector::{Reader, SourceLocation};
    use crate::connectors::demo::Demo;
    use crate::connectors::host::Host;
    use crate::engine::{Engine, Outcome};
    use crate::sql::parse_script;

    fn run(engine: &mut Engine, sql: &str) -> Result<Outcome> {
        let mut last = Ok(Outcome::Done);
        for statement in parse_script(sql).unwrap() {
            last = Ok(engine.execute(&statement, Path::new("."))?);
        }
        last
    }

    #[test]
    fn builtin_streams() {
        let host = builtin_stream("host_metrics").unwrap();
        let names: Vec<&str> = host
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        assert_eq!(names[..3], ["ts", "host", "cpu"]);
        assert!(names.contains(&"processes") && names.contains(&"net_tx_bytes"));
        assert_eq!(host.event_time, Some(0));
        assert_eq!(host.delay_ms, 0);
        assert_eq!(
            host.source.location,
            SourceLocation::Connector(Reader(Arc::new(Host {
                interval: Duration::from_secs(1),
                limit: None
            })))
        );
        let demo = builtin_stream("demo").unwrap();
        assert_eq!(demo.schema.fields().len(), 4);
        assert_eq!(demo.event_time, Some(0));
        assert_eq!(
            demo.source.location,
            SourceLocation::Connector(Reader(Arc::new(Demo {
                speed: 1000.0,
                limit: None
            })))
        );
        assert!(builtin_stream("metrics").is_none());
        // The same definition every time, so that queries share one source.
        assert!(Arc::ptr_eq(host, builtin_stream("host_metrics").unwrap()));
    }

    #[test]
    fn builtin_streams_need_no_ddl_and_declared_ones_hide_them() {
        let catalog = Catalog::default();
        assert!(catalog.stream("host_metrics").is_some());
        assert!(catalog.stream("demo").is_some());

        let mut engine = Engine::new();
        let outcome = run(
            &mut engine,
            "SELECT window_end, host, avg(cpu) AS avg_cpu
             FROM TUMBLE(host_metrics, ts, INTERVAL '10' SECOND)
             GROUP BY window_end, host
             ALERT WHEN avg_cpu > 80 FOR INTERVAL '30' SECOND;",
        )
        .unwrap();
        assert!(matches!(outcome, Outcome::Query(_)));
        let outcome = run(
            &mut engine,
            "EXPLAIN SELECT ts, value FROM demo WHERE value < 50;",
        )
        .unwrap();
        let Outcome::Explain(text) = outcome else {
            panic!("not an explain")
        };
        assert!(text.contains("source demo (demo, 1000 rows/s)"), "{text}");

        run(
            &mut engine,
            "CREATE STREAM demo (ts TIMESTAMP, value DOUBLE) WITH (connector = 'demo', limit = '5');",
        )
        .unwrap();
        let demo = engine.catalog().stream("demo").unwrap();
        assert_eq!(demo.schema.fields().len(), 2);
        assert_eq!(
            demo.source.location,
            SourceLocation::Connector(Reader(Arc::new(Demo {
                speed: 1000.0,
                limit: Some(5)
            })))
        );
    }

    #[test]
    fn host_stream_columns_are_checked_when_declared() {
        let mut engine = Engine::new();
        let e = run(
            &mut engine,
            "CREATE STREAM h (ts TIMESTAMP, host TEXT, cpu BIGINT, WATERMARK FOR ts AS ts)
             WITH (connector = 'host');",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("'cpu'")
                && e.contains("is DOUBLE, not BIGINT")
                && e.contains("mem_used_bytes BIGINT"),
            "{e}"
        );
    }

    #[test]
    fn reads_names_streams_and_views_but_not_aliases() {
        let mut engine = Engine::new();
        run(
            &mut engine,
            "CREATE STREAM m (ts TIMESTAMP, cpu DOUBLE) WITH (path = 'm.csv');
             CREATE VIEW hot AS SELECT ts, cpu FROM m WHERE cpu > 1;",
        )
        .unwrap();
        let catalog = engine.catalog();
        let planner = crate::plan::SqlPlanner::new();
        let reads = |sql: &str| {
            let statement = parse_script(sql).unwrap().remove(0);
            let crate::sql::StatementKind::Query { query, .. } = statement.kind else {
                panic!("not a query")
            };
            catalog.reads(&planner.plan_raw(catalog, &query).unwrap())
        };
        assert_eq!(reads("SELECT * FROM hot"), ["hot", "m"]);
        assert_eq!(
            reads(
                "SELECT window_end, count(*) FROM TUMBLE(hot, ts, INTERVAL '1' SECOND) GROUP BY window_end"
            ),
            ["hot", "m"]
        );
        // An alias named like the view is not the view.
        assert_eq!(reads("SELECT * FROM m AS hot"), ["m"]);
        assert_eq!(reads("SELECT * FROM late(m)"), ["m"]);
        assert_eq!(reads("SELECT * FROM host_metrics"), ["host_metrics"]);

        let mut catalog = catalog.clone();
        assert!(catalog.remove_view("hot") && !catalog.remove_view("hot"));
        assert!(catalog.remove_stream("m") && !catalog.has_stream("m"));
        assert!(!catalog.remove_stream("host_metrics"));
        assert!(catalog.stream("host_metrics").is_some());
    }
}
