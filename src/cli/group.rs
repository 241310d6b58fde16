//! `vigil run --group NAME` (one member of a group sharing a Kafka topic)
//! and `vigil group NAME` (what the members hold).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::checkpoints::aligned;
use super::{RunArgs, Stopper, checkpoint_config, prepare_queries};
use crate::connectors::kafka::{Endpoint, KafkaSource};
use crate::connectors::{OutputFormat, make_labelled_sink, open_sink};
use crate::engine::PreparedQuery;
use crate::error::{Error, Result};
use crate::runtime::group::{GroupConfig, MemberStatus, Pipelines, run_group, status_dir};
use crate::runtime::live::{Live, NamedQuery};
use crate::runtime::{RunReport, RunnableQuery};
use crate::state::store::{Location, QueryStore, query_folders};

/// Runs this process as a member of group `name` until a signal: `queries`
/// (planned once over every partition) say what the group reads.
pub(super) async fn run(
    args: &RunArgs,
    name: &str,
    queries: &[PreparedQuery],
    stopper: Option<&Stopper>,
) -> Result<()> {
    let endpoint = group_topic(queries)?;
    let Some(dir) = &args.checkpoints.checkpoint_dir else {
        return Err(Error::Plan(
            "--group needs --checkpoint-dir: the members share their state there".into(),
        ));
    };
    let live = Live::with_checkpoints(checkpoint_config(dir, &args.checkpoints));
    let leave = Arc::new(AtomicBool::new(false));
    if let Some(stopper) = stopper {
        let leave = leave.clone();
        stopper.watch_with(
            &RunReport::default(),
            Box::new(move || leave.store(true, Ordering::Relaxed)),
        );
    }
    let config = GroupConfig {
        name: name.to_string(),
        endpoint,
        checkpoint_dir: dir.clone(),
    };
    let args = args.clone();
    let pipelines: Pipelines = Box::new(move |partition| pipeline(&args, partition));
    eprintln!("vigil: joining group {name}");
    run_group(&live, config, pipelines, leave).await?;
    eprintln!("vigil: left group {name}");
    Ok(())
}

/// The topic every query reads, which the group splits. In a group each
/// query reads that topic and keeps state per key only: a query over every
/// key would see only the keys of its process's partitions.
fn group_topic(queries: &[PreparedQuery]) -> Result<Endpoint> {
    let mut topic: Option<Endpoint> = None;
    for (i, query) in queries.iter().enumerate() {
        let label = format!("query {} (line {})", i + 1, query.line);
        let mut kafka_inputs = 0;
        for input in &query.graph.inputs {
            let reader = input.stream.source.location.reader();
            let Some(source) =
                reader.and_then(|r| (r as &dyn std::any::Any).downcast_ref::<KafkaSource>())
            else {
                return Err(Error::Plan(format!(
                    "--group: {label} reads stream {}, which is not a kafka stream: in a group every query reads the group's topic",
                    input.stream.name
                )));
            };
            kafka_inputs += 1;
            let mut endpoint = source.endpoint.clone();
            endpoint.properties.retain(|(k, _)| k != "group.id");
            match &topic {
                None => topic = Some(endpoint),
                Some(t) if t.topic == endpoint.topic && t.bootstrap == endpoint.bootstrap => {}
                Some(t) => {
                    return Err(Error::Plan(format!(
                        "--group: {label} reads topic {} at {}, another query topic {} at {}: a group shares one topic",
                        endpoint.topic, endpoint.bootstrap, t.topic, t.bootstrap
                    )));
                }
            }
        }
        if kafka_inputs == 0 {
            return Err(Error::Plan(format!("--group: {label} reads no stream")));
        }
        if let Some(operator) = query.graph.global_stage() {
            return Err(Error::Plan(format!(
                "--group: {label} keeps state over every key ({operator}); in a group each process sees only the keys of its partitions, so it would give a part of the answer. Such queries do not run in a group yet: run them in one process"
            )));
        }
    }
    topic.ok_or_else(|| Error::Plan("--group: the scripts have no query".into()))
}

/// The queries of `partition`'s pipeline, named `<query>-p<partition>`.
fn pipeline(args: &RunArgs, partition: i32) -> Result<Vec<NamedQuery>> {
    let format = args.format.map_or(OutputFormat::Csv, OutputFormat::from);
    prepare_queries(args, Some(partition))?
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            let label = format!("q{}-p{partition}", i + 1);
            let sink = match &q.sink {
                Some(config) => open_sink(config, &q.graph.schema)?,
                None => make_labelled_sink(format, &label, Box::new(std::io::stdout())),
            };
            Ok(NamedQuery {
                query: RunnableQuery {
                    graph: q.graph,
                    sink,
                },
                name: q.name.map(|n| format!("{n}-p{partition}")),
                label,
            })
        })
        .collect()
}

#[derive(Debug, clap::Args)]
pub(super) struct GroupArgs {
    /// The group's name, as given to `vigil run --group`.
    name: String,
    /// The checkpoint directory the members share.
    #[arg(long, value_name = "DIR", value_parser = Location::parse)]
    checkpoint_dir: Location,
}

/// A member whose status is older than this has probably died.
const STALE_MS: i64 = 10_000;

/// Prints group `args.name`'s members, their partitions, each partition's
/// lag (messages after its last checkpoint) and checkpoint age.
pub(super) fn show(args: GroupArgs) -> Result<()> {
    let members = members(&status_dir(&args.checkpoint_dir, &args.name))?;
    if members.is_empty() {
        println!("group {}: no members", args.name);
        return Ok(());
    }
    let now = chrono::Utc::now().timestamp_millis();
    let checkpoints = last_checkpoints(&args.checkpoint_dir)?;
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
    print!("{}", aligned(&rows));
    Ok(())
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
