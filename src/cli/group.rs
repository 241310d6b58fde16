//! `vigil run --group NAME` (one member of a group sharing a Kafka topic)
//! and `vigil group NAME` (what the members hold).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{RunArgs, Stopper, checkpoint_config, prepare_queries};
use crate::connector::OutputFormat;
use crate::connectors::kafka::exchange::{ExchangeReader, ExchangeSink, Route, ensure_topic};
use crate::connectors::kafka::{Endpoint, KafkaSource};
use crate::connectors::{make_labelled_sink, open_sink};
use crate::engine::PreparedQuery;
use crate::error::{Error, Result};
use crate::group::status::status_text;
use crate::group::{GroupConfig, Pipelines, run_group};
use crate::plan::StreamDef;
use crate::plan::catalog::BufferSetting;
use crate::planner::QueryGraph;
use crate::runtime::autoscale::AutoscaleSettings;
use crate::runtime::live::{Live, NamedQuery};
use crate::runtime::{RunReport, RunnableQuery};
use crate::state::store::Location;

/// A flag that SIGINT or SIGTERM sets: the member of [`run`] leaves its
/// group.
pub(super) fn leave_on_signal(stopper: Option<&Stopper>) -> Arc<AtomicBool> {
    let leave = Arc::new(AtomicBool::new(false));
    if let Some(stopper) = stopper {
        let leave = leave.clone();
        stopper.watch_with(
            &RunReport::default(),
            Box::new(move || leave.store(true, Ordering::Relaxed)),
        );
    }
    leave
}

/// The checkpoint directory the members of a group share.
fn shared_dir(args: &RunArgs) -> Result<&Location> {
    args.checkpoints.checkpoint_dir.as_ref().ok_or_else(|| {
        Error::Plan("--group needs --checkpoint-dir: the members share their state there".into())
    })
}

/// The runtime a member's pipelines run in, checkpointed in the shared
/// directory; a caller that keeps a clone sees its queries (`vigil serve
/// --group` shows them in `GET /metrics`).
pub(super) fn member_runtime(args: &RunArgs) -> Result<Live> {
    let dir = shared_dir(args)?;
    Ok(Live::with_checkpoints(checkpoint_config(
        dir,
        &args.checkpoints,
    )))
}

/// Runs this process as a member of group `name` in `live` (from
/// [`member_runtime`]) until `leave` is set, then leaves the group:
/// `queries` (planned once over every partition) say what the group
/// reads.
pub(super) async fn run(
    args: &RunArgs,
    name: &str,
    (queries, autoscale): (Vec<PreparedQuery>, Option<AutoscaleSettings>),
    live: Live,
    leave: Arc<AtomicBool>,
) -> Result<()> {
    let endpoint = group_topic(&queries)?;
    let dir = shared_dir(args)?;
    let exchanges = Exchanges {
        group: name.to_string(),
        partitions: partition_count(&endpoint)?,
        endpoint: endpoint.clone(),
    };
    let mut internal: Vec<Endpoint> = Vec::new();
    for q in &queries {
        match cut_of(q)? {
            Cut::Whole => {}
            cut => internal.push(exchanges.endpoint(q, cut)),
        }
    }
    // The queries are planned again per partition; these are done with.
    drop(queries);
    for endpoint in &internal {
        ensure_topic(endpoint, exchanges.partitions).await?;
    }
    let config = GroupConfig {
        name: name.to_string(),
        endpoint,
        checkpoint_dir: dir.clone(),
        autoscale,
        checkpoint_interval: args.checkpoints.checkpoint_interval,
    };
    let args = args.clone();
    let pipelines: Pipelines = Box::new(move |partition| pipeline(&args, &exchanges, partition));
    eprintln!("vigil: joining group {name}");
    run_group(&live, config, pipelines, leave).await?;
    eprintln!("vigil: left group {name}");
    Ok(())
}

/// The topic every query reads, which the group splits. In a group each
/// query reads that topic and keeps state per key only: a query over every
/// key would see only the keys of its process's partitions.
pub(super) fn group_topic(queries: &[PreparedQuery]) -> Result<Endpoint> {
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
        let cut = cut_of(query).map_err(|why| {
            Error::Plan(format!("--group: {label}: {why}; run it in one process"))
        })?;
        if matches!(cut, Cut::Repartition(_)) && query.name.is_none() {
            return Err(Error::Plan(format!(
                "--group: {label} re-partitions its rows and has no name to keep its exchange's checkpoints under: set query_name"
            )));
        }
        if query.graph.global_stage().is_some() && query.name.is_none() {
            return Err(Error::Plan(format!(
                "--group: {label} keeps state over every key and has no name to keep its exchange's checkpoints under: set query_name"
            )));
        }
    }
    topic.ok_or_else(|| Error::Plan("--group: the scripts have no query".into()))
}

/// Where a query of a group is cut between two processes' parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Not at all: every pipeline runs all of it over its partition.
    Whole,
    /// Before stage `.0`, which keeps state over every key: partition 0's
    /// pipeline runs it and the rest for the group.
    Global(usize),
    /// Before stage `.0`, keyed otherwise than the group's topic: each
    /// pipeline runs it and the rest over the keys of its partition.
    Repartition(usize),
}

/// Where `query` is cut in a group: first where its rows must be
/// re-partitioned (when its stream says how its topic is partitioned),
/// else before a stage over every key. An error says why it cannot be.
fn cut_of(query: &PreparedQuery) -> Result<Cut> {
    if let Some(columns) = partitioned_by(query)
        && let Some(at) = query.graph.repartition_point(&columns)?
    {
        return Ok(Cut::Repartition(at));
    }
    Ok(query
        .graph
        .global_split_point()?
        .map_or(Cut::Whole, Cut::Global))
}

/// What `query`'s Kafka stream says its topic is partitioned by.
fn partitioned_by(query: &PreparedQuery) -> Option<Vec<String>> {
    let reader = query
        .graph
        .inputs
        .first()?
        .stream
        .source
        .location
        .reader()?;
    let source = (reader as &dyn std::any::Any).downcast_ref::<KafkaSource>()?;
    source.partitioned_by.clone()
}

/// Where the queries of a group that are cut hand their rows on: one
/// internal topic per query, with as many partitions as the group's
/// topic.
struct Exchanges {
    group: String,
    /// The group's topic: the internal topics are on its brokers.
    endpoint: Endpoint,
    /// The group's topic's partitions.
    partitions: i32,
}

impl Exchanges {
    /// The internal topic of `query` for `cut`: `<group>-<query>-global`
    /// or `<group>-<query>-repartition`.
    fn endpoint(&self, query: &PreparedQuery, cut: Cut) -> Endpoint {
        let name = query.name.as_deref().unwrap_or("query");
        let kind = match cut {
            Cut::Global(_) => "global",
            _ => "repartition",
        };
        let topic: String = format!("{}-{name}-{kind}", self.group)
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
                _ => '_',
            })
            .collect();
        Endpoint {
            topic,
            ..self.endpoint.clone()
        }
    }
}

/// How many partitions the group's topic has, waiting for the brokers and
/// the topic (up to a minute).
fn partition_count(endpoint: &Endpoint) -> Result<i32> {
    let what = format!("the partitions of {}", endpoint.topic);
    let consumer: BaseConsumer = endpoint
        .client_config(&[])
        .create()
        .map_err(|e| Error::Connector(format!("kafka: {what}: {e}")))?;
    let mut last = String::new();
    for attempt in 0..12 {
        if attempt > 0 {
            eprintln!("vigil: warning: group: {what}: {last}; retrying");
            std::thread::sleep(Duration::from_secs(5));
        }
        match consumer.fetch_metadata(Some(&endpoint.topic), Duration::from_secs(5)) {
            Ok(metadata) => {
                let count = metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == endpoint.topic && t.error().is_none())
                    .map_or(0, |t| t.partitions().len() as i32);
                if count > 0 {
                    return Ok(count);
                }
                last = "the topic has no partitions".into();
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(Error::Connector(format!("kafka: {what}: {last}")))
}

/// The queries of `partition`'s pipeline, named `<query>-p<partition>`. A
/// query that is cut (see [`Cut`]) runs its part before the cut here and
/// writes it to its exchange. The part after, from the exchange into the
/// query's sink, runs here too: for a query over every key only in
/// partition 0's pipeline, named `<query>-global`, over every partition's
/// rows; for one re-partitioned in every pipeline, named
/// `<query>-r<partition>`, over the rows of the keys of its partition.
fn pipeline(args: &RunArgs, exchanges: &Exchanges, partition: i32) -> Result<Vec<NamedQuery>> {
    let mut out = Vec::new();
    for (i, q) in prepare_queries(args, Some(partition))?
        .into_iter()
        .enumerate()
    {
        let label = format!("q{}-p{partition}", i + 1);
        match cut_of(&q)? {
            Cut::Whole => {
                let sink = query_sink(args, &q, &label)?;
                out.push(NamedQuery {
                    name: q.name.map(|n| format!("{n}-p{partition}")),
                    query: RunnableQuery {
                        graph: q.graph,
                        sink,
                    },
                    label,
                });
            }
            cut => out.extend(cut_parts(args, exchanges, q, (i, partition), cut)?),
        }
    }
    Ok(out)
}

/// The part after a cut that a pipeline runs.
struct Tail {
    /// The internal topic's partitions it reads.
    reads: Vec<i32>,
    /// Its name, which its checkpoints are kept under.
    name: String,
    /// Its label in messages.
    label: String,
    /// The label of its results on stdout.
    sink_label: String,
}

/// The parts of query `q` (the `i`-th of the scripts) cut at `cut` that
/// `partition`'s pipeline runs (see [`pipeline`]).
fn cut_parts(
    args: &RunArgs,
    exchanges: &Exchanges,
    q: PreparedQuery,
    (i, partition): (usize, i32),
    cut: Cut,
) -> Result<Vec<NamedQuery>> {
    let name = q.name.clone().unwrap_or_default();
    let (at, tail) = match cut {
        Cut::Global(at) => (
            at,
            (partition == 0).then(|| Tail {
                reads: (0..exchanges.partitions).collect(),
                name: format!("{name}-global"),
                label: format!("q{}-global", i + 1),
                sink_label: format!("q{}", i + 1),
            }),
        ),
        Cut::Repartition(at) => (
            at,
            Some(Tail {
                reads: vec![partition],
                name: format!("{name}-r{partition}"),
                label: format!("q{}-r{partition}", i + 1),
                sink_label: format!("q{}-p{partition}", i + 1),
            }),
        ),
        Cut::Whole => unreachable!("a whole query is not cut"),
    };
    let endpoint = exchanges.endpoint(&q, cut);
    let sink = match &tail {
        Some(tail) => Some(query_sink(args, &q, &tail.sink_label)?),
        None => None,
    };
    let mode = q.graph.mode;
    let schema = q.graph.schema.clone();
    let idle_timeout = q.graph.inputs[0].stream.idle_timeout;
    let split = q.graph.split(at);
    let route = match cut {
        Cut::Repartition(_) => Route::ByKey {
            keys: split.tail[0].keys.clone().unwrap_or_default(),
            partitions: exchanges.partitions,
        },
        _ => Route::Own(partition),
    };
    let transactional_id = format!("vigil-{}-p{partition}", endpoint.topic);
    let writer = ExchangeSink::open(&endpoint, &transactional_id, partition, route)?;
    let mut out = vec![NamedQuery {
        name: Some(format!("{name}-p{partition}")),
        query: RunnableQuery {
            graph: split.head,
            sink: Box::new(writer),
        },
        label: format!("q{}-p{partition}", i + 1),
    }];
    let (Some(tail), Some(sink)) = (tail, sink) else {
        return Ok(out);
    };
    let reader = ExchangeReader {
        endpoint,
        partitions: tail.reads,
        writers: exchanges.partitions,
        boundary: split.boundary.clone(),
        input_topic: exchanges.endpoint.topic.clone(),
        idle_timeout,
    };
    let stream = exchange_stream(&name, reader);
    let graph = QueryGraph::remote_tail(stream, split.boundary, split.tail, schema, mode);
    out.push(NamedQuery {
        name: Some(tail.name),
        query: RunnableQuery { graph, sink },
        label: tail.label,
    });
    Ok(out)
}

/// The sink a query's results go to: its own, or stdout.
fn query_sink(
    args: &RunArgs,
    q: &PreparedQuery,
    label: &str,
) -> Result<Box<dyn crate::connector::Sink>> {
    let format = args.format.map_or(OutputFormat::Csv, OutputFormat::from);
    match &q.sink {
        Some(config) => open_sink(config, &q.graph.schema),
        None => Ok(make_labelled_sink(
            format,
            label,
            Box::new(std::io::stdout()),
        )),
    }
}

/// The stream the part over every key of query `name` reads: its
/// exchange.
fn exchange_stream(name: &str, reader: ExchangeReader) -> Arc<StreamDef> {
    let stream = format!("exchange({name})");
    let schema = reader.schema();
    Arc::new(StreamDef {
        name: stream.clone(),
        schema: schema.clone(),
        event_time: None,
        delay_ms: 0,
        lateness_ms: 0,
        idle_timeout: None,
        source: Arc::new(reader).source_config(&stream),
        late_of: None,
        buffer: BufferSetting::default(),
    })
}

#[derive(Debug, clap::Args)]
pub(super) struct GroupArgs {
    /// The group's name, as given to `vigil run --group`.
    name: String,
    /// The checkpoint directory the members share.
    #[arg(long, value_name = "DIR", value_parser = Location::parse)]
    checkpoint_dir: Location,
}

/// Prints group `args.name`'s members, their partitions, each partition's
/// lag (messages after its last checkpoint) and checkpoint age.
pub(super) fn show(args: GroupArgs) -> Result<()> {
    print!("{}", status_text(&args.checkpoint_dir, &args.name)?);
    Ok(())
}
