//! Fixed columns: what a connector that makes its rows itself (`host`,
//! `demo`) can produce, a catalogue from which a stream declares the
//! columns it wants, by name (see [`Columns`](super::registry::Columns)).

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::error::{Error, Result};

/// One column a connector can produce.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogueColumn {
    /// The column name a stream declares.
    pub name: &'static str,
    /// Its type; the declared type must be the SQL type that maps to it.
    pub data_type: DataType,
    /// What it holds, with its unit.
    pub meaning: &'static str,
}

/// A schema with every column of the catalogue, in catalogue order: what
/// the built-in streams (`host_metrics`, `demo`) have.
pub fn full_schema(catalogue: &[CatalogueColumn]) -> SchemaRef {
    Arc::new(Schema::new(
        catalogue
            .iter()
            .map(|c| Field::new(c.name, c.data_type.clone(), true))
            .collect::<Vec<_>>(),
    ))
}

/// The SQL name of a catalogue type.
pub fn sql_type(data_type: &DataType) -> &'static str {
    match data_type {
        DataType::Timestamp(..) => "TIMESTAMP",
        DataType::Utf8 => "TEXT",
        DataType::Float64 => "DOUBLE",
        DataType::Int64 => "BIGINT",
        DataType::Boolean => "BOOLEAN",
        t if *t == crate::types::labels_type() => "MAP<TEXT, TEXT>",
        _ => "?",
    }
}

/// The catalogue as text for messages: `ts TIMESTAMP, host TEXT, ...`.
pub fn describe(catalogue: &[CatalogueColumn]) -> String {
    catalogue
        .iter()
        .map(|c| format!("{} {}", c.name, sql_type(&c.data_type)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// For each declared column, its index in the catalogue. Names match
/// case-insensitively; a column that is not in the catalogue, or whose type
/// is not the catalogue's, is an [`Error::Plan`] that lists the catalogue.
pub fn match_columns(
    stream: &str,
    connector: &str,
    schema: &Schema,
    catalogue: &[CatalogueColumn],
) -> Result<Vec<usize>> {
    schema
        .fields()
        .iter()
        .map(|field| {
            let name = field.name();
            let index = catalogue
                .iter()
                .position(|c| c.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    Error::Plan(format!(
                        "stream {stream}: connector '{connector}' has no column '{name}' \
                         (its columns: {})",
                        describe(catalogue)
                    ))
                })?;
            let wanted = &catalogue[index].data_type;
            if field.data_type() != wanted {
                return Err(Error::Plan(format!(
                    "stream {stream}: column '{name}' of connector '{connector}' is {}, \
                     not {} (its columns: {})",
                    sql_type(wanted),
                    sql_type(field.data_type()),
                    describe(catalogue)
                )));
            }
            Ok(index)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::TimeUnit;

    use super::super::registry::catalogue;
    use super::*;

    fn schema(fields: &[(&str, DataType)]) -> Schema {
        Schema::new(
            fields
                .iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn catalogues_are_well_formed() {
        for connector in ["host", "demo"] {
            let cat = catalogue(connector).unwrap();
            assert_eq!(cat[0].name, "ts", "{connector}");
            assert_eq!(
                cat[0].data_type,
                DataType::Timestamp(TimeUnit::Millisecond, None)
            );
            for (i, c) in cat.iter().enumerate() {
                assert!(!c.meaning.is_empty(), "{}", c.name);
                assert_ne!(sql_type(&c.data_type), "?", "{}", c.name);
                assert!(
                    !cat[..i].iter().any(|d| d.name == c.name),
                    "{} twice",
                    c.name
                );
            }
            let full = full_schema(cat);
            let all = match_columns("s", connector, &full, cat).unwrap();
            assert_eq!(all, (0..cat.len()).collect::<Vec<_>>());
        }
        assert!(catalogue("file").is_none());
    }

    #[test]
    fn columns_match_by_name_in_any_order() {
        let cat = catalogue("host").unwrap();
        let s = schema(&[
            ("CPU", DataType::Float64),
            ("ts", DataType::Timestamp(TimeUnit::Millisecond, None)),
            ("host", DataType::Utf8),
        ]);
        let idx = match_columns("h", "host", &s, cat).unwrap();
        assert_eq!(cat[idx[0]].name, "cpu");
        assert_eq!(cat[idx[1]].name, "ts");
        assert_eq!(cat[idx[2]].name, "host");
    }

    #[test]
    fn unknown_or_mistyped_columns_list_the_catalogue() {
        let cat = catalogue("host").unwrap();
        let e = match_columns("h", "host", &schema(&[("gpu", DataType::Float64)]), cat)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("stream h") && e.contains("'gpu'") && e.contains("cpu DOUBLE"),
            "{e}"
        );
        assert!(e.contains("processes BIGINT"), "{e}");
        let e = match_columns("h", "host", &schema(&[("cpu", DataType::Int64)]), cat)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'cpu'")
                && e.contains("is DOUBLE, not BIGINT")
                && e.contains("ts TIMESTAMP"),
            "{e}"
        );
        let cat = catalogue("demo").unwrap();
        let e = match_columns("d", "demo", &schema(&[("cpu", DataType::Float64)]), cat)
            .unwrap_err()
            .to_string();
        assert!(e.contains("metric TEXT, value DOUBLE"), "{e}");
    }
}
