//! The Arrow types vigil stores column values as, shared by every layer
//! (declared columns, connectors' fixed columns, listings).
//!
//! A map column (`MAP<TEXT, T>`) is an Arrow map whose entries struct is
//! named `entries` with fields `key` (text, never null) and `value`: the
//! names Arrow's format specification and DataFusion's `map` function use,
//! so maps built by a connector, decoded from JSON or made in SQL compare
//! and combine alike.

use std::sync::Arc;

use datafusion::arrow::array::{MapArray, MapBuilder, MapFieldNames, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Fields};

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
}
