//! Operator shapes: what a checkpoint's state must match to be restored
//! into a query, the fingerprint of them, and how two shapes differ, in
//! words for the refusal.

use super::*;

/// The shape of one stateful operator: what a checkpoint must match to be
/// restored into it.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorShape {
    /// The operator's id within the query.
    pub id: String,
    /// Its one-line description.
    pub describe: String,
    /// Each state table's name and schema.
    pub schemas: Vec<(String, SchemaRef)>,
}

impl OperatorShape {
    /// The shape of an operator holding `state` (a fresh operator's
    /// snapshot has every table, empty, with its schema).
    pub fn of(id: &str, describe: &str, state: &OperatorState) -> Self {
        Self {
            id: id.to_string(),
            describe: describe.to_string(),
            schemas: state.schemas(),
        }
    }
}

/// One way a stored checkpoint does not fit the query now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The operator's id.
    pub operator: String,
    /// What differs, such as `is no longer in the query`.
    pub what: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "operator {}: {}", self.operator, self.what)
    }
}

/// The fingerprint of a query's stateful operators: a stable hex hash over
/// each operator's id, description, and each table's name and schema, in
/// order. Equal fingerprints mean [`compare`] finds nothing.
pub fn fingerprint(operators: &[OperatorShape]) -> String {
    let shapes: Vec<serde_json::Value> = operators
        .iter()
        .map(|op| {
            let tables: Vec<serde_json::Value> = op
                .schemas
                .iter()
                .map(|(name, schema)| serde_json::json!([name, schema_fingerprint(schema)]))
                .collect();
            serde_json::json!([op.id, op.describe, tables])
        })
        .collect();
    let text = serde_json::to_string(&shapes).expect("strings and vectors encode");
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// A stable hex hash of a schema: each field's name, type, nullability and
/// metadata, and the schema's metadata.
pub fn schema_fingerprint(schema: &Schema) -> String {
    let fields: Vec<(&str, String, bool, BTreeMap<&String, &String>)> = schema
        .fields()
        .iter()
        .map(|f| {
            (
                f.name().as_str(),
                f.data_type().to_string(),
                f.is_nullable(),
                f.metadata().iter().collect(),
            )
        })
        .collect();
    let metadata: BTreeMap<&String, &String> = schema.metadata().iter().collect();
    let text = serde_json::to_string(&(fields, metadata)).expect("strings and maps encode");
    format!("{:016x}", fnv1a(text.as_bytes()))
}

/// 64-bit FNV-1a: fixed by its definition, so fingerprints stay the same
/// across builds and Rust versions (std's hasher promises neither).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What [`compare`] says of an operator the checkpoint has no state of.
pub const NOT_IN_CHECKPOINT: &str = "is not in the checkpoint";

/// How the stored checkpoint differs from the query now: one entry per
/// stateful operator that is new, gone, or whose description or state
/// schema differs (several differences of one operator are joined with
/// `; `); empty = fully compatible.
pub fn compare(stored: &Checkpoint, current: &[OperatorShape]) -> Vec<Mismatch> {
    let stored: Vec<OperatorShape> = stored
        .operators
        .iter()
        .map(|op| OperatorShape::of(&op.id, &op.describe, &op.state))
        .collect();
    compare_shapes(&stored, current)
}

/// How the operators `stored` (of a checkpoint, or of a running query)
/// differ from `current`, as [`compare`] reports it.
pub fn compare_shapes(stored: &[OperatorShape], current: &[OperatorShape]) -> Vec<Mismatch> {
    let mismatch = |operator: &str, what: String| Mismatch {
        operator: operator.to_string(),
        what,
    };
    let mut found = Vec::new();
    for now in current {
        match stored.iter().find(|s| s.id == now.id) {
            None => found.push(mismatch(&now.id, NOT_IN_CHECKPOINT.into())),
            Some(then) => {
                let differences = shape_differences(then, now);
                if !differences.is_empty() {
                    found.push(mismatch(&now.id, differences.join("; ")));
                }
            }
        }
    }
    for then in stored {
        if !current.iter().any(|c| c.id == then.id) {
            found.push(mismatch(&then.id, "is no longer in the query".into()));
        }
    }
    found
}

pub(super) fn shape_differences(then: &OperatorShape, now: &OperatorShape) -> Vec<String> {
    let mut found = Vec::new();
    if then.describe != now.describe {
        found.push(format!(
            "description was `{}`, is now `{}`",
            then.describe, now.describe
        ));
    }
    for (name, schema) in &now.schemas {
        match then.schemas.iter().find(|(n, _)| n == name) {
            None => found.push(format!("state table '{name}' is not in the checkpoint")),
            Some((_, old)) => found.extend(schema_differences(name, old, schema)),
        }
    }
    for (name, _) in &then.schemas {
        if !now.schemas.iter().any(|(n, _)| n == name) {
            found.push(format!(
                "state table '{name}' is no longer in the operator's state"
            ));
        }
    }
    found
}

pub(super) fn schema_differences(table: &str, then: &Schema, now: &Schema) -> Vec<String> {
    let mut found = Vec::new();
    for field in now.fields() {
        let column = field.name();
        let Ok(old) = then.field_with_name(column) else {
            found.push(format!(
                "state table '{table}' column '{column}' is not in the checkpoint"
            ));
            continue;
        };
        if old.data_type() != field.data_type() {
            found.push(format!(
                "state table '{table}' column '{column}' was {}, is now {}",
                old.data_type(),
                field.data_type()
            ));
        } else if old.is_nullable() != field.is_nullable() {
            let nullable = |n: bool| if n { "nullable" } else { "not nullable" };
            found.push(format!(
                "state table '{table}' column '{column}' was {}, is now {}",
                nullable(old.is_nullable()),
                nullable(field.is_nullable())
            ));
        }
    }
    for field in then.fields() {
        if now.field_with_name(field.name()).is_err() {
            found.push(format!(
                "state table '{table}' column '{}' is no longer in it",
                field.name()
            ));
        }
    }
    if found.is_empty() && then != now {
        found.push(order_or_metadata(table, then, now));
    }
    found
}

/// The difference of two schemas with the same columns, types and
/// nullability: their order, or metadata.
pub(super) fn order_or_metadata(table: &str, then: &Schema, now: &Schema) -> String {
    let names = |s: &Schema| {
        s.fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if names(then) != names(now) {
        format!(
            "state table '{table}' columns were ({}), are now ({})",
            names(then),
            names(now)
        )
    } else {
        format!("state table '{table}' schema metadata differs")
    }
}
