//! `vigil checkpoints`: what a checkpoint directory holds.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use datafusion::arrow::row::{RowConverter, SortField};

use crate::error::{Error, Result};
use crate::plan::listing::aligned;
use crate::state::StateTable;
use crate::state::store::{
    Checkpoint, CheckpointSummary, Location, Manifest, QueryStore, SourceEntry, query_folders,
};

#[derive(Debug, clap::Args)]
pub(super) struct CheckpointsArgs {
    /// The checkpoint directory: one folder per query, one folder per
    /// checkpoint in it (a path, or a `file://` or `s3://` URL).
    #[arg(value_parser = Location::parse)]
    dir: Location,
    /// Only the checkpoints of this query.
    #[arg(long, value_name = "NAME")]
    query: Option<String>,
    /// Show checkpoint ID in detail (checking its files): per operator its
    /// tables, bytes, rows and keys; the sources' positions and the sinks'
    /// commits.
    #[arg(long, value_name = "ID")]
    inspect: Option<u64>,
}

/// Lists the checkpoints of `args.dir`, or inspects one.
pub(super) fn run(args: CheckpointsArgs) -> Result<()> {
    let savepoints = savepoints(&args.dir, args.query.as_deref())?;
    let stores = stores(&args.dir, args.query.as_deref(), !savepoints.is_empty())?;
    let text = match args.inspect {
        Some(id) => inspect_all(&args.dir, &stores, id)?,
        None => listing(&args.dir, &stores)? + &savepoint_listing(&savepoints)?,
    };
    // A closed stdout (`| head`) is not an error of ours.
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(())
}

/// The stores of the directory's queries (only `query`'s, if given);
/// `saved` says that the directory's savepoints hold that query.
fn stores(dir: &Location, query: Option<&str>, saved: bool) -> Result<Vec<QueryStore>> {
    if !dir.exists()? {
        return Err(Error::Plan(format!(
            "checkpoint directory {dir} does not exist"
        )));
    }
    let folders = query_folders(dir)?;
    let names: Vec<&str> = folders.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(query) = query.filter(|q| !names.contains(q) && !saved) {
        let known = match names.is_empty() {
            true => "it holds none".to_string(),
            false => format!("queries: {}", names.join(", ")),
        };
        return Err(Error::Plan(format!(
            "no checkpoints of query '{query}' in {dir} ({known})"
        )));
    }
    folders
        .iter()
        .filter(|(name, _)| query.is_none_or(|q| q == name))
        .map(|(name, _)| QueryStore::open(dir, name, 1))
        .collect()
}

/// The savepoints under `dir/savepoints/` (what `--savepoint-on-stop`
/// writes), each with the stores of its queries (only `query`'s, if
/// given); none when there is no such folder.
fn savepoints(dir: &Location, query: Option<&str>) -> Result<Vec<(Location, Vec<QueryStore>)>> {
    let root = dir.child("savepoints");
    if !root.exists()? {
        return Ok(Vec::new());
    }
    let mut names = root.folders()?;
    names.sort();
    let mut found = Vec::new();
    for name in names {
        let savepoint = root.child(&name);
        let stores = query_folders(&savepoint)?
            .iter()
            .filter(|(q, _)| query.is_none_or(|wanted| wanted == q))
            .map(|(q, _)| QueryStore::open(&savepoint, q, 1))
            .collect::<Result<Vec<_>>>()?;
        if !stores.is_empty() {
            found.push((savepoint, stores));
        }
    }
    Ok(found)
}

/// The savepoints, one line per query in each, under a header that says
/// how to restore from one.
fn savepoint_listing(savepoints: &[(Location, Vec<QueryStore>)]) -> Result<String> {
    if savepoints.is_empty() {
        return Ok(String::new());
    }
    let mut rows = vec![["SAVEPOINT", "QUERY", "TIME", "SIZE", "SOURCES"].map(String::from)];
    for (path, stores) in savepoints {
        for store in stores {
            for summary in store.list()? {
                let [query, _, time, _, size, sources] = listing_row(store.query(), &summary);
                rows.push([path.to_string(), query, time, size, sources]);
            }
        }
    }
    Ok(format!(
        "\nsavepoints (restore one with --from-savepoint SAVEPOINT):\n{}",
        aligned(&rows)
    ))
}

/// One line per complete checkpoint of every store, under a header.
fn listing(dir: &Location, stores: &[QueryStore]) -> Result<String> {
    let mut rows = vec![["QUERY", "ID", "TIME", "KIND", "SIZE", "SOURCES"].map(String::from)];
    for store in stores {
        for summary in store.list()? {
            rows.push(listing_row(store.query(), &summary));
        }
    }
    if rows.len() == 1 {
        return Ok(format!("no checkpoints in {dir}\n"));
    }
    Ok(aligned(&rows))
}

fn listing_row(query: &str, summary: &CheckpointSummary) -> [String; 6] {
    let sources: Vec<String> = summary.sources.iter().map(source_short).collect();
    [
        query.to_string(),
        summary.id.to_string(),
        utc(summary.time_ms),
        kind(summary.savepoint).to_string(),
        size(summary.bytes),
        sources.join(" "),
    ]
}

/// `stream=offset/line`; `stream=rows:N` for a source that counts rows
/// only (the demo source); `stream=not replayable`.
fn source_short(source: &SourceEntry) -> String {
    let at = match &source.position {
        None => "not replayable".to_string(),
        Some(p) if p.offset == 0 && p.line == 0 && p.rows > 0 => format!("rows:{}", p.rows),
        Some(p) => format!("{}/{}", p.offset, p.line),
    };
    format!("{}={at}", source.stream)
}

fn kind(savepoint: bool) -> &'static str {
    match savepoint {
        true => "savepoint",
        false => "checkpoint",
    }
}

/// Epoch milliseconds as UTC ISO 8601.
fn utc(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// A size for people: bytes, KiB, MiB or GiB.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 3] = ["KiB", "MiB", "GiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Checkpoint `id` of every store that has it.
fn inspect_all(dir: &Location, stores: &[QueryStore], id: u64) -> Result<String> {
    let mut having: Vec<&QueryStore> = Vec::new();
    for store in stores {
        if store.path(id).exists()? {
            having.push(store);
        }
    }
    if having.is_empty() {
        let message = match stores {
            [one] => format!("query '{}' has no checkpoint {id}", one.query()),
            _ => format!("no query has a checkpoint {id}"),
        };
        return Err(Error::Plan(format!("{message} in {dir}")));
    }
    let sections = having
        .iter()
        .map(|store| inspect(store, id))
        .collect::<Result<Vec<_>>>()?;
    Ok(sections.join("\n"))
}

fn inspect(store: &QueryStore, id: u64) -> Result<String> {
    let (manifest, manifest_bytes) = store.manifest_sized(id)?;
    let checkpoint = store.read(id)?;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "query {}, checkpoint {id} ({})",
        store.query(),
        kind(manifest.savepoint)
    );
    let _ = writeln!(text, "  path: {}", store.path(id));
    let _ = writeln!(text, "  time: {}", utc(manifest.time_ms));
    let total = manifest.data_bytes() + manifest_bytes;
    let _ = writeln!(text, "  size: {} ({total} bytes)", size(total));
    let _ = writeln!(text, "  fingerprint: {}", manifest.fingerprint);
    operators(&mut text, &manifest, &checkpoint)?;
    for source in &checkpoint.sources {
        let _ = writeln!(text, "source {}: {}", source.stream, source_long(source));
    }
    for sink in &checkpoint.sinks {
        let commit = match &sink.commit {
            Some(commit) => commit.to_string(),
            None => "no commit point (at-least-once)".to_string(),
        };
        let _ = writeln!(text, "sink {}: {commit}", sink.name);
    }
    Ok(text)
}

/// Per operator: a line with its totals, and one per table. Keys are the
/// distinct values of a keyed table's key columns.
fn operators(text: &mut String, manifest: &Manifest, checkpoint: &Checkpoint) -> Result<()> {
    for (stored, op) in manifest.operators.iter().zip(&checkpoint.operators) {
        let names: Vec<&str> = stored.tables.iter().map(|t| t.name.as_str()).collect();
        let _ = writeln!(text, "operator {}: {}", op.id, op.describe);
        let _ = writeln!(
            text,
            "  state: {} bytes, {}, tables: {}",
            stored.bytes(),
            count(stored.rows(), "row"),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
        for (entry, table) in stored.tables.iter().zip(&op.state.tables) {
            let keys = match table.key_columns.is_empty() {
                true => "not keyed".to_string(),
                false => format!(
                    "keyed by ({}), {} in {}",
                    key_names(table).join(", "),
                    count(distinct_keys(table)? as u64, "key"),
                    count(entry.groups.len() as u64, "key group")
                ),
            };
            let _ = writeln!(
                text,
                "  table {}: {}, {} bytes, {keys}",
                entry.name,
                count(entry.rows, "row"),
                entry.bytes
            );
        }
    }
    Ok(())
}

/// `1 row`, `2 rows`.
fn count(n: u64, thing: &str) -> String {
    match n {
        1 => format!("1 {thing}"),
        _ => format!("{n} {thing}s"),
    }
}

fn key_names(table: &StateTable) -> Vec<String> {
    let schema = table.batch.schema();
    table
        .key_columns
        .iter()
        .map(|&i| schema.field(i).name().clone())
        .collect()
}

/// The number of distinct key tuples of a keyed table.
fn distinct_keys(table: &StateTable) -> Result<usize> {
    let columns: Vec<_> = table
        .key_columns
        .iter()
        .map(|&i| table.batch.column(i).clone())
        .collect();
    let fields = columns
        .iter()
        .map(|c| SortField::new(c.data_type().clone()))
        .collect();
    let rows = RowConverter::new(fields)?.convert_columns(&columns)?;
    Ok(rows.iter().collect::<HashSet<_>>().len())
}

fn source_long(source: &SourceEntry) -> String {
    match &source.position {
        None => "not replayable".to_string(),
        Some(p) => format!(
            "offset {}, line {}, {}, {}",
            p.offset,
            p.line,
            count(p.rows, "row"),
            count(p.bad_rows, "bad row")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(size(3 << 40), "3072.0 GiB");
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(utc(1_700_000_000_007), "2023-11-14T22:13:20.007Z");
        assert_eq!(utc(i64::MAX), format!("{} ms", i64::MAX));
    }

    #[test]
    fn columns_line_up() {
        let rows = [
            ["Q", "ID", "T", "K", "S", "SOURCES"].map(String::from),
            ["long", "1", "t", "k", "s", ""].map(String::from),
        ];
        assert_eq!(
            aligned(&rows),
            "Q     ID  T  K  S  SOURCES\nlong  1   t  k  s\n"
        );
    }
}
