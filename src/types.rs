//! The Arrow types vigil stores column values as, shared by every layer
//! (declared columns, connectors' fixed columns, listings).
//!
//! A map column (`MAP<TEXT, T>`) is an Arrow map whose entries struct is
//! named `entries` with fields `key` (text, never null) and `value`: the
//! names Arrow's format specification and DataFusion's `map` function use,
//! so maps built by a connector, decoded from JSON or made in SQL compare
//! and combine alike.
//!
//! [`arrow_type`] and [`sql_name`] are the one mapping between the SQL
//! types a `CREATE STREAM` declares and the Arrow types vigil stores, used
//! by the planner, listings (`DESCRIBE`, `SHOW`) and messages.

use std::sync::Arc;

use datafusion::arrow::array::{MapArray, MapBuilder, MapFieldNames, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Fields, TimeUnit};
use datafusion::sql::sqlparser::ast::{ArrayElemTypeDef, DataType as SqlType};

/// The Arrow type of every event-time and window column.
pub const TIME_TYPE: DataType = DataType::Timestamp(TimeUnit::Millisecond, None);

/// The scalar SQL types a column can be declared with, for messages.
pub const SCALAR_TYPES: &str = "TIMESTAMP, TEXT, DOUBLE, BIGINT or BOOLEAN";

/// Maps a declared SQL type onto the Arrow type vigil stores it as:
/// `TIMESTAMP`, `TEXT`, `DOUBLE`, `BIGINT`, `BOOLEAN` (and their usual
/// synonyms), and, nested to any depth, `STRUCT<a T, ...>` (or
/// `ROW(a T, ...)`), `ARRAY<T>` (or `T[]`) and `MAP<TEXT, T>`. The error
/// says which part of the type is not supported.
pub fn arrow_type(sql: &SqlType) -> Result<DataType, String> {
    match sql {
        SqlType::Struct(fields, _) => {
            let mut arrow_fields = Vec::with_capacity(fields.len());
            for field in fields {
                let Some(name) = &field.field_name else {
                    return Err(format!("the fields of {sql} need names"));
                };
                let name = match name.quote_style {
                    Some(_) => name.value.clone(),
                    None => name.value.to_ascii_lowercase(),
                };
                if arrow_fields.iter().any(|f: &Field| f.name() == &name) {
                    return Err(format!("field '{name}' is declared twice in {sql}"));
                }
                arrow_fields.push(Field::new(name, arrow_type(&field.field_type)?, true));
            }
            if arrow_fields.is_empty() {
                return Err("a STRUCT needs at least one field".into());
            }
            Ok(DataType::Struct(Fields::from(arrow_fields)))
        }
        SqlType::Array(
            ArrayElemTypeDef::AngleBracket(item)
            | ArrayElemTypeDef::SquareBracket(item, None)
            | ArrayElemTypeDef::Parenthesis(item),
        ) => Ok(DataType::new_list(arrow_type(item)?, true)),
        SqlType::Array(_) => Err(format!(
            "unsupported type {sql} (an array is ARRAY<T> or T[], without a size)"
        )),
        SqlType::Map(key, value) => match arrow_type(key)? {
            DataType::Utf8 => Ok(map_of(arrow_type(value)?)),
            _ => Err(format!("unsupported map key type {key} (map keys are TEXT)")),
        },
        scalar => scalar_type(scalar).ok_or_else(|| {
            format!(
                "unsupported type {scalar} (use {SCALAR_TYPES}, or STRUCT<...>, ARRAY<T>, MAP<TEXT, T> of them)"
            )
        }),
    }
}

fn scalar_type(sql: &SqlType) -> Option<DataType> {
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

/// The SQL name of an Arrow type, as `CREATE STREAM` declares it where it
/// can (`MAP<TEXT, ARRAY<DOUBLE>>`), else Arrow's own name for it.
pub fn sql_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "TEXT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Float32 => "REAL".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::Int32 => "INT".into(),
        DataType::UInt64 => "BIGINT UNSIGNED".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::List(item) | DataType::LargeList(item) | DataType::FixedSizeList(item, _) => {
            format!("ARRAY<{}>", sql_name(item.data_type()))
        }
        DataType::Struct(fields) => {
            let fields: Vec<String> = fields
                .iter()
                .map(|f| format!("{} {}", field_name(f.name()), sql_name(f.data_type())))
                .collect();
            format!("STRUCT<{}>", fields.join(", "))
        }
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => format!(
                "MAP<{}, {}>",
                sql_name(kv[0].data_type()),
                sql_name(kv[1].data_type())
            ),
            other => format!("MAP<{}>", sql_name(other)),
        },
        DataType::Dictionary(_, value) => sql_name(value),
        other => other.to_string(),
    }
}

/// A struct field's name as SQL reads it back: plain when it is a plain
/// lower-case identifier, else double-quoted.
fn field_name(name: &str) -> String {
    let plain = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// The type of a map from text keys to `value` values.
pub fn map_of(value: DataType) -> DataType {
    let entries = Field::new(
        "entries",
        DataType::Struct(Fields::from(vec![
            Field::new("key", DataType::Utf8, false),
            Field::new("value", value, true),
        ])),
        false,
    );
    DataType::Map(Arc::new(entries), false)
}

/// The type of a set of labels (`MAP<TEXT, TEXT>`), as the Prometheus,
/// remote-write, OpenTelemetry and line-protocol sources produce them.
pub fn labels_type() -> DataType {
    map_of(DataType::Utf8)
}

/// Builds a column of [`labels_type`] one row at a time.
pub struct LabelsBuilder(MapBuilder<StringBuilder, StringBuilder>);

impl Default for LabelsBuilder {
    fn default() -> Self {
        let names = MapFieldNames {
            entry: "entries".into(),
            key: "key".into(),
            value: "value".into(),
        };
        LabelsBuilder(MapBuilder::new(
            Some(names),
            StringBuilder::new(),
            StringBuilder::new(),
        ))
    }
}

impl LabelsBuilder {
    /// Appends one row holding `labels` (in the order given).
    pub fn append<'a>(&mut self, labels: impl IntoIterator<Item = (&'a str, &'a str)>) {
        for (key, value) in labels {
            self.0.keys().append_value(key);
            self.0.values().append_value(value);
        }
        // Appending a valid entry list after pushing keys and values
        // cannot fail: the two builders always have the same length here.
        self.0
            .append(true)
            .expect("keys and values have the same length");
    }

    /// The rows appended so far, as one column.
    pub fn finish(mut self) -> MapArray {
        self.0.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, AsArray};

    #[test]
    fn labels_build_as_the_declared_type() {
        let mut b = LabelsBuilder::default();
        b.append([("job", "node"), ("instance", "127.0.0.1:9100")]);
        b.append([]);
        let labels = b.finish();
        assert_eq!(labels.data_type(), &labels_type());
        assert_eq!(labels.len(), 2);
        assert_eq!(labels.value_length(0), 2);
        assert_eq!(labels.value_length(1), 0);
        let first = labels.value(0);
        assert_eq!(
            first.column(1).as_string::<i32>().value(1),
            "127.0.0.1:9100"
        );
    }

    #[test]
    fn declared_labels_are_the_labels_type() {
        let declared = SqlType::Map(Box::new(SqlType::Text), Box::new(SqlType::Text));
        assert_eq!(arrow_type(&declared).unwrap(), labels_type());
        assert_eq!(sql_name(&labels_type()), "MAP<TEXT, TEXT>");
    }
}
