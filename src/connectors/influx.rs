//! The `influx` source: InfluxDB line protocol posted to `vigil serve`'s
//! `POST /api/v2/write` or `POST /write` (InfluxDB 1.x), as Telegraf's
//! `outputs.influxdb_v2` and `outputs.influxdb` send it. Lines are parsed
//! with the `influxdb-line-protocol` crate.
//!
//! # Columns
//!
//! A stream declares its columns freely; each takes, by its name:
//!
//! - `ts` or `time` (TIMESTAMP): the line's timestamp in the request's
//!   precision (nanoseconds unless `precision` says otherwise), or the time
//!   the request arrived for a line without one;
//! - `measurement` (TEXT): the measurement;
//! - `tags` (`MAP<TEXT, TEXT>`): every tag of the line;
//! - any other name: the field of that name, else the tag of that name,
//!   else NULL. A field converts to the column's type: integers and floats
//!   to DOUBLE, integers (and floats without a fraction) to BIGINT,
//!   booleans to BOOLEAN, anything to TEXT (numbers as written); a tag
//!   parses as the column's type.
//!
//! A stream takes the lines of every measurement: `WHERE measurement =
//! 'cpu'` keeps one.
//!
//! # Bad lines
//!
//! A line that does not parse, or whose field or tag does not convert to
//! its column's type, is a bad row with its line number in the body; the
//! other lines are kept.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float64Builder, Int64Builder, StringBuilder,
    TimestampMillisecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use influxdb_line_protocol::{FieldValue, ParsedLine};

use super::common::push_config;
use super::options::Options;
use super::{BadRow, SourceConfig};
use crate::connector::{OptionSpec, SourceConnector, StreamDecl};
use crate::error::{Error, Result};
use crate::types::{LabelsBuilder, labels_type};

/// The unit of the lines' timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Nanoseconds (the default).
    Nanos,
    /// Microseconds.
    Micros,
    /// Milliseconds.
    Millis,
    /// Seconds.
    Seconds,
    /// Minutes (InfluxDB 1.x only).
    Minutes,
    /// Hours (InfluxDB 1.x only).
    Hours,
}

impl Precision {
    /// The `precision` query parameter of `/api/v2/write` (`ns`, `us`,
    /// `ms`, `s`) or of `/write` (those and `n`, `u`, `m`, `h`).
    pub fn parse(text: &str, v1: bool) -> Option<Precision> {
        Some(match text {
            "ns" => Precision::Nanos,
            "us" => Precision::Micros,
            "ms" => Precision::Millis,
            "s" => Precision::Seconds,
            "n" if v1 => Precision::Nanos,
            "u" if v1 => Precision::Micros,
            "m" if v1 => Precision::Minutes,
            "h" if v1 => Precision::Hours,
            _ => return None,
        })
    }

    /// `stamp` in this unit as epoch milliseconds, if in range.
    fn to_millis(self, stamp: i64) -> Option<i64> {
        match self {
            Precision::Nanos => Some(stamp.div_euclid(1_000_000)),
            Precision::Micros => Some(stamp.div_euclid(1_000)),
            Precision::Millis => Some(stamp),
            Precision::Seconds => stamp.checked_mul(1_000),
            Precision::Minutes => stamp.checked_mul(60_000),
            Precision::Hours => stamp.checked_mul(3_600_000),
        }
    }
}

/// What a declared column takes from a line.
#[derive(Debug, Clone, PartialEq)]
enum Role {
    Time,
    Measurement,
    Tags,
    /// The field, else the tag, of this name.
    Value(String),
}

/// The roles of a stream's declared columns; an error when a column of a
/// reserved name has the wrong type.
fn roles(stream: &str, schema: &SchemaRef) -> Result<Vec<Role>> {
    let mut time_taken = false;
    schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name().as_str();
            let ty = field.data_type();
            let role = match name.to_ascii_lowercase().as_str() {
                "ts" | "time" if !time_taken && matches!(ty, DataType::Timestamp(..)) => {
                    time_taken = true;
                    Role::Time
                }
                "measurement" => Role::Measurement,
                "tags" => Role::Tags,
                _ => Role::Value(name.to_string()),
            };
            check_type(stream, field, &role)?;
            Ok(role)
        })
        .collect()
}

fn check_type(stream: &str, field: &Field, role: &Role) -> Result<()> {
    let ty = field.data_type();
    let wanted = match role {
        Role::Measurement if *ty != DataType::Utf8 => "TEXT",
        Role::Tags if *ty != labels_type() => "MAP<TEXT, TEXT>",
        Role::Value(_)
            if !matches!(
                ty,
                DataType::Utf8
                    | DataType::Float64
                    | DataType::Int64
                    | DataType::Boolean
                    | DataType::Timestamp(..)
            ) =>
        {
            "TEXT, DOUBLE, BIGINT, BOOLEAN or TIMESTAMP"
        }
        _ => return Ok(()),
    };
    Err(Error::Plan(format!(
        "stream {stream}: column '{}' of connector 'influx' must be {wanted}",
        field.name()
    )))
}

/// Checks a stream's declared columns for connector `influx`.
pub fn check_columns(stream: &str, schema: &SchemaRef) -> Result<()> {
    roles(stream, schema).map(|_| ())
}

/// One value of a row, before it is appended.
enum Cell<'a> {
    Null,
    Float(f64),
    Int(i64),
    Bool(bool),
    Text(std::borrow::Cow<'a, str>),
    Tags,
}

/// What a request came to as rows of one stream.
#[derive(Debug)]
pub struct Decoded {
    /// The rows, with the stream's columns.
    pub batch: RecordBatch,
    /// One per bad line.
    pub bad: Vec<BadRow>,
}

/// The rows of `text` for a stream of `schema`; `now_ms` stamps lines
/// without a timestamp.
pub fn lines_batch(
    stream: &str,
    schema: &SchemaRef,
    text: &str,
    precision: Precision,
    now_ms: i64,
) -> Result<Decoded> {
    let roles = roles(stream, schema)?;
    let mut columns: Vec<Builder> = schema.fields().iter().map(|f| Builder::new(f)).collect();
    let mut bad = Vec::new();
    for (number, line) in numbered_lines(text) {
        let parsed = match influxdb_line_protocol::parse_lines(line).next() {
            None => continue,
            Some(Ok(parsed)) => parsed,
            Some(Err(e)) => {
                bad.push(BadRow {
                    line: number,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let mut cells: Vec<Cell<'_>> = Vec::with_capacity(roles.len());
        let outcome = roles
            .iter()
            .zip(schema.fields())
            .try_for_each(|(role, field)| {
                cells.push(cell(&parsed, role, field, precision, now_ms)?);
                Ok::<_, String>(())
            });
        if let Err(reason) = outcome {
            bad.push(BadRow {
                line: number,
                reason,
            });
            continue;
        }
        for (builder, cell) in columns.iter_mut().zip(cells) {
            builder.append(cell, &parsed);
        }
    }
    let arrays: Vec<ArrayRef> = columns.into_iter().map(Builder::finish).collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays)?;
    Ok(Decoded { batch, bad })
}

/// The lines of `text` as the line protocol splits them (a newline inside
/// a quoted string field does not end a line), each with its 1-based
/// number in `text`.
fn numbered_lines(text: &str) -> impl Iterator<Item = (u64, &str)> {
    let base = text.as_ptr() as usize;
    let mut counted_to = 0;
    let mut number = 1u64;
    influxdb_line_protocol::split_lines(text).map(move |line| {
        let start = line.as_ptr() as usize - base;
        number += memchr::memchr_iter(b'\n', &text.as_bytes()[counted_to..start]).count() as u64;
        counted_to = start;
        (number, line)
    })
}

/// The value of one column for one line, or why the line is bad.
fn cell<'a>(
    line: &'a ParsedLine<'_>,
    role: &Role,
    field: &Field,
    precision: Precision,
    now_ms: i64,
) -> std::result::Result<Cell<'a>, String> {
    let name = match role {
        Role::Time => {
            return match line.timestamp {
                None => Ok(Cell::Int(now_ms)),
                Some(stamp) => precision
                    .to_millis(stamp)
                    .map(Cell::Int)
                    .ok_or_else(|| format!("timestamp {stamp} is out of range")),
            };
        }
        Role::Measurement => return Ok(Cell::Text(line.series.measurement.as_str().into())),
        Role::Tags => return Ok(Cell::Tags),
        Role::Value(name) => name,
    };
    let ty = field.data_type();
    if let Some(value) = line.field_value(name) {
        return field_cell(value, ty).ok_or_else(|| {
            format!(
                "field {name} = {value} does not fit column {name} {}",
                sql_type(ty)
            )
        });
    }
    let Some(tag) = line.tag_value(name) else {
        return Ok(Cell::Null);
    };
    let tag = tag.as_str();
    let parsed = match ty {
        DataType::Utf8 => Some(Cell::Text(tag.to_string().into())),
        DataType::Float64 => tag.parse().ok().map(Cell::Float),
        DataType::Int64 | DataType::Timestamp(..) => tag.parse().ok().map(Cell::Int),
        DataType::Boolean => tag.parse().ok().map(Cell::Bool),
        _ => None,
    };
    parsed.ok_or_else(|| {
        format!(
            "tag {name}={tag} does not fit column {name} {}",
            sql_type(ty)
        )
    })
}

/// A field value as a cell of type `ty`, if it converts.
fn field_cell<'a>(value: &'a FieldValue<'_>, ty: &DataType) -> Option<Cell<'a>> {
    use FieldValue as F;
    Some(match (ty, value) {
        (DataType::Float64, F::F64(v)) => Cell::Float(*v),
        (DataType::Float64, F::I64(v)) => Cell::Float(*v as f64),
        (DataType::Float64, F::U64(v)) => Cell::Float(*v as f64),
        (DataType::Int64 | DataType::Timestamp(..), F::I64(v)) => Cell::Int(*v),
        (DataType::Int64 | DataType::Timestamp(..), F::U64(v)) => {
            Cell::Int(i64::try_from(*v).ok()?)
        }
        (DataType::Int64 | DataType::Timestamp(..), F::F64(v))
            if v.fract() == 0.0 && v.abs() < 9.2e18 =>
        {
            Cell::Int(*v as i64)
        }
        (DataType::Boolean, F::Boolean(b)) => Cell::Bool(*b),
        (DataType::Utf8, F::String(s)) => Cell::Text(s.as_str().to_string().into()),
        (DataType::Utf8, other) => Cell::Text(other.to_string().into()),
        _ => return None,
    })
}

fn sql_type(ty: &DataType) -> &'static str {
    match ty {
        DataType::Utf8 => "TEXT",
        DataType::Float64 => "DOUBLE",
        DataType::Int64 => "BIGINT",
        DataType::Boolean => "BOOLEAN",
        DataType::Timestamp(..) => "TIMESTAMP",
        _ => "MAP<TEXT, TEXT>",
    }
}

/// Builds one column.
enum Builder {
    Text(StringBuilder),
    Float(Float64Builder),
    Int(Int64Builder),
    Bool(BooleanBuilder),
    Time(TimestampMillisecondBuilder),
    /// Boxed: a map builder is several times larger than the others.
    Tags(Box<LabelsBuilder>),
}

impl Builder {
    fn new(field: &Field) -> Builder {
        match field.data_type() {
            DataType::Float64 => Builder::Float(Float64Builder::new()),
            DataType::Int64 => Builder::Int(Int64Builder::new()),
            DataType::Boolean => Builder::Bool(BooleanBuilder::new()),
            DataType::Timestamp(..) => Builder::Time(TimestampMillisecondBuilder::new()),
            DataType::Map(..) => Builder::Tags(Box::default()),
            _ => Builder::Text(StringBuilder::new()),
        }
    }

    /// Appends `cell`, which [`cell`] made for this column's type.
    fn append(&mut self, cell: Cell<'_>, line: &ParsedLine<'_>) {
        match (self, cell) {
            (Builder::Tags(b), _) => b.append(
                line.series
                    .tag_set
                    .iter()
                    .flatten()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            ),
            (Builder::Text(b), Cell::Text(t)) => b.append_value(t),
            (Builder::Float(b), Cell::Float(v)) => b.append_value(v),
            (Builder::Int(b), Cell::Int(v)) => b.append_value(v),
            (Builder::Time(b), Cell::Int(v)) => b.append_value(v),
            (Builder::Bool(b), Cell::Bool(v)) => b.append_value(v),
            (Builder::Text(b), _) => b.append_null(),
            (Builder::Float(b), _) => b.append_null(),
            (Builder::Int(b), _) => b.append_null(),
            (Builder::Time(b), _) => b.append_null(),
            (Builder::Bool(b), _) => b.append_null(),
        }
    }

    fn finish(self) -> ArrayRef {
        match self {
            Builder::Text(mut b) => Arc::new(b.finish()),
            Builder::Float(mut b) => Arc::new(b.finish()),
            Builder::Int(mut b) => Arc::new(b.finish()),
            Builder::Bool(mut b) => Arc::new(b.finish()),
            Builder::Time(mut b) => Arc::new(b.finish()),
            Builder::Tags(b) => Arc::new(b.finish()),
        }
    }
}

/// `connector = 'influx'` in `CREATE STREAM`.
pub struct InfluxSource;

impl SourceConnector for InfluxSource {
    fn name(&self) -> &'static str {
        "influx"
    }
    fn summary(&self) -> &'static str {
        "InfluxDB line protocol posted to `vigil serve` (POST /api/v2/write, /write)"
    }
    fn options(&self) -> &'static [OptionSpec] {
        &[]
    }
    fn configure(&self, decl: &StreamDecl<'_>, _: &Options<'_>) -> Result<SourceConfig> {
        check_columns(decl.stream, &decl.schema)?;
        Ok(push_config(decl, "influx"))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float64Type, Int64Type, Schema, TimeUnit};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), true),
            Field::new("measurement", DataType::Utf8, true),
            Field::new("host", DataType::Utf8, true),
            Field::new("tags", labels_type(), true),
            Field::new("usage_idle", DataType::Float64, true),
            Field::new("uptime", DataType::Int64, true),
        ]))
    }

    #[test]
    fn telegraf_lines_become_rows_and_bad_lines_are_numbered() {
        let text = "cpu,cpu=cpu0,host=h usage_idle=98.5,usage_user=1.2 1700000000000000000\n\
                    # a comment\n\
                    this is not line protocol\n\
                    system,host=h uptime=3600i,load1=0.5 1700000001000000000\n\
                    cpu,host=h usage_idle=\"idle\" 1700000002000000000\n\
                    mem,host=h used=5i\n";
        let d = lines_batch("s", &schema(), text, Precision::Nanos, 42).unwrap();
        assert_eq!(d.batch.num_rows(), 3, "{:?}", d.bad);
        assert_eq!(d.bad.len(), 2);
        assert_eq!(d.bad[0].line, 3);
        assert_eq!(d.bad[1].line, 5);
        assert!(
            d.bad[1]
                .reason
                .contains("does not fit column usage_idle DOUBLE"),
            "{:?}",
            d.bad
        );
        let b = &d.batch;
        let ts = b
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>();
        assert_eq!(ts.values(), &[1_700_000_000_000, 1_700_000_001_000, 42]);
        assert_eq!(b.column(1).as_string::<i32>().value(1), "system");
        assert_eq!(b.column(2).as_string::<i32>().value(0), "h");
        let tags = b.column(3).as_map();
        assert_eq!(tags.value_length(0), 2);
        let idle = b.column(4).as_primitive::<Float64Type>();
        assert_eq!(idle.value(0), 98.5);
        assert!(idle.is_null(1));
        assert_eq!(b.column(5).as_primitive::<Int64Type>().value(1), 3600);
    }

    #[test]
    fn precisions_and_reserved_columns() {
        let d = lines_batch("s", &schema(), "m f=1 1700000000", Precision::Seconds, 0).unwrap();
        let ts = d
            .batch
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMillisecondType>();
        assert_eq!(ts.value(0), 1_700_000_000_000);
        assert_eq!(Precision::parse("h", true), Some(Precision::Hours));
        assert_eq!(Precision::parse("h", false), None);
        let bad = Arc::new(Schema::new(vec![Field::new("tags", DataType::Utf8, true)]));
        let e = check_columns("s", &bad).unwrap_err().to_string();
        assert!(e.contains("must be MAP<TEXT, TEXT>"), "{e}");
    }
}
