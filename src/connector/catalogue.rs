//! Fixed columns: what a connector that makes its rows itself (`host`,
//! `demo`) can produce, a catalogue from which a stream declares the
//! columns it wants, by name (see [`Columns`](super::Columns)).

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
pub fn sql_type(data_type: &DataType) -> String {
    crate::types::sql_name(data_type)
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
