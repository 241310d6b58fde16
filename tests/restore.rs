//! Snapshot and restore of every operator of a query, in process: a query
//! is run over its input once straight; then, for every batch boundary, a
//! checkpoint barrier is sent at that point, every operator's snapshot is
//! restored into a freshly planned copy of the query, and the copy reads
//! the rest. The rows before the barrier plus the copy's rows must equal
//! the straight run, row for row and in order; so must the rows of the
//! first query when it simply carries on after its snapshot.
//!
//! [`assert_restores`] takes a script whose last statement is a query over
//! one stream. Multi-input queries (joins, unions) are covered by the
//! operators' unit tests and the end-to-end checkpoint cases.

use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::array_value_to_string;
use vigil::connectors::{SourceStats, read_source};
use vigil::engine::{Engine, Outcome};
use vigil::exec::{Chain, END_OF_INPUT, Message};
use vigil::planner::{ExecutionMode, QueryGraph};
use vigil::sql::parse_script;
use vigil::state::OperatorState;

/// Snapshots taken at a barrier: (stage, operator index, state).
type Taken = Arc<Mutex<Vec<(usize, usize, Option<OperatorState>)>>>;

fn plan(script: &str, dir: &Path, mode: ExecutionMode) -> QueryGraph {
    let mut engine = Engine::new();
    engine.set_execution_mode(mode);
    let mut graph = None;
    for statement in parse_script(script).expect("parses") {
        if let Outcome::Query(query) = engine.execute(&statement, dir).expect("plans") {
            graph = Some(query.graph);
        }
    }
    graph.expect("the script ends with a query")
}

/// The query's chains, first to last, each sending its snapshots to `taken`.
fn chains(graph: QueryGraph, taken: &Taken) -> Vec<Chain> {
    assert_eq!(graph.inputs.len(), 1, "one input");
    assert!(graph.join.is_none(), "no join");
    let QueryGraph { inputs, stages, .. } = graph;
    let input = inputs.into_iter().next().expect("one input");
    input
        .stages
        .into_iter()
        .chain(stages)
        .enumerate()
        .map(|(stage, ops)| {
            let taken = taken.clone();
            Chain::new(ops).with_snapshots(Box::new(move |_, op, state| {
                taken.lock().unwrap().push((stage, op, state));
                Ok(())
            }))
        })
        .collect()
}

/// The input's batches as its source reads them, one row each in
/// per-record mode.
fn read_input(graph: &QueryGraph, mode: ExecutionMode) -> Vec<RecordBatch> {
    let mut config = graph.inputs[0].stream.source.clone();
    config.batch_size = 3;
    let mut batches = Vec::new();
    read_source(&config, &SourceStats::default(), &mut |b| {
        batches.push(b);
        true
    })
    .expect("reads");
    match mode {
        ExecutionMode::PerRecord => batches
            .iter()
            .flat_map(|b| (0..b.num_rows()).map(|r| b.slice(r, 1)))
            .collect(),
        _ => batches,
    }
}

/// Runs `message` through every chain; the result rows, one string each.
fn feed(chains: &mut [Chain], message: Message) -> Vec<String> {
    let mut current = vec![message];
    for chain in chains.iter_mut() {
        let mut next = Vec::new();
        for m in current {
            next.extend(chain.process(m).expect("processes"));
        }
        current = next;
    }
    current.iter().flat_map(rows).collect()
}

fn rows(message: &Message) -> Vec<String> {
    let (batch, kind) = match message {
        Message::Batch(b) => (b, "".to_string()),
        Message::Changes(b, k) => (b, format!("{k:?} ")),
        _ => return Vec::new(),
    };
    (0..batch.num_rows())
        .map(|r| {
            let values: Vec<String> = batch
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, r).expect("prints"))
                .collect();
            format!("{kind}{}", values.join(","))
        })
        .collect()
}

fn messages(batches: &[RecordBatch]) -> impl Iterator<Item = Message> + '_ {
    batches
        .iter()
        .cloned()
        .map(Message::Batch)
        .chain([Message::Watermark(END_OF_INPUT)])
}

/// Runs the script's last query straight and restored at every batch
/// boundary, in both execution modes, and checks that the outputs agree.
/// `files` are written into a temp dir the script's paths are relative to.
pub fn assert_restores(script: &str, files: &[(&str, &str)]) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), format!("{text}\n")).expect("writes");
    }
    for mode in [ExecutionMode::MicroBatch, ExecutionMode::PerRecord] {
        check_mode(script, dir.path(), mode);
    }
}

fn check_mode(script: &str, dir: &Path, mode: ExecutionMode) {
    let taken = Taken::default();
    let graph = plan(script, dir, mode);
    let input = read_input(&graph, mode);
    let mut straight_chains = chains(graph, &taken);
    let straight: Vec<String> = messages(&input)
        .flat_map(|m| feed(&mut straight_chains, m))
        .collect();
    assert!(!straight.is_empty(), "the query gives rows");
    for cut in 0..=input.len() {
        let taken = Taken::default();
        let mut first = chains(plan(script, dir, mode), &taken);
        let mut before: Vec<String> = messages(&input[..cut])
            .take(cut)
            .flat_map(|m| feed(&mut first, m))
            .collect();
        before.extend(feed(&mut first, Message::Barrier(1)));
        let snapshots = std::mem::take(&mut *taken.lock().unwrap());
        let carried_on: Vec<String> = messages(&input[cut..])
            .flat_map(|m| feed(&mut first, m))
            .collect();
        assert_eq!(
            [before.clone(), carried_on].concat(),
            straight,
            "{mode:?}: carrying on after a snapshot at batch {cut} changed the output"
        );
        let mut restored = chains(plan(script, dir, mode), &Taken::default());
        for (stage, op, state) in snapshots {
            if let Some(state) = state {
                restored[stage].restore(op, state).expect("restores");
            }
        }
        let after: Vec<String> = messages(&input[cut..])
            .flat_map(|m| feed(&mut restored, m))
            .collect();
        assert_eq!(
            [before, after].concat(),
            straight,
            "{mode:?}: restoring a snapshot taken at batch {cut} changed the output"
        );
    }
}

const METRICS: &str = "ts,host,cpu
1000,a,1.0
2000,b,5.0
3500,a,3.0
4000,c,7.0
6000,a,2.0
6500,b,9.0
9000,a,4.0
12000,c,8.0
13000,b,1.0
21000,a,6.0
25000,b,2.0
31000,a,9.5";

const STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (path = 'm.csv');\n";

#[test]
fn a_stateless_query_passes_barriers_and_restores_as_is() {
    assert_restores(
        &format!("{STREAM}SELECT ts, host, cpu FROM m WHERE cpu > 2;"),
        &[("m.csv", METRICS)],
    );
}
