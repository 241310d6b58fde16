//! Nested columns (`STRUCT`, `ARRAY`, `MAP`) of JSON lines and CSV rows.
//!
//! A nested value is JSON: an object, array or object in a JSON line, or
//! the JSON text of a CSV cell. While a row is parsed, [`typed`] checks the
//! value against the column's type, the way [`json_value`] checks a scalar
//! (its leaves go through `json_value` itself), so a value of the wrong
//! shape makes the row bad with a reason that names the column and the
//! path inside it (`column labels: key 'x': expected TEXT, found number
//! 3`). The row keeps the value's JSON text, like a text column; when the
//! row is appended the text is typed again into JSON whose every leaf has
//! its column's Arrow representation (timestamps as epoch milliseconds),
//! and Arrow's JSON decoder builds the column from those values.
//!
//! A map's entries are kept in key order (and a key given twice keeps its
//! last value), so maps with the same entries are equal however their JSON
//! ordered them: they group and key alerts as one.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, new_empty_array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::json::ReaderBuilder;
use serde_json::{Map, Number, Value};

use super::{Kind, TsUnit, Val, describe, json_error, json_value};
use crate::error::{Error, Result};
use crate::types::sql_name;

/// True for a struct, list or map type whose leaves are all scalar kinds a
/// source reads.
pub(super) fn is_nested(data_type: &DataType) -> bool {
    match data_type {
        DataType::Struct(fields) => {
            !fields.is_empty() && fields.iter().all(|f| is_leaf_or_nested(f.data_type()))
        }
        DataType::List(item) => is_leaf_or_nested(item.data_type()),
        DataType::Map(entries, _) => match entries.data_type() {
            DataType::Struct(kv) if kv.len() == 2 => {
                kv[0].data_type() == &DataType::Utf8 && is_leaf_or_nested(kv[1].data_type())
            }
            _ => false,
        },
        _ => false,
    }
}

fn is_leaf_or_nested(data_type: &DataType) -> bool {
    leaf_kind(data_type).is_some() || is_nested(data_type)
}

fn leaf_kind(data_type: &DataType) -> Option<Kind> {
    match data_type {
        DataType::Timestamp(TimeUnit::Millisecond, _) => Some(Kind::Timestamp),
        DataType::Utf8 => Some(Kind::Text),
        DataType::Float64 => Some(Kind::Float),
        DataType::Int64 => Some(Kind::Int),
        DataType::Boolean => Some(Kind::Bool),
        _ => None,
    }
}

/// Checks `value` against `data_type` and returns it with every leaf in
/// its Arrow representation; `path` is the column and the way into it,
/// as reasons name it.
pub(super) fn typed(
    data_type: &DataType,
    value: &Value,
    unit: TsUnit,
    path: &str,
) -> std::result::Result<Value, String> {
    if value.is_null() {
        return Ok(Value::Null);
    }
    if let Some(kind) = leaf_kind(data_type) {
        return leaf(kind, value, unit, path);
    }
    let mismatch = || {
        format!(
            "column {path}: expected {}, found {}",
            sql_name(data_type),
            describe(value)
        )
    };
    match (data_type, value) {
        (DataType::Struct(fields), Value::Object(object)) => {
            let mut out = Map::new();
            for field in fields {
                let name = field.name();
                let found = object.get(name.as_str()).or_else(|| {
                    object
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v)
                });
                if let Some(v) = found {
                    let path = format!("{path}: field '{name}'");
                    out.insert(name.clone(), typed(field.data_type(), v, unit, &path)?);
                }
            }
            Ok(Value::Object(out))
        }
        (DataType::List(item), Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let path = format!("{path}: element {}", i + 1);
                typed(item.data_type(), v, unit, &path)
            })
            .collect::<std::result::Result<_, _>>()
            .map(Value::Array),
        (DataType::Map(entries, _), Value::Object(object)) => {
            let DataType::Struct(kv) = entries.data_type() else {
                return Err(mismatch());
            };
            let value_type = kv[1].data_type();
            let mut out = Map::new();
            for (key, v) in object {
                let path = format!("{path}: key {}", super::quote(key));
                out.insert(key.clone(), typed(value_type, v, unit, &path)?);
            }
            Ok(Value::Object(out))
        }
        _ => Err(mismatch()),
    }
}

/// A scalar inside a nested value, judged by [`json_value`].
fn leaf(kind: Kind, value: &Value, unit: TsUnit, path: &str) -> std::result::Result<Value, String> {
    let mut arena = String::new();
    Ok(match json_value(kind, path, value, unit, &mut arena)? {
        Val::Null => Value::Null,
        Val::Int(i) => Value::from(i),
        Val::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
        Val::Bool(b) => Value::Bool(b),
        Val::Text(start, end) => Value::String(arena[start..end].to_string()),
    })
}

/// Checks the JSON text of a nested column's value (a CSV cell): empty
/// text is NULL.
pub(super) fn check_text(
    data_type: &DataType,
    text: &str,
    unit: TsUnit,
    column: &str,
) -> std::result::Result<bool, String> {
    if text.trim_ascii().is_empty() {
        return Ok(false);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("column {column}: {}", json_error(&e)))?;
    typed(data_type, &value, unit, column)?;
    Ok(!value.is_null())
}

/// The rows of one nested column, typed, until they are built into an
/// Arrow array.
pub(super) struct NestedBuilder {
    field: Arc<Field>,
    unit: TsUnit,
    rows: Vec<Value>,
}

impl NestedBuilder {
    /// A builder for a column of `data_type` (a type [`is_nested`] takes).
    pub(super) fn new(data_type: &DataType, unit: TsUnit, capacity: usize) -> Self {
        NestedBuilder {
            field: Arc::new(Field::new("value", data_type.clone(), true)),
            unit,
            rows: Vec::with_capacity(capacity),
        }
    }

    /// Appends the value whose JSON text was checked by [`typed`] or
    /// [`check_text`].
    pub(super) fn append_text(&mut self, text: &[u8]) {
        // The text was checked when its row was parsed, so it types again.
        let value = serde_json::from_slice::<Value>(text)
            .ok()
            .and_then(|v| typed(self.field.data_type(), &v, self.unit, "").ok())
            .unwrap_or(Value::Null);
        self.rows.push(value);
    }

    /// Appends NULL.
    pub(super) fn append_null(&mut self) {
        self.rows.push(Value::Null);
    }

    /// The rows appended so far, as one column; the builder is empty after.
    pub(super) fn finish(&mut self) -> Result<ArrayRef> {
        if self.rows.is_empty() {
            return Ok(new_empty_array(self.field.data_type()));
        }
        let rows: Vec<Value> = self
            .rows
            .drain(..)
            .map(|v| Value::Object(Map::from_iter([("value".to_string(), v)])))
            .collect();
        let schema = Arc::new(Schema::new(vec![self.field.clone()]));
        let mut decoder = ReaderBuilder::new(schema)
            .with_batch_size(rows.len().max(1))
            .build_decoder()?;
        decoder.serialize(&rows)?;
        let batch = decoder.flush()?.ok_or_else(|| {
            Error::Connector("nested column: the JSON decoder returned no rows".into())
        })?;
        Ok(batch.column(0).clone())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Fields, TimestampMillisecondType};
    use serde_json::json;

    use super::*;
    use crate::types::{TIME_TYPE, labels_type, map_of};

    fn point() -> DataType {
        DataType::Struct(Fields::from(vec![
            Field::new("at", TIME_TYPE, true),
            Field::new("tags", DataType::new_list(DataType::Utf8, true), true),
        ]))
    }

    #[test]
    fn leaves_take_their_column_representation() {
        let value = json!({"AT": 2, "tags": ["a", null], "other": 1});
        let typed = typed(&point(), &value, TsUnit::Seconds, "p").unwrap();
        assert_eq!(typed, json!({"at": 2000, "tags": ["a", null]}));
        let doubles = DataType::new_list(DataType::Float64, true);
        assert_eq!(
            super::typed(&doubles, &json!([1, 2.5]), TsUnit::Millis, "xs").unwrap(),
            json!([1.0, 2.5])
        );
    }

    #[test]
    fn reasons_name_the_path() {
        let deep = map_of(point());
        let bad = json!({"k": {"tags": ["a", 3]}});
        assert_eq!(
            typed(&deep, &bad, TsUnit::Millis, "m").unwrap_err(),
            "column m: key 'k': field 'tags': element 2: expected TEXT, found number 3"
        );
        assert_eq!(
            typed(&labels_type(), &json!([]), TsUnit::Millis, "labels").unwrap_err(),
            "column labels: expected MAP<TEXT, TEXT>, found an array"
        );
        let at = json!({"k": {"at": "later"}});
        assert_eq!(
            typed(&deep, &at, TsUnit::Millis, "m").unwrap_err(),
            "column m: key 'k': field 'at': cannot parse 'later' as TIMESTAMP"
        );
    }

    #[test]
    fn csv_text_is_json() {
        let list = DataType::new_list(DataType::Int64, true);
        assert_eq!(check_text(&list, " ", TsUnit::Millis, "xs"), Ok(false));
        assert_eq!(check_text(&list, "null", TsUnit::Millis, "xs"), Ok(false));
        assert_eq!(check_text(&list, "[1]", TsUnit::Millis, "xs"), Ok(true));
        let err = check_text(&list, "[1,", TsUnit::Millis, "xs").unwrap_err();
        assert!(err.starts_with("column xs: invalid JSON:"), "{err}");
    }

    #[test]
    fn builds_the_declared_type() {
        let mut labels = NestedBuilder::new(&labels_type(), TsUnit::Millis, 2);
        labels.append_text(br#"{"job": "node", "instance": "a"}"#);
        labels.append_null();
        let column = labels.finish().unwrap();
        assert_eq!(column.data_type(), &labels_type());
        let map = column.as_map();
        assert!(map.is_null(1));
        assert_eq!(map.value_length(0), 2);
        // Entries in key order, whatever the order in the JSON text.
        let keys: Vec<&str> = map.keys().as_string::<i32>().iter().flatten().collect();
        assert_eq!(keys, ["instance", "job"]);

        let mut points = NestedBuilder::new(&point(), TsUnit::Seconds, 1);
        points.append_text(br#"{"at": 3}"#);
        let column = points.finish().unwrap();
        let at = column
            .as_struct()
            .column(0)
            .as_primitive::<TimestampMillisecondType>()
            .value(0);
        assert_eq!(at, 3000);
        assert_eq!(points.finish().unwrap().len(), 0);
    }

    #[test]
    fn only_types_of_readable_leaves_are_nested() {
        assert!(is_nested(&labels_type()));
        assert!(is_nested(&map_of(point())));
        assert!(!is_nested(&DataType::Utf8));
        assert!(!is_nested(&DataType::new_list(DataType::Date32, true)));
        assert!(!is_nested(&DataType::Struct(Fields::empty())));
    }
}
