//! What a group's members hold, read from their status files and the
//! checkpoints in the directory they share: `vigil group`.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{MemberStatus, status_dir};
use crate::connectors::kafka::Endpoint;
use crate::error::Result;
use crate::plan::listing::aligned;
use crate::state::store::{Location, QueryStore, query_folders};

/// A member whose status is older than this has probably died.
const STALE_MS: i64 = 10_000;

/// Group `name`'s members in `checkpoint_dir`, their partitions, each
/// partition's lag (messages after its last checkpoint) and checkpoint
/// age, as a table of text (what `vigil group` prints).
pub fn status_text(checkpoint_dir: &Location, name: &str) -> Result<String> {
    let members = members(&status_dir(checkpoint_dir, name))?;
    if members.is_empty() {
        return Ok(format!("group {name}: no members\n"));
    }
    let now = chrono::Utc::now().timestamp_millis();
    let checkpoints = last_checkpoints(checkpoint_dir)?;
    let ends = high_watermarks(&members[0]);
    let mut rows = vec![["MEMBER", "SEEN", "PARTITION", "LAG", "CHECKPOINT AGE"].map(String::from)];
    for member in &members {
        let seen = now - member.updated_ms;
        let seen = match seen > STALE_MS {
            true => format!("{} s ago (gone?)", seen / 1000),
            false => format!("{} s ago", seen / 1000),
        };
        if member.partitions.is_empty() {
            rows.push([
                member.member.clone(),
                seen.clone(),
                "-".into(),
                "".into(),
                "".into(),
            ]);
        }
        for p in &member.partitions {
            let checkpoint = checkpoints.get(p);
            let lag = match (ends.get(p), checkpoint.and_then(|c| c.1)) {
                (Some(end), Some(offset)) => (end - offset).max(0).to_string(),
                (Some(end), None) => format!("{end} (no checkpoint)"),
                _ => "?".into(),
            };
            let age = checkpoint.map_or("none".into(), |c| format!("{} s", (now - c.0) / 1000));
            rows.push([member.member.clone(), seen.clone(), p.to_string(), lag, age]);
        }
    }
    Ok(aligned(&rows))
}

/// The status files of a group's members, by member.
fn members(dir: &Location) -> Result<Vec<MemberStatus>> {
    let Ok(names) = dir.objects() else {
        return Ok(Vec::new());
    };
    let mut members: Vec<MemberStatus> = names
        .iter()
        .filter(|name| name.ends_with(".json"))
        .filter_map(|name| serde_json::from_slice(&dir.child(name).get().ok()??).ok())
        .collect();
    members.sort_by(|a, b| a.member.cmp(&b.member));
    Ok(members)
}

/// Per partition, the time of its pipeline's newest checkpoint and the
/// offset it would read on from (the oldest over its queries).
fn last_checkpoints(dir: &Location) -> Result<BTreeMap<i32, (i64, Option<i64>)>> {
    let mut out: BTreeMap<i32, (i64, Option<i64>)> = BTreeMap::new();
    for (name, _) in query_folders(dir)? {
        let Some(partition) = name
            .rsplit_once("-p")
            .and_then(|(_, p)| p.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(last) = QueryStore::open(dir, &name, usize::MAX)?.list()?.pop() else {
            continue;
        };
        let offset = last.sources.iter().find_map(|s| {
            let offsets = s.position.as_ref()?.extra.get("offsets")?;
            offsets.get(partition.to_string())?.as_i64()
        });
        let entry = out.entry(partition).or_insert((last.time_ms, offset));
        entry.0 = entry.0.max(last.time_ms);
        entry.1 = match (entry.1, offset) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(out)
}

/// The end offset of every partition of the member's topic; empty when
/// the brokers do not answer.
fn high_watermarks(member: &MemberStatus) -> BTreeMap<i32, i64> {
    let endpoint = Endpoint {
        bootstrap: member.bootstrap.clone(),
        topic: member.topic.clone(),
        properties: Vec::new(),
    };
    let Ok(consumer) = endpoint.client_config(&[]).create::<BaseConsumer>() else {
        return BTreeMap::new();
    };
    let timeout = Duration::from_secs(3);
    let Ok(metadata) = consumer.fetch_metadata(Some(&member.topic), timeout) else {
        return BTreeMap::new();
    };
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    partitions
        .into_iter()
        .filter_map(|p| {
            let (_, high) = consumer.fetch_watermarks(&member.topic, p, timeout).ok()?;
            Some((p, high))
        })
        .collect()
}
