//! What a group's members hold, read from their status files and the
//! checkpoints in the directory they share: `vigil group`, the shell's
//! `.group` and the service's `GET /groups/{name}`.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use super::scale::{GroupScale, VERDICT_FILE, verdict};
use super::{MemberStatus, status_dir};
use crate::connectors::kafka::Endpoint;
use crate::error::{Error, Result};
use crate::plan::listing::aligned;
use crate::state::store::{Location, QueryStore, query_folders};

/// A member whose status is older than this has probably died.
const STALE_MS: i64 = 10_000;

/// What the members of a group hold now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupStatus {
    /// The group's name.
    pub group: String,
    /// Its members, by name.
    pub members: Vec<MemberView>,
    /// The processes it needs, as its leader last worked out (with
    /// `SET autoscale = 'on'` in its scripts).
    pub autoscale: Option<GroupScale>,
}

/// One member of a group, as its status file says.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemberView {
    /// `host:pid`.
    pub member: String,
    /// The group's topic.
    pub topic: String,
    /// Its brokers.
    pub bootstrap: String,
    /// Milliseconds since the member last wrote its status.
    pub seen_ms: i64,
    /// It has not written its status for over 10 s: it has probably died,
    /// and the group will hand its partitions on.
    pub stale: bool,
    /// The partitions whose pipelines it runs.
    pub partitions: Vec<PartitionView>,
}

/// One partition a member runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionView {
    /// The partition.
    pub partition: i32,
    /// Its end offset; `None` when the brokers did not answer.
    pub end_offset: Option<i64>,
    /// The offset its pipeline reads on from after its newest checkpoint
    /// (the oldest over its queries); `None` before its first checkpoint.
    pub checkpoint_offset: Option<i64>,
    /// Messages after its newest checkpoint (all of them before its first
    /// one); `None` when the brokers did not answer.
    pub lag: Option<i64>,
    /// Milliseconds since its newest checkpoint; `None` if it has none.
    pub checkpoint_age_ms: Option<i64>,
}

/// Reads what the members of group `name` hold from the checkpoint
/// directory they share, and each partition's end offset from the
/// brokers (which may not answer: then the lags are unknown). A directory
/// that cannot be read, or that holds neither checkpoints nor groups, is
/// an error: it is not the members' checkpoint directory.
pub fn group_status(checkpoint_dir: &Location, name: &str) -> Result<GroupStatus> {
    let checkpoints = last_checkpoints(checkpoint_dir)?;
    if checkpoints.is_empty() && !has_groups(checkpoint_dir)? {
        return Err(Error::Plan(format!(
            "{checkpoint_dir} is not a checkpoint directory of a group: it holds no checkpoints and no groups"
        )));
    }
    let members = members(&status_dir(checkpoint_dir, name))?;
    let now = chrono::Utc::now().timestamp_millis();
    let ends = members.first().map(high_watermarks).unwrap_or_default();
    let members = members
        .into_iter()
        .map(|member| {
            let seen_ms = now - member.updated_ms;
            let partitions = member
                .partitions
                .iter()
                .map(|&partition| {
                    let checkpoint = checkpoints.get(&partition);
                    let end_offset = ends.get(&partition).copied();
                    let checkpoint_offset = checkpoint.and_then(|c| c.offset);
                    PartitionView {
                        partition,
                        end_offset,
                        checkpoint_offset,
                        lag: end_offset.map(|end| (end - checkpoint_offset.unwrap_or(0)).max(0)),
                        checkpoint_age_ms: checkpoint.map(|c| now - c.time_ms),
                    }
                })
                .collect();
            MemberView {
                member: member.member,
                topic: member.topic,
                bootstrap: member.bootstrap,
                seen_ms,
                stale: seen_ms > STALE_MS,
                partitions,
            }
        })
        .collect();
    Ok(GroupStatus {
        group: name.to_string(),
        members,
        autoscale: verdict(checkpoint_dir, name),
    })
}

/// Group `name`'s members in `checkpoint_dir`, their partitions, each
/// partition's lag (messages after its last checkpoint) and checkpoint
/// age, as a table of text (what `vigil group` prints).
pub fn status_text(checkpoint_dir: &Location, name: &str) -> Result<String> {
    Ok(group_status(checkpoint_dir, name)?.text())
}

impl GroupStatus {
    /// A table of text: a line per partition (or per member without
    /// partitions).
    pub fn text(&self) -> String {
        let mut text = self.members_text();
        if let Some(scale) = &self.autoscale {
            let age = (chrono::Utc::now().timestamp_millis() - scale.decided_ms) / 1000;
            text.push_str(&format!(
                "autoscale: needs {} processes, has {} ({}; {age} s ago)\n",
                scale.wanted, scale.processes, scale.why
            ));
        }
        text
    }

    fn members_text(&self) -> String {
        if self.members.is_empty() {
            return format!("group {}: no members\n", self.group);
        }
        let mut rows =
            vec![["MEMBER", "SEEN", "PARTITION", "LAG", "CHECKPOINT AGE"].map(String::from)];
        for member in &self.members {
            let seen = match member.stale {
                true => format!("{} s ago (gone?)", member.seen_ms / 1000),
                false => format!("{} s ago", member.seen_ms / 1000),
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
                let lag = match (p.lag, p.checkpoint_offset) {
                    (Some(lag), Some(_)) => lag.to_string(),
                    (Some(lag), None) => format!("{lag} (no checkpoint)"),
                    (None, _) => "?".into(),
                };
                let age = p
                    .checkpoint_age_ms
                    .map_or("none".into(), |ms| format!("{} s", ms / 1000));
                rows.push([
                    member.member.clone(),
                    seen.clone(),
                    p.partition.to_string(),
                    lag,
                    age,
                ]);
            }
        }
        aligned(&rows)
    }
}

/// True if `dir` holds a `groups` folder, where members write their
/// status.
fn has_groups(dir: &Location) -> Result<bool> {
    Ok(dir.folders()?.iter().any(|name| name == "groups"))
}

/// The status files of a group's members, by member.
fn members(dir: &Location) -> Result<Vec<MemberStatus>> {
    let Ok(names) = dir.objects() else {
        return Ok(Vec::new());
    };
    let mut members: Vec<MemberStatus> = names
        .iter()
        .filter(|name| name.ends_with(".json") && name.as_str() != VERDICT_FILE)
        .filter_map(|name| serde_json::from_slice(&dir.child(name).get().ok()??).ok())
        .collect();
    members.sort_by(|a, b| a.member.cmp(&b.member));
    Ok(members)
}

/// The members of the group whose status files are in `dir` and fresh
/// (written in the last [`STALE_MS`]), by name.
pub(super) fn fresh_members(dir: &Location) -> Vec<MemberStatus> {
    let now = chrono::Utc::now().timestamp_millis();
    let mut fresh = members(dir).unwrap_or_default();
    fresh.retain(|m| now - m.updated_ms <= STALE_MS);
    fresh
}

/// A partition's newest checkpoint.
pub(super) struct LastCheckpoint {
    /// When it was taken, epoch milliseconds.
    time_ms: i64,
    /// The offset its pipeline would read on from (the oldest over its
    /// queries).
    pub(super) offset: Option<i64>,
}

/// Per partition, its pipeline's newest checkpoint.
pub(super) fn last_checkpoints(dir: &Location) -> Result<BTreeMap<i32, LastCheckpoint>> {
    let mut out: BTreeMap<i32, LastCheckpoint> = BTreeMap::new();
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
        let entry = out.entry(partition).or_insert(LastCheckpoint {
            time_ms: last.time_ms,
            offset,
        });
        entry.time_ms = entry.time_ms.max(last.time_ms);
        entry.offset = match (entry.offset, offset) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok(out)
}

/// The end offset of every partition of the member's topic; empty when
/// the brokers do not answer.
pub(super) fn high_watermarks(member: &MemberStatus) -> BTreeMap<i32, i64> {
    match ends_client(member) {
        Some(consumer) => end_offsets(&consumer, &member.topic),
        None => BTreeMap::new(),
    }
}

/// A client of the member's brokers that reads end offsets.
pub(super) fn ends_client(member: &MemberStatus) -> Option<BaseConsumer> {
    let endpoint = Endpoint {
        bootstrap: member.bootstrap.clone(),
        topic: member.topic.clone(),
        properties: Vec::new(),
    };
    endpoint.client_config(&[]).create::<BaseConsumer>().ok()
}

/// The end offset of every partition of `topic`, through `consumer`;
/// empty when the brokers do not answer.
pub(super) fn end_offsets(consumer: &BaseConsumer, topic: &str) -> BTreeMap<i32, i64> {
    let timeout = Duration::from_secs(3);
    let Ok(metadata) = consumer.fetch_metadata(Some(topic), timeout) else {
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
            let (_, high) = consumer.fetch_watermarks(topic, p, timeout).ok()?;
            Some((p, high))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(partition: i32, lag: Option<i64>, offset: Option<i64>) -> PartitionView {
        PartitionView {
            partition,
            end_offset: lag.map(|l| l + offset.unwrap_or(0)),
            checkpoint_offset: offset,
            lag,
            checkpoint_age_ms: offset.map(|_| 2_500),
        }
    }

    #[test]
    fn the_table_has_a_line_per_partition() {
        let member = |name: &str, seen_ms, partitions| MemberView {
            member: name.into(),
            topic: "metrics".into(),
            bootstrap: "b:9092".into(),
            seen_ms,
            stale: seen_ms > STALE_MS,
            partitions,
        };
        let status = GroupStatus {
            group: "cpu".into(),
            autoscale: None,
            members: vec![
                member(
                    "a:1",
                    1_200,
                    vec![
                        partition(0, Some(5), Some(100)),
                        partition(1, Some(7), None),
                    ],
                ),
                member("b:2", 12_000, vec![partition(2, None, None)]),
                member("c:3", 0, vec![]),
            ],
        };
        assert_eq!(
            status.text(),
            "MEMBER  SEEN              PARTITION  LAG                CHECKPOINT AGE\n\
             a:1     1 s ago           0          5                  2 s\n\
             a:1     1 s ago           1          7 (no checkpoint)  none\n\
             b:2     12 s ago (gone?)  2          ?                  none\n\
             c:3     0 s ago           -\n"
        );
        let empty = GroupStatus {
            group: "cpu".into(),
            members: vec![],
            autoscale: None,
        };
        assert_eq!(empty.text(), "group cpu: no members\n");
    }

    #[test]
    fn a_directory_without_checkpoints_or_groups_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = Location::local(dir.path());
        let err = group_status(&root, "cpu").unwrap_err().to_string();
        assert!(err.contains("is not a checkpoint directory"), "{err}");
        let missing = Location::local(dir.path().join("nope"));
        let err = group_status(&missing, "cpu").unwrap_err().to_string();
        assert!(err.contains("cannot read"), "{err}");
        // A group directory, but no member of this group in it.
        status_dir(&root, "other").make_folder().unwrap();
        let status = group_status(&root, "cpu").unwrap();
        assert_eq!(status.members, vec![]);
    }

    #[test]
    fn members_are_read_from_their_status_files() {
        let root = Location::parse("memory://group-status/ck").unwrap();
        let dir = status_dir(&root, "cpu");
        for (member, partitions) in [("b:2", vec![1]), ("a:1", vec![0, 2])] {
            let status = MemberStatus {
                member: member.into(),
                topic: "metrics".into(),
                // Nothing listens there: the lags are unknown.
                bootstrap: "127.0.0.1:9".into(),
                partitions,
                updated_ms: chrono::Utc::now().timestamp_millis(),
                load: None,
            };
            let name = format!("{}.json", member.replace(':', "-"));
            dir.child(&name)
                .put(serde_json::to_vec(&status).unwrap())
                .unwrap();
        }
        dir.child("notes.txt")
            .put(b"not a status".to_vec())
            .unwrap();
        let status = group_status(&root, "cpu").unwrap();
        let held: Vec<(&str, Vec<i32>)> = status
            .members
            .iter()
            .map(|m| {
                let partitions = m.partitions.iter().map(|p| p.partition).collect();
                (m.member.as_str(), partitions)
            })
            .collect();
        assert_eq!(held, vec![("a:1", vec![0, 2]), ("b:2", vec![1])]);
        let p = &status.members[0].partitions[0];
        assert_eq!((p.lag, p.checkpoint_age_ms), (None, None));
        assert!(!status.members[0].stale);
    }
}
