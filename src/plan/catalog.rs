//! The streams and sinks a script has declared.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::{LogicalPlan, TableSource};

use crate::connector::{Connectors, SinkConfig, SourceConfig, StreamDecl, catalogue};
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
/// The default catalog has no built-in streams; [`Catalog::new`] resolves
/// them through the connectors it is given.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    streams: BTreeMap<String, Arc<StreamDef>>,
    views: BTreeMap<String, Arc<ViewSource>>,
    sinks: BTreeMap<String, SinkConfig>,
    /// The built-in streams ([`BUILTIN_STREAMS`]), defined once: every
    /// query over one reads the same definition, so they share a source.
    builtins: Arc<Vec<Arc<StreamDef>>>,
}

impl Catalog {
    /// An empty catalog with the built-in streams, their connectors
    /// resolved through `connectors`.
    pub fn new(connectors: &dyn Connectors) -> Catalog {
        let builtins = BUILTIN_STREAMS
            .iter()
            .map(|(name, connector)| Arc::new(builtin_def(name, connector, connectors)))
            .collect();
        Catalog {
            builtins: Arc::new(builtins),
            ..Catalog::default()
        }
    }

    /// Looks up a stream: a declared one, else a built-in one.
    pub fn stream(&self, name: &str) -> Option<&Arc<StreamDef>> {
        self.streams.get(name).or_else(|| self.builtin(name))
    }

    /// The built-in stream `name`, if there is one.
    fn builtin(&self, name: &str) -> Option<&Arc<StreamDef>> {
        self.builtins.iter().find(|b| b.name == name)
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
        let builtin = self
            .builtins
            .iter()
            .filter(|b| !self.streams.contains_key(&b.name) && !self.views.contains_key(&b.name));
        self.streams.values().chain(builtin)
    }

    /// True for a built-in stream (not a declared one of the same name).
    pub fn is_builtin(&self, stream: &Arc<StreamDef>) -> bool {
        self.builtin(&stream.name)
            .is_some_and(|b| Arc::ptr_eq(b, stream))
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

    /// Adds a sink from its statement, its connector resolved through
    /// `connectors`.
    pub fn add_sink(
        &mut self,
        create: &CreateSink,
        base_dir: &Path,
        connectors: &dyn Connectors,
    ) -> Result<()> {
        if self.sinks.contains_key(&create.name) {
            return Err(Error::Plan(format!(
                "sink '{name}' already exists (CREATE OR REPLACE SINK {name} replaces it, DROP SINK {name} removes it)",
                name = create.name
            )));
        }
        let config = connectors.sink(&create.name, &create.options, base_dir)?;
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
fn builtin_def(name: &str, connector: &str, connectors: &dyn Connectors) -> StreamDef {
    let schema = catalogue::full_schema(connectors.catalogue(connector).unwrap_or_default());
    let event_time = schema.index_of("ts").ok();
    let options = [("connector".to_string(), connector.to_string())];
    let decl = StreamDecl {
        stream: name,
        schema: schema.clone(),
        event_time,
        base_dir: Path::new("."),
    };
    let source = connectors
        .source(&decl, &options)
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
/// wait on disk instead, up to a bound (the runtime's `buffer` module keeps them).
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

/// Builds a stream definition from its statement and its evaluated timing,
/// its connector resolved through `connectors`.
pub fn stream_def(
    create: &CreateStream,
    timing: StreamTiming,
    base_dir: &Path,
    connectors: &dyn Connectors,
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
    let decl = StreamDecl {
        stream: &create.name,
        schema: schema.clone(),
        event_time,
        base_dir,
    };
    let source = connectors.source(&decl, &connector_options)?;
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
