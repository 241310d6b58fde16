//! The streams and sinks a script has declared.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::logical_expr::{LogicalPlan, TableSource};
use datafusion::sql::sqlparser::ast::DataType as SqlType;

use crate::connectors::{SinkConfig, SourceConfig};
use crate::error::{Error, Result};
use crate::sql::{CreateSink, CreateStream};

/// The Arrow type of every event-time and window column.
pub const TIME_TYPE: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

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
    /// Looks up a stream.
    pub fn stream(&self, name: &str) -> Option<&Arc<StreamDef>> {
        self.streams.get(name)
    }

    /// All streams, by name.
    pub fn streams(&self) -> impl Iterator<Item = &Arc<StreamDef>> {
        self.streams.values()
    }

    /// Looks up a sink.
    pub fn sink(&self, name: &str) -> Option<&SinkConfig> {
        self.sinks.get(name)
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

    /// Adds a sink from its statement.
    pub fn add_sink(&mut self, create: &CreateSink, base_dir: &Path) -> Result<()> {
        if self.sinks.contains_key(&create.name) {
            return Err(Error::Plan(format!(
                "sink '{}' already exists",
                create.name
            )));
        }
        let config = SinkConfig::from_options(&create.name, &create.options, base_dir)?;
        self.sinks.insert(create.name.clone(), config);
        Ok(())
    }
}

/// `WITH` option about event time rather than the connector: how long a
/// fired window still takes rows.
pub const ALLOWED_LATENESS: &str = "allowed_lateness";
/// `WITH` option about event time rather than the connector: when an input
/// counts as idle.
pub const IDLE_TIMEOUT: &str = "idle_timeout";

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
        let data_type = arrow_type(&column.data_type).ok_or_else(|| {
            Error::Plan(format!(
                "stream '{}': column '{}' has unsupported type {} (use TIMESTAMP, TEXT, DOUBLE, BIGINT or BOOLEAN)",
                create.name, column.name, column.data_type
            ))
        })?;
        fields.push(Field::new(&column.name, data_type, true));
    }
    let schema = Arc::new(Schema::new(fields));
    let event_time = event_time_column(create, &schema)?;
    let connector_options: Vec<(String, String)> = create
        .options
        .iter()
        .filter(|(k, _)| k != ALLOWED_LATENESS && k != IDLE_TIMEOUT)
        .cloned()
        .collect();
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

/// Maps a declared SQL type onto the Arrow type vigil stores it as.
pub fn arrow_type(sql: &SqlType) -> Option<DataType> {
    let name = sql.to_string().to_ascii_uppercase();
    let base = name.split('(').next().unwrap_or("").trim();
    Some(match base {
        "TIMESTAMP" | "DATETIME" => TIME_TYPE,
        "TEXT" | "VARCHAR" | "STRING" | "CHAR" | "CHARACTER VARYING" => DataType::Utf8,
        "DOUBLE" | "DOUBLE PRECISION" | "FLOAT" | "FLOAT8" | "REAL" | "FLOAT4" => DataType::Float64,
        "BIGINT" | "INT" | "INTEGER" | "SMALLINT" | "INT8" | "INT4" => DataType::Int64,
        "BOOLEAN" | "BOOL" => DataType::Boolean,
        _ => return None,
    })
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
