//! Writing result batches as aligned tables, CSV or JSON lines.
//!
//! Every format prints timestamps as `1970-01-01T00:00:10` (UTC, no zone),
//! with a `.250`-style fraction only when the milliseconds are non-zero (see
//! [`format_timestamp_ms`](crate::timestamp::format_timestamp_ms)). CSV writes
//! one header line before the first row (nothing at all if no row ever
//! comes), NULL as an empty field and floats in shortest round-trip form
//! (`1.5`, `2.0`). JSONL writes one object per row with every column present
//! (NULL as `null`). Output is flushed after every batch so results appear
//! as they fire.
//!
//! # Checkpoints
//!
//! File sinks are exactly-once, by truncating to the committed length on
//! restore: [`Sink::checkpoint`] fsyncs the file and commits
//! `{"path": ..., "length": <bytes durable>, "format": {...}}` (the format's
//! state, for CSV `{"header_written": ...}`); [`Sink::restore`] cuts the
//! file back to `length`, brings the format's state back and appends after
//! it. A file is therefore not truncated when it is opened but when it is
//! first written (or checkpointed, or finished) without a restore before.
//! Queries sharing a file commit together; see
//! [`file_commit`](super::file_commit) for how and for the details. Stdout
//! is at-least-once: it commits nothing.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, StringArray, StringBuilder};
use datafusion::arrow::datatypes::{
    DataType, Field, FieldRef, Schema, SchemaRef, TimeUnit, TimestampMicrosecondType,
    TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::json::writer::{
    Encoder, EncoderFactory, EncoderOptions, JsonFormat, LineDelimited, NullableEncoder,
    make_encoder,
};
use datafusion::arrow::record_batch::RecordBatch;

use serde_json::Value;

use super::file_commit::{CommittedFile, FileWriter};
use super::table::Table;
use super::{OutputFormat, Sink, SinkCommit, SinkConfig, SinkTarget};
use crate::error::{Error, Result};
use crate::timestamp::write_timestamp_ms;

/// Creates a sink writing `format` to `out`.
pub fn make_sink(format: OutputFormat, out: Box<dyn Write + Send>) -> Box<dyn Sink> {
    make_sink_to(format, None, Box::new(WriterDestination(out)))
}

/// Creates a sink like [`make_sink`] that marks every row with the query
/// it comes from, for an output several queries share: CSV and JSONL get a
/// leading column `query` holding `query` (CSV writes its header, with
/// that column, together with the query's first rows), a table gets a line
/// `-- QUERY` above it.
pub fn make_labelled_sink(
    format: OutputFormat,
    query: &str,
    out: Box<dyn Write + Send>,
) -> Box<dyn Sink> {
    make_sink_to(format, Some(query), Box::new(WriterDestination(out)))
}

/// Creates a sink writing `format` to `out`, its rows marked with `label`
/// as [`make_labelled_sink`] does when there is one. It checkpoints and
/// restores when `out` does.
pub fn make_sink_to(
    format: OutputFormat,
    label: Option<&str>,
    out: Box<dyn Destination>,
) -> Box<dyn Sink> {
    Box::new(FormatSink {
        format: make_format(format, label),
        out,
        buf: Vec::new(),
    })
}

/// Where a sink's rendered bytes go.
pub trait Destination: Send {
    /// Writes one rendered batch whole and flushes it.
    fn send(&mut self, bytes: &[u8]) -> Result<()>;

    /// The writer is done; see [`Sink::finish`].
    fn finish(&mut self) -> Result<()>;

    /// See [`Sink::checkpoint`]; `None`, the default, for a destination
    /// that cannot go back.
    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        Ok(None)
    }

    /// See [`Sink::restore`].
    fn restore(&mut self, _commit: &SinkCommit) -> Result<()> {
        Ok(())
    }
}

/// A plain writer (stdout, a pipe): written and flushed, never rewound.
struct WriterDestination(Box<dyn Write + Send>);

impl Destination for WriterDestination {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.0
            .write_all(bytes)
            .and_then(|()| self.0.flush())
            .map_err(|e| Error::io("writing results", e))
    }

    fn finish(&mut self) -> Result<()> {
        self.0.flush().map_err(|e| Error::io("writing results", e))
    }
}

impl Destination for FileWriter {
    fn send(&mut self, bytes: &[u8]) -> Result<()> {
        FileWriter::send(self, bytes)
    }

    fn finish(&mut self) -> Result<()> {
        FileWriter::finish(self)
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        FileWriter::checkpoint(self).map(Some)
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        FileWriter::restore(self, commit).map(|_| ())
    }
}

/// A format's renderer and a destination of its own.
struct FormatSink {
    format: Box<dyn Format>,
    out: Box<dyn Destination>,
    /// Reused for every batch.
    buf: Vec<u8>,
}

impl Sink for FormatSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.buf.clear();
        self.format.render(batch, &mut self.buf)?;
        self.out.send(&self.buf)
    }

    fn finish(&mut self) -> Result<()> {
        self.buf.clear();
        self.format.finish(&mut self.buf);
        if !self.buf.is_empty() {
            self.out.send(&self.buf)?;
        }
        self.out.finish()
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        // The format's state cannot change before the commit is known:
        // this writer writes nothing until checkpoint returns.
        let state = self.format.state();
        Ok(self.out.checkpoint()?.map(|mut commit| {
            if let Some(state) = state {
                commit["format"] = state;
            }
            commit
        }))
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        self.out.restore(commit)?;
        self.format.restore(commit.get("format"))
    }
}

/// Opens the destination of a `CREATE SINK` for a query whose result rows
/// have `schema`, and returns a sink for its format: a webhook gets its
/// own delivery thread, stdout is shared as is, and a file is opened by
/// the first query that opens it (and emptied when first written, unless
/// a restore comes first: see [`file_commit`](super::file_commit)). A
/// query opening a file that another query of this process still writes
/// shares that writer instead; it must write the same columns (names, in
/// order) in the same format, or this is an error naming the sink and both
/// sets of columns.
pub fn open_sink(config: &SinkConfig, schema: &SchemaRef) -> Result<Box<dyn Sink>> {
    let out: Box<dyn Write + Send> = match &config.target {
        SinkTarget::Connector(opener) => return opener.0.open(&config.name, schema),
        SinkTarget::Stdout => Box::new(io::stdout()),
        SinkTarget::File(path) => return open_shared_file(config, path, schema),
    };
    Ok(make_sink(config.format, out))
}

/// The files open for writing in this process, by absolute path. Entries
/// die with the last query writing to them.
static OPEN_FILES: Mutex<BTreeMap<PathBuf, Weak<SharedFile>>> = Mutex::new(BTreeMap::new());

/// One file that several queries write to, in one format: a CSV header is
/// written once, by whichever query writes first.
struct SharedFile {
    /// The sink that opened it, for messages.
    sink: String,
    format: OutputFormat,
    /// The column names every writer must have.
    columns: Vec<String>,
    file: Arc<CommittedFile>,
    renderer: Mutex<Renderer>,
}

/// The shared format and its reusable buffer.
struct Renderer {
    format: Box<dyn Format>,
    buf: Vec<u8>,
}

/// One query's handle on a [`SharedFile`].
struct SharedFileSink {
    shared: Arc<SharedFile>,
    out: FileWriter,
}

impl Sink for SharedFileSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        // The lock is held for the whole batch: its rows are one write,
        // and the format state recorded is the one after them.
        let mut renderer = self
            .shared
            .renderer
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Renderer { format, buf } = &mut *renderer;
        buf.clear();
        format.render(batch, buf)?;
        self.out.send_with_state(buf, format.state())
    }

    fn finish(&mut self) -> Result<()> {
        self.out.finish()
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.out.checkpoint().map(Some)
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        if self.out.restore(commit)? {
            let mut renderer = self
                .shared
                .renderer
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            renderer.format.restore(commit.get("format"))?;
        }
        Ok(())
    }
}

fn open_shared_file(config: &SinkConfig, path: &Path, schema: &SchemaRef) -> Result<Box<dyn Sink>> {
    let key = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let columns = column_names(schema);
    let mut open = OPEN_FILES.lock().unwrap_or_else(|e| e.into_inner());
    open.retain(|_, file| file.strong_count() > 0);
    if let Some(shared) = open.get(&key).and_then(Weak::upgrade) {
        if shared.format != config.format {
            return Err(Error::Plan(format!(
                "sink '{}' writes {} as {}, but sink '{}' already writes it as {}",
                config.name,
                path.display(),
                format_name(config.format),
                shared.sink,
                format_name(shared.format)
            )));
        }
        check_same_columns(&config.name, path, &shared.columns, &columns)?;
        let out = shared.file.writer();
        return Ok(Box::new(SharedFileSink { shared, out }));
    }
    let file = CommittedFile::open(path)?;
    let format = make_format(config.format, None);
    file.set_format(format.state());
    let shared = Arc::new(SharedFile {
        sink: config.name.clone(),
        format: config.format,
        columns,
        renderer: Mutex::new(Renderer {
            format,
            buf: Vec::new(),
        }),
        file,
    });
    open.insert(key, Arc::downgrade(&shared));
    let out = shared.file.writer();
    Ok(Box::new(SharedFileSink { shared, out }))
}

/// The column names of `schema`, in order.
pub fn column_names(schema: &Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}

/// The error for two queries writing different columns to sink `sink`
/// (file `path`): `first` is what the file already receives.
pub fn check_same_columns(
    sink: &str,
    path: &Path,
    first: &[String],
    other: &[String],
) -> Result<()> {
    if first == other {
        return Ok(());
    }
    // `./out.csv` is shown as the script wrote it: `out.csv`.
    let shown = path.strip_prefix(".").unwrap_or(path);
    Err(Error::Plan(format!(
        "sink '{sink}': the queries writing to {} must write the same columns, but one writes ({}) and another ({})",
        shown.display(),
        first.join(", "),
        other.join(", ")
    )))
}

fn format_name(format: OutputFormat) -> &'static str {
    match format {
        OutputFormat::Table => "table",
        OutputFormat::Csv => "csv",
        OutputFormat::Jsonl => "jsonl",
    }
}

/// `batch` with a leading column `query` holding `label` on every row.
fn with_query_column(batch: &RecordBatch, label: &str) -> Result<RecordBatch> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(schema.fields().len() + 1);
    fields.push(Arc::new(Field::new("query", DataType::Utf8, false)));
    fields.extend(schema.fields().iter().cloned());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.len());
    columns.push(Arc::new(StringArray::from(vec![label; batch.num_rows()])));
    columns.extend(batch.columns().iter().cloned());
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `batch`, with its query column when it has a label.
fn labelled(batch: &RecordBatch, label: Option<&str>) -> Result<RecordBatch> {
    match label {
        Some(label) => with_query_column(batch, label),
        None => Ok(batch.clone()),
    }
}

/// Renders batches in one output format.
trait Format: Send {
    /// Appends `batch` (not empty) to `buf`.
    fn render(&mut self, batch: &RecordBatch, buf: &mut Vec<u8>) -> Result<()>;

    /// What a restore must bring back for the output to go on identically;
    /// `None` when nothing.
    fn state(&self) -> Option<Value> {
        None
    }

    /// Brings back what [`state`](Format::state) returned (`None`: the
    /// commit had none).
    fn restore(&mut self, _state: Option<&Value>) -> Result<()> {
        Ok(())
    }

    /// Appends what ends the output once the query has ended (a table's
    /// closing border).
    fn finish(&mut self, _buf: &mut Vec<u8>) {}
}

fn make_format(format: OutputFormat, label: Option<&str>) -> Box<dyn Format> {
    let label = label.map(str::to_string);
    match format {
        OutputFormat::Table => Box::new(TableFormat {
            label,
            table: None,
            widths: None,
        }),
        OutputFormat::Csv => Box::new(CsvFormat {
            label,
            header_written: false,
        }),
        OutputFormat::Jsonl => Box::new(JsonlFormat { label }),
    }
}

/// One table per query that grows as its rows come (see [`Table`]):
/// the header once, numbers rounded as the shell shows them.
struct TableFormat {
    /// The query's name, written above each of its tables.
    label: Option<String>,
    /// Made at the first batch, from its schema.
    table: Option<Table>,
    /// The widths of a table to continue, from a restore.
    widths: Option<Vec<usize>>,
}

impl Format for TableFormat {
    fn render(&mut self, batch: &RecordBatch, buf: &mut Vec<u8>) -> Result<()> {
        let batch = nested_as_text(&timestamps_as_text(batch)?)?;
        let table = self.table.get_or_insert_with(|| {
            let mut table = Table::new(&batch.schema());
            table.continue_with(self.widths.take().unwrap_or_default());
            table
        });
        table.push(&batch)?;
        let text = table.flush();
        // Rows that continue the table start with `|`; a new table (the
        // first, or one with wider columns) with a border.
        if let (Some(label), true) = (&self.label, text.starts_with('+')) {
            writeln!(buf, "-- {label}").expect("writing to a Vec cannot fail");
        }
        buf.extend_from_slice(text.as_bytes());
        Ok(())
    }

    fn state(&self) -> Option<Value> {
        let widths = self.table.as_ref().map(|t| t.widths().to_vec());
        Some(serde_json::json!({ "widths": widths.or_else(|| self.widths.clone()) }))
    }

    fn restore(&mut self, state: Option<&Value>) -> Result<()> {
        let widths = state
            .and_then(|s| s.get("widths"))
            .and_then(Value::as_array)
            .map(|w| {
                w.iter()
                    .filter_map(Value::as_u64)
                    .map(|w| w as usize)
                    .collect()
            });
        self.table = None;
        self.widths = widths;
        Ok(())
    }

    fn finish(&mut self, buf: &mut Vec<u8>) {
        if let Some(table) = &mut self.table {
            buf.extend_from_slice(table.finish().as_bytes());
        }
    }
}

struct CsvFormat {
    /// The query's name, written as a leading `query` column.
    label: Option<String>,
    header_written: bool,
}

impl Format for CsvFormat {
    fn render(&mut self, batch: &RecordBatch, buf: &mut Vec<u8>) -> Result<()> {
        let batch = timestamps_as_text(&labelled(batch, self.label.as_deref())?)?;
        let batch = nested_as_text(&batch)?;
        let mut writer = datafusion::arrow::csv::WriterBuilder::new()
            .with_header(!self.header_written)
            .build(std::mem::take(buf));
        writer.write(&batch)?;
        *buf = writer.into_inner();
        self.header_written = true;
        Ok(())
    }

    fn state(&self) -> Option<Value> {
        Some(serde_json::json!({ "header_written": self.header_written }))
    }

    fn restore(&mut self, state: Option<&Value>) -> Result<()> {
        self.header_written = state
            .and_then(|s| s.get("header_written"))
            .and_then(Value::as_bool)
            .ok_or_else(|| {
                Error::Connector(format!(
                    "cannot restore a CSV sink: the checkpoint does not say whether the header \
                     was written ({})",
                    state.unwrap_or(&Value::Null)
                ))
            })?;
        Ok(())
    }
}

struct JsonlFormat {
    /// The query's name, written as a leading `query` field.
    label: Option<String>,
}

impl Format for JsonlFormat {
    fn render(&mut self, batch: &RecordBatch, buf: &mut Vec<u8>) -> Result<()> {
        let batch = labelled(batch, self.label.as_deref())?;
        *buf = write_json_rows::<LineDelimited>(&batch, std::mem::take(buf))?;
        Ok(())
    }
}

/// Appends `batch`'s rows to `buf` as JSON objects, every column present
/// (NULL as `null`), timestamps as text and nested values (struct, list,
/// map) as nested JSON: one object a line with
/// [`LineDelimited`], one JSON array with
/// [`JsonArray`](datafusion::arrow::json::writer::JsonArray). Shared by the
/// JSONL and webhook sinks so that both render a row the same way.
pub(crate) fn write_json_rows<F: JsonFormat>(batch: &RecordBatch, buf: Vec<u8>) -> Result<Vec<u8>> {
    let batch = timestamps_as_text(batch)?;
    let mut writer = datafusion::arrow::json::WriterBuilder::new()
        .with_explicit_nulls(true)
        .with_timestamp_format(NESTED_TIMESTAMP_FORMAT.into())
        .with_encoder_factory(Arc::new(UnionAsJson))
        .build::<_, F>(buf);
    writer.write(&batch)?;
    writer.finish()?;
    Ok(writer.into_inner())
}

/// Every row of `batch` rendered on its own, as `format` writes rows
/// (JSON objects or CSV records without a header, no trailing newline):
/// the values of one message per row.
pub fn render_rows(format: OutputFormat, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    match format {
        OutputFormat::Csv => {
            let batch = nested_as_text(&timestamps_as_text(batch)?)?;
            (0..batch.num_rows())
                .map(|i| {
                    let mut writer = datafusion::arrow::csv::WriterBuilder::new()
                        .with_header(false)
                        .build(Vec::new());
                    writer.write(&batch.slice(i, 1))?;
                    let mut row = writer.into_inner();
                    while matches!(row.last(), Some(b'\n' | b'\r')) {
                        row.pop();
                    }
                    Ok(row)
                })
                .collect()
        }
        _ => {
            // A JSON object never holds a raw newline: one line a row.
            let lines = write_json_rows::<LineDelimited>(batch, Vec::new())?;
            Ok(lines
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec)
                .collect())
        }
    }
}

/// Replaces every timestamp column by its text form, so all formats print
/// timestamps the same way. Other columns are shared, not copied.
fn timestamps_as_text(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| matches!(f.data_type(), DataType::Timestamp(..)))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        match field.data_type() {
            DataType::Timestamp(unit, _) => {
                fields.push(Arc::new(
                    Field::new(field.name(), DataType::Utf8, field.is_nullable())
                        .with_metadata(field.metadata().clone()),
                ));
                columns.push(format_timestamps(column, *unit));
            }
            _ => {
                fields.push(field.clone());
                columns.push(column.clone());
            }
        }
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// How a timestamp inside a nested value is written: as
/// [`format_timestamps`] writes a timestamp column (fractions only when
/// there are some).
const NESTED_TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.f";

/// Replaces every nested column (struct, list, map, union) by the JSON text
/// of its values, for the formats whose cells are text (CSV, table). Other
/// columns are shared, not copied.
fn nested_as_text(batch: &RecordBatch) -> Result<RecordBatch> {
    let nested = |t: &DataType| {
        matches!(
            t,
            DataType::Struct(_)
                | DataType::List(_)
                | DataType::LargeList(_)
                | DataType::FixedSizeList(..)
                | DataType::Map(..)
                | DataType::Union(..)
        )
    };
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| nested(f.data_type())) {
        return Ok(batch.clone());
    }
    let options = EncoderOptions::default()
        .with_explicit_nulls(true)
        .with_timestamp_format(NESTED_TIMESTAMP_FORMAT.into())
        .with_encoder_factory(Arc::new(UnionAsJson));
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if !nested(field.data_type()) {
            fields.push(field.clone());
            columns.push(column.clone());
            continue;
        }
        let mut encoder = make_encoder(field, column.as_ref(), &options)?;
        let mut out = StringBuilder::with_capacity(column.len(), column.len() * 16);
        let mut text = Vec::new();
        for i in 0..column.len() {
            if encoder.is_null(i) {
                out.append_null();
                continue;
            }
            text.clear();
            encoder.encode(i, &mut text);
            out.append_value(String::from_utf8_lossy(&text));
        }
        fields.push(Arc::new(
            Field::new(field.name(), DataType::Utf8, field.is_nullable())
                .with_metadata(field.metadata().clone()),
        ));
        columns.push(Arc::new(out.finish()) as ArrayRef);
    }
    let schema = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Writes a union value (such as the JSON values of `json_get` and `->`) as
/// the value of its variant; a text variant marked as JSON
/// (datafusion-functions-json's arrays and objects) as that JSON itself.
#[derive(Debug)]
struct UnionAsJson;

impl EncoderFactory for UnionAsJson {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a FieldRef,
        array: &'a dyn Array,
        options: &'a EncoderOptions,
    ) -> std::result::Result<Option<NullableEncoder<'a>>, ArrowError> {
        let DataType::Union(fields, _) = array.data_type() else {
            return Ok(None);
        };
        let union = array.as_union();
        let mut variants = Vec::with_capacity(fields.len());
        for (type_id, field) in fields.iter() {
            let child = union.child(type_id);
            let json_text = field.metadata().get("is_json").is_some_and(|v| v == "true");
            let encoder = match (json_text, field.data_type()) {
                (_, DataType::Null) => None,
                (true, DataType::Utf8) => None,
                _ => Some(make_encoder(field, child.as_ref(), options)?),
            };
            variants.push((type_id, json_text, child, encoder));
        }
        let encoder = UnionEncoder { union, variants };
        Ok(Some(NullableEncoder::new(
            Box::new(encoder),
            array.logical_nulls(),
        )))
    }
}

/// A union variant: its type id, whether it is JSON text, its values and
/// their encoder (none for NULL and JSON text).
type Variant<'a> = (i8, bool, &'a ArrayRef, Option<NullableEncoder<'a>>);

struct UnionEncoder<'a> {
    union: &'a datafusion::arrow::array::UnionArray,
    variants: Vec<Variant<'a>>,
}

impl Encoder for UnionEncoder<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let type_id = self.union.type_id(idx);
        let offset = self.union.value_offset(idx);
        let Some((_, json_text, child, encoder)) =
            self.variants.iter_mut().find(|v| v.0 == type_id)
        else {
            out.extend_from_slice(b"null");
            return;
        };
        match encoder {
            _ if child.is_null(offset) => out.extend_from_slice(b"null"),
            Some(encoder) => encoder.encode(offset, out),
            None if *json_text => {
                out.extend_from_slice(child.as_string::<i32>().value(offset).as_bytes())
            }
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// Formats a timestamp column of any unit as text.
fn format_timestamps(column: &ArrayRef, unit: TimeUnit) -> ArrayRef {
    let len = column.len();
    let mut out = StringBuilder::with_capacity(len, len * 23);
    let mut text = String::with_capacity(32);
    // Each value as (milliseconds, remaining nanoseconds below a millisecond).
    let value = |i: usize| -> (i64, i64) {
        match unit {
            TimeUnit::Second => (
                column
                    .as_primitive::<TimestampSecondType>()
                    .value(i)
                    .saturating_mul(1000),
                0,
            ),
            TimeUnit::Millisecond => (
                column.as_primitive::<TimestampMillisecondType>().value(i),
                0,
            ),
            TimeUnit::Microsecond => {
                let v = column.as_primitive::<TimestampMicrosecondType>().value(i);
                (v.div_euclid(1000), v.rem_euclid(1000) * 1000)
            }
            TimeUnit::Nanosecond => {
                let v = column.as_primitive::<TimestampNanosecondType>().value(i);
                (v.div_euclid(1_000_000), v.rem_euclid(1_000_000))
            }
        }
    };
    for i in 0..len {
        if column.is_null(i) {
            out.append_null();
            continue;
        }
        text.clear();
        let (ms, sub_ms_nanos) = value(i);
        write_timestamp_ms(&mut text, ms);
        if sub_ms_nanos != 0 {
            // Sub-millisecond precision (only from non-millisecond columns):
            // keep it, as 6 or 9 fraction digits.
            let frac_ms = ms.rem_euclid(1000);
            if frac_ms == 0 {
                text.push_str(".000");
            }
            if sub_ms_nanos % 1000 == 0 {
                text.push_str(&format!("{:03}", sub_ms_nanos / 1000));
            } else {
                text.push_str(&format!("{sub_ms_nanos:06}"));
            }
        }
        out.append_value(&text);
    }
    Arc::new(out.finish())
}

#[cfg(test)]
mod tests;
