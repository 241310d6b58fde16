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
use crate::error::{Error, Result};
use crate::state::position::{SinkCommit, SourcePosition};

pub mod backend;
mod files;
mod shape;

pub use backend::Location;
use files::*;
pub use shape::{
    Mismatch, NOT_IN_CHECKPOINT, OperatorShape, compare, compare_shapes, fingerprint,
    schema_fingerprint,
};

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

#[cfg(test)]
mod tests;
