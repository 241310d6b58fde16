//! The on-disk checkpoint store: one folder per query, one folder per
//! checkpoint, Arrow IPC files for operator state and a JSON manifest.
//!
//! Layout under the store's root:
//!
//! ```text
//! ROOT/<query folder>/chk-0000000042/op-000-00.arrow   operator 0, table 0
//!                                   /op-000-01.arrow   operator 0, table 1
//!                                   /op-001-00.arrow   operator 1, table 0
//!                                   /manifest.json     written last
//! ```
//!
//! The query folder is the query's name made filesystem-safe by
//! [`folder_name`]. A checkpoint folder is `chk-` and the id, zero-padded
//! to ten digits (more digits when the id needs them); savepoints are named
//! the same way and told apart by the manifest's `savepoint` flag.
//!
//! Each state table of an operator is one Arrow IPC file (the tables of an
//! operator have different schemas, and an IPC file has one), named by the
//! operator's and the table's position in the checkpoint, so operator ids
//! and table names never have to be escaped. A keyed table is written as
//! one record batch per non-empty key group, in group order, each row with
//! an extra last column `__row` (its position in the operator's table), so
//! that one group can be read alone and a full read gives back the
//! operator's row order. An unkeyed table is one batch (none when empty);
//! an empty table still has its schema in the file.
//!
//! A checkpoint is complete once its `manifest.json` exists: every data
//! file is written before the manifest. In a local directory each file is
//! written to a temporary name, fsynced and renamed, and the folder is
//! fsynced after the manifest; on an object store each file is one put,
//! and the manifest's put comes last. The manifest records each file's
//! size and crc32, so a truncated or damaged file is found before its
//! state is used.
//!
//! Where the root is, a local directory or an object store, is a
//! [`Location`] (see [`backend`]); ROOT above is its path or URL.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, UInt64Array};
use datafusion::arrow::compute::{concat_batches, sort_to_indices, take_arrays};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::arrow::ipc::reader::FileReader;
use datafusion::arrow::ipc::writer::FileWriter;
use datafusion::arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};

use super::{KEY_GROUPS, OperatorState, StateTable, key_groups};
use crate::connectors::{SinkCommit, SourcePosition};
use crate::error::{Error, Result};

pub mod backend;

pub use backend::Location;

/// The manifest format this build writes, and the newest it reads.
pub const MANIFEST_VERSION: u32 = 1;

const MANIFEST: &str = "manifest.json";
/// The name of the ordinal column stored after a keyed table's columns.
const ORDINAL: &str = "__row";

/// One query's checkpoint as the runtime hands it over / reads it back.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Increasing per runtime; unique within a query folder.
    pub id: u64,
    /// Wall clock when taken, in epoch milliseconds.
    pub time_ms: i64,
    /// The query's stable name (the folder name comes from it).
    pub query: String,
    /// See [`fingerprint`].
    pub fingerprint: String,
    /// Savepoints are never deleted by retention.
    pub savepoint: bool,
    /// The state of each stateful operator.
    pub operators: Vec<OperatorEntry>,
    /// Where each input was.
    pub sources: Vec<SourceEntry>,
    /// What each sink had committed.
    pub sinks: Vec<SinkEntry>,
}

/// One operator's state in a checkpoint.
#[derive(Debug, Clone)]
pub struct OperatorEntry {
    /// The operator's id within the query.
    pub id: String,
    /// Its one-line description (as `EXPLAIN` shows it).
    pub describe: String,
    /// What it held.
    pub state: OperatorState,
}

/// One input's position in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceEntry {
    /// The stream read.
    pub stream: String,
    /// `None`: the source cannot go back (stdin, host metrics).
    pub position: Option<SourcePosition>,
    /// The source had read all of its input: the operators it fed had
    /// handed on everything, and may be missing from the checkpoint.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ended: bool,
    /// For a source that cannot go back but whose query has a disk buffer:
    /// the buffer's sequence number at the barrier. A restore hands the
    /// query the buffer's records after it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<u64>,
}

/// One sink's commit point in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkEntry {
    /// The sink's name.
    pub name: String,
    /// `None`: the sink cannot go back (at-least-once). Absent from the
    /// manifest when `None`, so that a commit of JSON `null` stays one.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub commit: Option<SinkCommit>,
}

/// A field that is in the manifest is `Some`, even when it is `null`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SinkCommit>, D::Error> {
    SinkCommit::deserialize(d).map(Some)
}

/// What [`QueryStore::write`] did.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    /// The checkpoint's id.
    pub id: u64,
    /// Its folder.
    pub path: Location,
    /// Bytes written: data files and manifest.
    pub bytes: u64,
    /// How long writing it took, until the manifest was durable.
    pub duration: Duration,
    /// Ids of the older checkpoints retention deleted afterwards.
    pub removed: Vec<u64>,
    /// What retention could not delete (the checkpoint itself is written).
    pub warnings: Vec<String>,
}

/// What [`QueryStore::latest`] found.
#[derive(Debug, Default)]
pub struct Restored {
    /// The newest checkpoint that reads back whole; `None` if there is none.
    pub checkpoint: Option<Checkpoint>,
    /// One line per newer checkpoint that was skipped, naming it and why.
    pub warnings: Vec<String>,
}

/// One complete checkpoint, from its manifest, for listings.
#[derive(Debug, Clone)]
pub struct CheckpointSummary {
    /// The checkpoint's id.
    pub id: u64,
    /// When it was taken, in epoch milliseconds.
    pub time_ms: i64,
    /// The query's name.
    pub query: String,
    /// A savepoint (never deleted by retention).
    pub savepoint: bool,
    /// Size on disk: data files and manifest.
    pub bytes: u64,
    /// Where each input was.
    pub sources: Vec<SourceEntry>,
    /// The checkpoint's folder.
    pub path: Location,
}

/// A checkpoint's `manifest.json`: what the folder holds and how to check it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest format, [`MANIFEST_VERSION`] when written by this build.
    pub version: u32,
    /// The checkpoint's id.
    pub id: u64,
    /// When it was taken, in epoch milliseconds.
    pub time_ms: i64,
    /// The query's name.
    pub query: String,
    /// The query's [`fingerprint`] when it was taken.
    pub fingerprint: String,
    /// A savepoint (never deleted by retention).
    pub savepoint: bool,
    /// The operators, in the checkpoint's order.
    pub operators: Vec<ManifestOperator>,
    /// Where each input was.
    pub sources: Vec<SourceEntry>,
    /// What each sink had committed.
    pub sinks: Vec<SinkEntry>,
}

/// One operator in a manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestOperator {
    /// The operator's id within the query.
    pub id: String,
    /// Its description when the checkpoint was taken.
    pub describe: String,
    /// Its state tables, each in a file of its own.
    pub tables: Vec<ManifestTable>,
}

impl ManifestOperator {
    /// Bytes of the operator's state files.
    pub fn bytes(&self) -> u64 {
        self.tables.iter().map(|t| t.bytes).sum()
    }

    /// Rows over the operator's tables.
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|t| t.rows).sum()
    }
}

/// One state table in a manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestTable {
    /// The table's name within its operator.
    pub name: String,
    /// Its Arrow IPC file, in the checkpoint's folder.
    pub file: String,
    /// The file's size.
    pub bytes: u64,
    /// The crc32 of the whole file.
    pub crc32: u32,
    /// The key columns; empty for an unkeyed table.
    pub key_columns: Vec<usize>,
    /// [`schema_fingerprint`] of the table's schema (without `__row`).
    pub schema_fingerprint: String,
    /// Rows in the table.
    pub rows: u64,
    /// Keyed tables: which record batch of the file holds which key group.
    #[serde(default)]
    pub groups: Vec<GroupEntry>,
}

impl ManifestTable {
    fn keyed(&self) -> bool {
        !self.key_columns.is_empty()
    }
}

/// Where one key group of a keyed table is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupEntry {
    /// The key group.
    pub group: u16,
    /// The index of its record batch in the file.
    pub batch: usize,
    /// Its rows.
    pub rows: u64,
}

impl Manifest {
    /// Bytes of all the checkpoint's state files.
    pub fn data_bytes(&self) -> u64 {
        self.operators.iter().map(ManifestOperator::bytes).sum()
    }
}

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
fn fnv1a(bytes: &[u8]) -> u64 {
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

fn shape_differences(then: &OperatorShape, now: &OperatorShape) -> Vec<String> {
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

fn schema_differences(table: &str, then: &Schema, now: &Schema) -> Vec<String> {
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
fn order_or_metadata(table: &str, then: &Schema, now: &Schema) -> String {
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

/// The folder name of query `query`: ASCII lowercase letters, digits, `_`
/// and `-` are kept; every other byte of the UTF-8 name, uppercase letters
/// included (so that case-insensitive filesystems keep `Q1` and `q1`
/// apart), becomes `%XX` with uppercase hex digits. Distinct names give
/// distinct folders, and [`query_of_folder`] gives the name back. The
/// empty name is refused.
pub fn folder_name(query: &str) -> Result<String> {
    if query.is_empty() {
        return Err(Error::Plan(
            "a checkpointed query needs a name (the empty name has no folder)".into(),
        ));
    }
    Ok(query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect())
}

/// The query whose folder is called `folder`, if [`folder_name`] makes
/// exactly that name from one.
pub fn query_of_folder(folder: &str) -> Option<String> {
    let mut bytes = Vec::new();
    let mut rest = folder.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    let query = String::from_utf8(bytes).ok()?;
    (folder_name(&query).ok()? == folder).then_some(query)
}

/// Every query folder under `root`, by query name.
pub fn query_folders(root: &Location) -> Result<Vec<(String, Location)>> {
    let folders = root.folders().map_err(|e| match e {
        Error::Io { source, .. } => {
            Error::io(format!("cannot read checkpoint directory {root}"), source)
        }
        other => other,
    })?;
    Ok(folders
        .iter()
        .filter_map(|name| Some((query_of_folder(name)?, root.child(name))))
        .collect())
}

/// The folder name of checkpoint `id`.
fn checkpoint_folder(id: u64) -> String {
    format!("chk-{id:010}")
}

/// The id of a checkpoint folder called `name`, if it is one.
fn checkpoint_id(name: &str) -> Option<u64> {
    let id: u64 = name.strip_prefix("chk-")?.parse().ok()?;
    (checkpoint_folder(id) == name).then_some(id)
}

/// Why a checkpoint folder cannot be used.
enum Problem {
    /// No manifest: the run stopped while writing it.
    Incomplete,
    /// Written by a newer vigil, in this manifest version.
    Newer(u32),
    /// Anything else: an unreadable manifest, a bad file.
    Damaged(String),
    /// The object store did not answer: the checkpoint may be whole.
    Unreachable(String),
}

impl Problem {
    fn describe(&self) -> String {
        match self {
            Problem::Incomplete => {
                format!("it is incomplete (no {MANIFEST}: the run stopped while writing it)")
            }
            Problem::Newer(v) => format!(
                "it was written by a newer vigil (manifest version {v}; this one reads \
                 version {MANIFEST_VERSION} and older)"
            ),
            Problem::Damaged(why) => format!("it is damaged: {why}"),
            Problem::Unreachable(why) => format!("it cannot be read: {why}"),
        }
    }
}

impl From<Error> for Problem {
    /// An object store's failure ([`Error::Connector`], kept as it is by
    /// [`read_operator`]) says nothing of the checkpoint: going back to an
    /// older one would repeat output already committed.
    fn from(e: Error) -> Self {
        match e {
            Error::Connector(why) => Problem::Unreachable(why),
            other => Problem::Damaged(other.to_string()),
        }
    }
}

/// The checkpoints of one query: `ROOT/<folder_name(query)>/`.
///
/// One runtime writes a query's folder at a time; the store does not lock
/// it.
#[derive(Debug, Clone)]
pub struct QueryStore {
    dir: Location,
    query: String,
    keep: usize,
}

impl QueryStore {
    /// Opens (creating it if need be) the folder of `query` under `root`.
    /// Retention keeps the newest `keep` complete checkpoints, and at least
    /// one whatever `keep` says.
    pub fn open(root: &Location, query: &str, keep: usize) -> Result<Self> {
        let dir = root.child(&folder_name(query)?);
        dir.make_folder()?;
        Ok(Self {
            dir,
            query: query.to_string(),
            keep: keep.max(1),
        })
    }

    /// The query's folder.
    pub fn dir(&self) -> &Location {
        &self.dir
    }

    /// The query's name.
    pub fn query(&self) -> &str {
        &self.query
    }

    /// The folder checkpoint `id` has or would have.
    pub fn path(&self, id: u64) -> Location {
        self.dir.child(&checkpoint_folder(id))
    }

    /// Writes `checkpoint` durably, then applies retention: the newest
    /// `keep` complete checkpoints that are not savepoints stay, older ones
    /// go, and so do folders without a manifest older than the newest
    /// complete checkpoint. Savepoints always stay.
    pub fn write(&self, checkpoint: &Checkpoint) -> Result<CheckpointInfo> {
        let started = Instant::now();
        if checkpoint.query != self.query {
            return Err(Error::Plan(format!(
                "checkpoint {} is of query '{}', not of '{}' whose folder this is",
                checkpoint.id, checkpoint.query, self.query
            )));
        }
        self.check_newer(checkpoint.id)?;
        let path = self.path(checkpoint.id);
        self.prepare(&path, checkpoint.id)?;
        let bytes = match write_checkpoint(&path, checkpoint) {
            Ok(bytes) => bytes,
            Err(e) => {
                // Left as it is, the folder would only wait for retention.
                let _ = path.remove_all();
                return Err(e);
            }
        };
        self.dir.sync()?;
        let duration = started.elapsed();
        let (removed, warnings) = self.retain();
        Ok(CheckpointInfo {
            id: checkpoint.id,
            path,
            bytes,
            duration,
            removed,
            warnings,
        })
    }

    /// The id to give the next checkpoint: one past every folder's, so
    /// that a new run goes on from where earlier runs stopped.
    pub fn next_id(&self) -> Result<u64> {
        Ok(self.folders()?.last().map_or(1, |(id, _)| id + 1))
    }

    /// Refuses an id below a complete checkpoint's: "newest" is the
    /// highest id, for [`QueryStore::latest`] and for retention, which
    /// would otherwise delete the checkpoint just written.
    fn check_newer(&self, id: u64) -> Result<()> {
        for (other, path) in self.folders()?.into_iter().rev() {
            if other <= id {
                break;
            }
            if path.child(MANIFEST).exists()? {
                return Err(Error::Plan(format!(
                    "checkpoint {id} of query '{}' would be older than checkpoint {other} \
                     already there (ids must increase: see QueryStore::next_id)",
                    self.query
                )));
            }
        }
        Ok(())
    }

    /// Makes way for checkpoint `id`: refuses if a complete one is there,
    /// removes an incomplete one.
    fn prepare(&self, path: &Location, id: u64) -> Result<()> {
        if path.child(MANIFEST).exists()? {
            return Err(Error::Plan(format!(
                "checkpoint {id} of query '{}' already exists ({path})",
                self.query
            )));
        }
        path.remove_all()
    }

    /// The newest complete checkpoint (or savepoint) that reads back whole.
    /// Each newer one skipped gives a warning naming it and why. A
    /// checkpoint of a newer manifest version is an error: going back past
    /// it would lose what it holds; so is an object store that does not
    /// answer.
    pub fn latest(&self) -> Result<Restored> {
        let mut warnings = Vec::new();
        for (id, path) in self.folders()?.into_iter().rev() {
            match load(&path) {
                Ok(checkpoint) => {
                    return Ok(Restored {
                        checkpoint: Some(checkpoint),
                        warnings,
                    });
                }
                Err(problem @ (Problem::Newer(_) | Problem::Unreachable(_))) => {
                    return Err(self.error(id, &path, &problem));
                }
                Err(problem) => warnings.push(format!(
                    "skipped checkpoint {id} of query '{}' ({path}): {}",
                    self.query,
                    problem.describe()
                )),
            }
        }
        Ok(Restored {
            checkpoint: None,
            warnings,
        })
    }

    /// Checkpoint `id`, checked whole.
    pub fn read(&self, id: u64) -> Result<Checkpoint> {
        let path = self.existing(id)?;
        load(&path).map_err(|p| self.error(id, &path, &p))
    }

    /// The manifest of checkpoint `id`, without reading its state.
    pub fn manifest(&self, id: u64) -> Result<Manifest> {
        self.manifest_sized(id).map(|(manifest, _)| manifest)
    }

    /// The manifest of checkpoint `id` and its own size in bytes.
    pub fn manifest_sized(&self, id: u64) -> Result<(Manifest, u64)> {
        let path = self.existing(id)?;
        read_manifest(&path).map_err(|p| self.error(id, &path, &p))
    }

    /// The state operator `operator` of checkpoint `id` had in key groups
    /// `groups`: of each keyed table the rows of those groups, in the
    /// operator's order; each unkeyed table whole. For restoring at
    /// another parallelism.
    pub fn read_key_groups(
        &self,
        id: u64,
        operator: &str,
        groups: &RangeInclusive<u16>,
    ) -> Result<OperatorState> {
        let (manifest, _) = self.manifest_sized(id)?;
        let path = self.path(id);
        let op = manifest
            .operators
            .iter()
            .find(|o| o.id == operator)
            .ok_or_else(|| {
                Error::Plan(format!(
                    "checkpoint {id} of query '{}' has no operator '{operator}'",
                    self.query
                ))
            })?;
        read_operator(&path, op, Some(groups)).map_err(|e| self.error(id, &path, &e.into()))
    }

    /// The complete checkpoints (those with a readable manifest), oldest
    /// first. Their state files are not read.
    pub fn list(&self) -> Result<Vec<CheckpointSummary>> {
        let mut found = Vec::new();
        for (id, path) in self.folders()? {
            let (manifest, manifest_bytes) = match read_manifest(&path) {
                Ok(m) => m,
                Err(problem @ (Problem::Newer(_) | Problem::Unreachable(_))) => {
                    return Err(self.error(id, &path, &problem));
                }
                Err(_) => continue,
            };
            found.push(CheckpointSummary {
                id,
                time_ms: manifest.time_ms,
                query: manifest.query.clone(),
                savepoint: manifest.savepoint,
                bytes: manifest.data_bytes() + manifest_bytes,
                sources: manifest.sources,
                path,
            });
        }
        Ok(found)
    }

    /// The checkpoint folders, complete or not, by id.
    fn folders(&self) -> Result<Vec<(u64, Location)>> {
        let mut found: Vec<(u64, Location)> = self
            .dir
            .folders()?
            .iter()
            .filter_map(|name| Some((checkpoint_id(name)?, self.dir.child(name))))
            .collect();
        found.sort_by_key(|(id, _)| *id);
        Ok(found)
    }

    fn existing(&self, id: u64) -> Result<Location> {
        let path = self.path(id);
        match path.exists()? {
            true => Ok(path),
            false => Err(Error::Plan(format!(
                "query '{}' has no checkpoint {id} (in {})",
                self.query, self.dir
            ))),
        }
    }

    fn error(&self, id: u64, path: &Location, problem: &Problem) -> Error {
        Error::Plan(format!(
            "checkpoint {id} of query '{}' ({path}): {}",
            self.query,
            problem.describe()
        ))
    }

    /// Deletes what retention lets go; returns the ids deleted and what
    /// could not be. Folders with a manifest that cannot be read stay: it
    /// may be a savepoint.
    fn retain(&self) -> (Vec<u64>, Vec<String>) {
        let folders = match self.folders() {
            Ok(f) => f,
            Err(e) => return (Vec::new(), vec![format!("retention: {e}")]),
        };
        let mut complete = Vec::new();
        let mut incomplete = Vec::new();
        for (id, path) in folders {
            match read_manifest(&path) {
                Err(Problem::Incomplete) => incomplete.push((id, path)),
                Ok((manifest, _)) if !manifest.savepoint => complete.push((id, path)),
                _ => {}
            }
        }
        let newest = complete.last().map(|(id, _)| *id);
        let old = complete.len().saturating_sub(self.keep);
        let mut doomed: Vec<(u64, Location)> = complete.into_iter().take(old).collect();
        doomed.extend(incomplete.into_iter().filter(|(id, _)| Some(*id) < newest));
        doomed.sort_by_key(|(id, _)| *id);
        let mut removed = Vec::new();
        let mut warnings = Vec::new();
        for (id, path) in doomed {
            match remove_checkpoint(&path) {
                Ok(()) => removed.push(id),
                Err(e) => warnings.push(format!(
                    "retention: cannot remove checkpoint {id} ({path}): {e}"
                )),
            }
        }
        (removed, warnings)
    }
}

/// Removes a checkpoint folder, its manifest first, so that a stop halfway
/// leaves an incomplete folder rather than a damaged complete one.
fn remove_checkpoint(path: &Location) -> Result<()> {
    path.child(MANIFEST).remove()?;
    path.remove_all()
}

/// Writes the state files and then the manifest of `checkpoint` into the
/// empty folder `dir`; returns the bytes written.
fn write_checkpoint(dir: &Location, checkpoint: &Checkpoint) -> Result<u64> {
    let operators = checkpoint
        .operators
        .iter()
        .enumerate()
        .map(|(i, op)| write_operator(dir, i, op))
        .collect::<Result<Vec<_>>>()?;
    crate::runtime::crashpoint::hit("checkpoint-write");
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        id: checkpoint.id,
        time_ms: checkpoint.time_ms,
        query: checkpoint.query.clone(),
        fingerprint: checkpoint.fingerprint.clone(),
        savepoint: checkpoint.savepoint,
        operators,
        sources: checkpoint.sources.clone(),
        sinks: checkpoint.sinks.clone(),
    };
    let text = serde_json::to_vec(&manifest)
        .map_err(|e| Error::Plan(format!("cannot encode the checkpoint manifest: {e}")))?;
    let written = text.len() as u64;
    dir.child(MANIFEST).put(text)?;
    dir.sync()?;
    Ok(manifest.data_bytes() + written)
}

fn write_operator(dir: &Location, index: usize, op: &OperatorEntry) -> Result<ManifestOperator> {
    let tables = op
        .state
        .tables
        .iter()
        .enumerate()
        .map(|(t, table)| {
            let file = format!("op-{index:03}-{t:02}.arrow");
            write_table(&dir.child(&file), file, table).map_err(|e| {
                Error::Plan(format!(
                    "operator {} state table '{}': {e}",
                    op.id, table.name
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ManifestOperator {
        id: op.id.clone(),
        describe: op.describe.clone(),
        tables,
    })
}

/// Writes one table to the IPC file at `path`.
fn write_table(path: &Location, file: String, table: &StateTable) -> Result<ManifestTable> {
    let schema = table.batch.schema();
    let columns = schema.fields().len();
    if let Some(bad) = table.key_columns.iter().find(|&&c| c >= columns) {
        return Err(Error::Plan(format!(
            "key column {bad} is out of range (the table has {columns} columns)"
        )));
    }
    let (file_schema, batches, groups) = match table.key_columns.is_empty() {
        true => {
            let batches = match table.batch.num_rows() {
                0 => Vec::new(),
                _ => vec![table.batch.clone()],
            };
            (schema.clone(), batches, Vec::new())
        }
        false => by_key_group(table)?,
    };
    // Whole in memory: an object store takes one put per object.
    let mut writer = FileWriter::try_new(Vec::new(), &file_schema)?;
    for batch in &batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    let encoded = writer.into_inner()?;
    let (crc32, bytes) = (crc32fast::hash(&encoded), encoded.len() as u64);
    path.put(encoded)?;
    Ok(ManifestTable {
        name: table.name.clone(),
        file,
        bytes,
        crc32,
        key_columns: table.key_columns.clone(),
        schema_fingerprint: schema_fingerprint(&schema),
        rows: table.batch.num_rows() as u64,
        groups,
    })
}

/// A keyed table as one batch per non-empty key group, each row with its
/// position in the table as a last column.
fn by_key_group(table: &StateTable) -> Result<(SchemaRef, Vec<RecordBatch>, Vec<GroupEntry>)> {
    let mut rows_of: Vec<Vec<u64>> = vec![Vec::new(); usize::from(KEY_GROUPS)];
    for (row, group) in key_groups(&table.batch, &table.key_columns)?
        .into_iter()
        .enumerate()
    {
        rows_of[usize::from(group)].push(row as u64);
    }
    let schema = with_ordinal(&table.batch.schema());
    let mut batches = Vec::new();
    let mut groups = Vec::new();
    for (group, rows) in rows_of.into_iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let ordinals = UInt64Array::from(rows);
        let mut columns = take_arrays(table.batch.columns(), &ordinals, None)?;
        columns.push(Arc::new(ordinals));
        groups.push(GroupEntry {
            group: group as u16,
            batch: batches.len(),
            rows: columns[0].len() as u64,
        });
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok((schema, batches, groups))
}

fn with_ordinal(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(ORDINAL, DataType::UInt64, false));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The manifest of the checkpoint in `dir`, and its size in bytes.
fn read_manifest(dir: &Location) -> Result<(Manifest, u64), Problem> {
    let text = match dir.child(MANIFEST).get() {
        Ok(Some(text)) => text,
        Ok(None) => return Err(Problem::Incomplete),
        Err(e) if dir.is_object_store() => return Err(Problem::Unreachable(e.to_string())),
        Err(e) => return Err(Problem::Damaged(format!("cannot read {MANIFEST}: {e}"))),
    };
    let bytes = text.len() as u64;
    let unreadable =
        |e: serde_json::Error| Problem::Damaged(format!("{MANIFEST} is unreadable: {e}"));
    // The version first: a newer manifest may not parse as this one.
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(unreadable)?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v > u64::from(MANIFEST_VERSION) => {
            return Err(Problem::Newer(u32::try_from(v).unwrap_or(u32::MAX)));
        }
        Some(_) => {}
        None => {
            return Err(Problem::Damaged(format!("{MANIFEST} has no version")));
        }
    }
    serde_json::from_value(value)
        .map(|manifest| (manifest, bytes))
        .map_err(unreadable)
}

/// The checkpoint in `dir`, every file checked against its manifest.
fn load(dir: &Location) -> Result<Checkpoint, Problem> {
    let (manifest, _) = read_manifest(dir)?;
    let operators = manifest
        .operators
        .iter()
        .map(|op| {
            Ok(OperatorEntry {
                id: op.id.clone(),
                describe: op.describe.clone(),
                state: read_operator(dir, op, None)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Checkpoint {
        id: manifest.id,
        time_ms: manifest.time_ms,
        query: manifest.query,
        fingerprint: manifest.fingerprint,
        savepoint: manifest.savepoint,
        operators,
        sources: manifest.sources,
        sinks: manifest.sinks,
    })
}

/// An operator's state: every row, or (`groups`) those of some key groups.
/// An object store's failure stays an [`Error::Connector`] (see
/// [`Problem`]'s `From`).
fn read_operator(
    dir: &Location,
    op: &ManifestOperator,
    groups: Option<&RangeInclusive<u16>>,
) -> Result<OperatorState> {
    let mut state = OperatorState::new();
    for table in &op.tables {
        let batch = read_table(dir, table, groups).map_err(|e| match e {
            Error::Connector(_) => e,
            e => Error::Plan(format!(
                "operator {} state table '{}' ({}): {e}",
                op.id, table.name, table.file
            )),
        })?;
        state.add(&table.name, batch, table.key_columns.clone());
    }
    Ok(state)
}

fn read_table(
    dir: &Location,
    table: &ManifestTable,
    groups: Option<&RangeInclusive<u16>>,
) -> Result<RecordBatch> {
    let bytes = read_checked(dir, table)?;
    let reader = FileReader::try_new(Cursor::new(bytes), None)?;
    let file_schema = reader.schema();
    let schema = match table.keyed() {
        true => without_ordinal(&file_schema)?,
        false => file_schema.clone(),
    };
    if schema_fingerprint(&schema) != table.schema_fingerprint {
        return Err(Error::Plan(
            "its schema is not the one the manifest records".into(),
        ));
    }
    match table.keyed() {
        false => read_whole(reader, &schema, table),
        true => read_groups(reader, &schema, table, groups),
    }
}

/// The file of `table`, checked against its size and crc32.
fn read_checked(dir: &Location, table: &ManifestTable) -> Result<Vec<u8>> {
    let name = Path::new(&table.file);
    if name.components().count() != 1 || name.file_name().is_none() {
        return Err(Error::Plan(format!(
            "the manifest names file '{}' outside the checkpoint",
            table.file
        )));
    }
    let path = dir.child(&table.file);
    let bytes = path
        .get()?
        .ok_or_else(|| Error::Plan(format!("{path} is missing")))?;
    if bytes.len() as u64 != table.bytes {
        return Err(Error::Plan(format!(
            "the file has {} bytes, the manifest says {}",
            bytes.len(),
            table.bytes
        )));
    }
    let crc32 = crc32fast::hash(&bytes);
    if crc32 != table.crc32 {
        return Err(Error::Plan(format!(
            "checksum mismatch (crc32 {crc32:08x}, the manifest says {:08x})",
            table.crc32
        )));
    }
    Ok(bytes)
}

fn without_ordinal(schema: &Schema) -> Result<SchemaRef> {
    let fields = schema.fields();
    match fields.last() {
        Some(last) if last.name() == ORDINAL && last.data_type() == &DataType::UInt64 => {
            let kept: Vec<Field> = fields[..fields.len() - 1]
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            Ok(Arc::new(Schema::new_with_metadata(
                kept,
                schema.metadata().clone(),
            )))
        }
        _ => Err(Error::Plan(format!(
            "a keyed table's file has no '{ORDINAL}' column"
        ))),
    }
}

fn read_whole(
    reader: FileReader<Cursor<Vec<u8>>>,
    schema: &SchemaRef,
    table: &ManifestTable,
) -> Result<RecordBatch> {
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let batch = concat_batches(schema, &batches)?;
    check_rows(batch.num_rows() as u64, table.rows)?;
    Ok(batch)
}

/// Reads the key groups of a keyed table (all of them without `wanted`)
/// and puts the rows back in the operator's order.
fn read_groups(
    mut reader: FileReader<Cursor<Vec<u8>>>,
    schema: &SchemaRef,
    table: &ManifestTable,
    wanted: Option<&RangeInclusive<u16>>,
) -> Result<RecordBatch> {
    check_groups(table, reader.num_batches())?;
    let mut batches = Vec::new();
    for entry in &table.groups {
        if wanted.is_some_and(|w| !w.contains(&entry.group)) {
            continue;
        }
        reader.set_index(entry.batch)?;
        let batch = reader
            .next()
            .ok_or_else(|| Error::Plan(format!("batch {} is missing", entry.batch)))??;
        check_rows(batch.num_rows() as u64, entry.rows)?;
        batches.push(batch);
    }
    let combined = concat_batches(&reader.schema(), &batches)?;
    let last = combined.num_columns() - 1;
    let ordinals = combined.column(last).as_primitive::<UInt64Type>();
    let order: ArrayRef = match wanted {
        None => Arc::new(original_order(ordinals, table.rows)?),
        Some(_) => sort_to_indices(ordinals, None, None).map(|a| Arc::new(a) as ArrayRef)?,
    };
    let columns = take_arrays(&combined.columns()[..last], order.as_ref(), None)?;
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &datafusion::arrow::record_batch::RecordBatchOptions::new()
            .with_row_count(Some(order.len())),
    )?)
}

/// Checks that the manifest's group entries describe the file's batches.
fn check_groups(table: &ManifestTable, batches: usize) -> Result<()> {
    let indexed = table.groups.iter().enumerate().all(|(i, g)| g.batch == i);
    let in_range = table.groups.iter().all(|g| g.group < KEY_GROUPS);
    let rows: u64 = table.groups.iter().map(|g| g.rows).sum();
    if table.groups.len() != batches || !indexed || !in_range || rows != table.rows {
        return Err(Error::Plan(
            "its key groups do not match the manifest".into(),
        ));
    }
    Ok(())
}

fn check_rows(found: u64, expected: u64) -> Result<()> {
    match found == expected {
        true => Ok(()),
        false => Err(Error::Plan(format!(
            "{found} rows where the manifest says {expected}"
        ))),
    }
}

/// The positions that put rows stored with `ordinals` back in the
/// operator's order; every position `0..rows` must occur exactly once.
fn original_order(ordinals: &UInt64Array, rows: u64) -> Result<UInt64Array> {
    let bad = || Error::Plan(format!("its '{ORDINAL}' column is not a permutation"));
    if ordinals.null_count() > 0 || ordinals.len() as u64 != rows {
        return Err(bad());
    }
    let mut order = vec![u64::MAX; ordinals.len()];
    for (position, ordinal) in ordinals.values().iter().enumerate() {
        let slot = usize::try_from(*ordinal)
            .ok()
            .and_then(|o| order.get_mut(o))
            .filter(|s| **s == u64::MAX)
            .ok_or_else(bad)?;
        *slot = position as u64;
    }
    Ok(UInt64Array::from(order))
}

#[cfg(test)]
mod tests;
