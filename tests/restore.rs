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
    // The harness runs each stage as one chain.
    engine.set_parallelism(1).expect("a parallelism");
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
            Chain::new(ops.into_ops()).with_snapshots(Box::new(move |_, op, state| {
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

// --- other stateful operators (opsb)

/// Rows of two hosts for alerts: `a` holds above 90 from 1 s, stays
/// between the thresholds at 4 s, drops below 50 at 6 s and holds again
/// from 8 s; `b` holds from 2 s and resolves at 11 s. Some rows come out of
/// order, inside the watermark's delay.
const ALERT_ROWS: &str = "ts,host,cpu
1000,a,95
2000,b,95
3000,a,96
2500,b,97
4000,a,70
5000,b,96
6000,a,40
8000,a,92
7000,b,97
9000,a,93
10500,a,99
11000,b,10
12000,a,20
15000,b,99";

const ALERT_STREAM: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (path = 'm.csv');\n";

#[test]
fn an_alert_with_for_and_hysteresis_restores_mid_episode() {
    assert_restores(
        &format!(
            "{ALERT_STREAM}CREATE ALERT hot AS SELECT ts, host, cpu FROM m
             ALERT BY host WHEN cpu > 90 FOR INTERVAL '2' SECOND RESOLVE WHEN cpu < 50;"
        ),
        &[("m.csv", ALERT_ROWS)],
    );
}

#[test]
fn an_alert_with_resolve_message_restores() {
    assert_restores(
        &format!(
            "{ALERT_STREAM}CREATE ALERT hot AS SELECT ts, host, cpu FROM m
             ALERT BY host WHEN cpu > 90 RESOLVE WHEN cpu < 50 SEVERITY 'critical'
             RESOLVE MESSAGE '{{host}} {{state}}: down to {{cpu:.1}}, high since {{since}}'
             MESSAGE '{{host}} {{state}}: {{cpu:.1}}';"
        ),
        &[("m.csv", ALERT_ROWS)],
    );
}

#[test]
fn an_alert_without_keys_restores() {
    assert_restores(
        &format!(
            "{ALERT_STREAM}CREATE ALERT hot AS SELECT ts, cpu FROM m
             ALERT WHEN cpu > 90 RESOLVE WHEN cpu < 50;"
        ),
        &[("m.csv", ALERT_ROWS)],
    );
}

#[test]
fn a_deadman_alert_restores_its_silent_keys() {
    assert_restores(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, WATERMARK FOR ts AS ts) WITH (path = 'm.csv');
         CREATE ALERT quiet AS SELECT ts, host FROM m
         ALERT BY host WHEN ABSENT FOR INTERVAL '10' SECOND SEVERITY 'warning'
           MESSAGE 'no data from {host} since {since}';",
        &[(
            "m.csv",
            "ts,host\n0,a\n0,b\n5000,a\n5000,b\n12000,a\n30000,b\n40000,a\n41000,b\n60000,b",
        )],
    );
}

const PROCS: &str = "ts,parent,child
1000,sshd,bash
2000,apache,php
3000,sshd,scp
5000,sshd,bash
9000,apache,php
13000,sshd,nc
14000,apache,sh
15000,sshd,nc
17000,apache,sh
18000,cron,ls
19000,cron,ls";

#[test]
fn an_invariant_restores_while_training_and_after() {
    for mode in ["OFFLINE", "ONLINE"] {
        assert_restores(
            &format!(
                "CREATE STREAM procs (ts TIMESTAMP, parent TEXT, child TEXT, WATERMARK FOR ts AS ts)
                 WITH (path = 'procs.csv');
                 CREATE INVARIANT children AS SELECT ts, parent, child FROM procs
                   LEARN SET OF child BY parent TRAIN FOR INTERVAL '10' SECOND MODE {mode};
                 SELECT ts, parent, child, violation, learned FROM children;"
            ),
            &[("procs.csv", PROCS)],
        );
    }
}

#[test]
fn a_range_invariant_restores_with_and_without_keys() {
    assert_restores(
        &format!(
            "{STREAM}CREATE INVARIANT usual AS SELECT ts, host, cpu FROM m
               LEARN RANGE OF cpu BY host TRAIN FOR 2 WINDOWS MODE ONLINE;
             SELECT ts, host, cpu, violation, learned FROM usual;"
        ),
        &[("m.csv", METRICS)],
    );
    // Without keys: one range for the whole stream.
    assert_restores(
        &format!(
            "{STREAM}CREATE INVARIANT usual AS SELECT ts, cpu FROM m
               LEARN RANGE OF cpu TRAIN FOR 3 WINDOWS MODE OFFLINE;
             SELECT ts, cpu, violation, learned FROM usual;"
        ),
        &[("m.csv", METRICS)],
    );
}

/// Per-host 5 s averages, the input of the window functions below.
const PER_HOST: &str = "CREATE VIEW per_host AS
  SELECT window_end, host, avg(cpu) AS v, max(cpu) AS peak
  FROM TUMBLE(m, ts, INTERVAL '5' SECOND) GROUP BY window_end, host;\n";

#[test]
fn over_lag_and_moving_averages_restore() {
    assert_restores(
        &format!(
            "{STREAM}{PER_HOST}SELECT window_end, host, v,
               lag(v) OVER (PARTITION BY host ORDER BY window_end) AS prev,
               lag(v, 2, 0.0) OVER (PARTITION BY host ORDER BY window_end) AS prev2,
               avg(v) OVER (PARTITION BY host ORDER BY window_end
                            ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS ma3,
               min(peak) OVER (PARTITION BY host ORDER BY window_end
                               ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS low2,
               sum(v) OVER (PARTITION BY host ORDER BY window_end
                            RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total,
               max(peak) OVER (ORDER BY window_end) AS peak_so_far,
               stddev(v) OVER (PARTITION BY host ORDER BY window_end) AS spread,
               row_number() OVER (PARTITION BY host ORDER BY window_end) AS k
             FROM per_host;"
        ),
        &[("m.csv", METRICS)],
    );
}

#[test]
fn ewma_and_mad_over_a_keys_history_restore() {
    assert_restores(
        &format!(
            "{STREAM}{PER_HOST}SELECT window_end, host, v,
               ewma(v, 0.3) OVER (PARTITION BY host ORDER BY window_end) AS smooth,
               ewma(v, 0.5) OVER (PARTITION BY host ORDER BY window_end
                                  ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS smooth3,
               mad(v) OVER (PARTITION BY host ORDER BY window_end
                            ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) AS mad3
             FROM per_host;"
        ),
        &[("m.csv", METRICS)],
    );
}

#[test]
fn peer_functions_and_an_outlier_alert_restore() {
    assert_restores(
        &format!(
            "{STREAM}{PER_HOST}SELECT window_end, host, v,
               v - median(v) OVER (PARTITION BY window_end) AS dev,
               rank() OVER (PARTITION BY window_end ORDER BY v DESC) AS r
             FROM per_host;"
        ),
        &[("m.csv", METRICS)],
    );
    assert_restores(
        &format!(
            "{STREAM}{PER_HOST}CREATE ALERT outlier AS
               SELECT window_end, host, v, robust_z(v) OVER (PARTITION BY window_end) AS z
               FROM per_host
             ALERT WHEN abs(z) > 0.5 MESSAGE '{{host}} is {{z:.2}} MADs from its peers';"
        ),
        &[("m.csv", METRICS)],
    );
}

#[test]
fn an_alert_over_windows_for_n_windows_restores() {
    assert_restores(
        &format!(
            "{STREAM}{PER_HOST}CREATE ALERT hot AS SELECT window_end, host, v FROM per_host
             ALERT WHEN v > 3 FOR 2 WINDOWS RESOLVE WHEN v < 2;"
        ),
        &[("m.csv", METRICS)],
    );
}

#[test]
fn a_limit_restores_the_rows_it_has_passed() {
    assert_restores(
        &format!("{STREAM}SELECT ts, host, cpu FROM m WHERE cpu > 1 LIMIT 5 OFFSET 2;"),
        &[("m.csv", METRICS)],
    );
}

/// Every input's batches of a planned query, interleaved: a batch of
/// input 0, one of input 1, ... while any is left.
fn interleaved_inputs(graph: &QueryGraph) -> Vec<(usize, RecordBatch)> {
    let mut per_input: Vec<std::collections::VecDeque<RecordBatch>> = Vec::new();
    for input in &graph.inputs {
        let mut config = input.stream.source.clone();
        config.batch_size = 2;
        let mut batches = std::collections::VecDeque::new();
        read_source(&config, &SourceStats::default(), &mut |b| {
            batches.push_back(b);
            true
        })
        .expect("reads");
        per_input.push(batches);
    }
    let mut all = Vec::new();
    while per_input.iter().any(|b| !b.is_empty()) {
        for (index, batches) in per_input.iter_mut().enumerate() {
            all.extend(batches.pop_front().map(|b| (index, b)));
        }
    }
    all
}

/// The merge operator's rows for `steps`, and at the end of input.
fn merge_rows(
    join: &mut dyn vigil::exec::MergeOperator,
    steps: &[(usize, RecordBatch)],
    end: bool,
) -> Vec<String> {
    for (input, batch) in steps {
        join.on_rows(*input, batch.clone()).expect("takes rows");
    }
    let mut out = Vec::new();
    if end {
        join.on_watermark(END_OF_INPUT, &mut out).expect("runs");
    }
    out.iter().flat_map(rows).collect()
}

#[test]
fn a_batch_query_over_two_inputs_restores_each_inputs_rows() {
    let script = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE) WITH (path = 'm.csv');
        CREATE STREAM hosts (host TEXT, team TEXT) WITH (path = 'hosts.csv');
        SELECT h.team, m.host, count(*) AS n, sum(m.cpu) AS total
        FROM m JOIN hosts h ON m.host = h.host
        GROUP BY h.team, m.host ORDER BY h.team, m.host;";
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), format!("{METRICS}\n")).expect("writes");
    let hosts = "host,team\na,web\nb,web\nc,db\nd,ops\n";
    std::fs::write(dir.path().join("hosts.csv"), hosts).expect("writes");
    let fresh = || {
        plan(script, dir.path(), ExecutionMode::MicroBatch)
            .join
            .expect("a batch query over two inputs merges them")
            .instances
            .remove(0)
    };
    let steps = interleaved_inputs(&plan(script, dir.path(), ExecutionMode::MicroBatch));
    let straight = merge_rows(fresh().as_mut(), &steps, true);
    assert_eq!(straight.len(), 3, "{straight:?}");
    for cut in 0..=steps.len() {
        let mut first = fresh();
        merge_rows(first.as_mut(), &steps[..cut], false);
        let state = first.snapshot().expect("snapshots").expect("a state");
        let carried_on = merge_rows(first.as_mut(), &steps[cut..], true);
        assert_eq!(
            carried_on, straight,
            "carrying on after a snapshot at {cut}"
        );
        let mut restored = fresh();
        restored.restore(state).expect("restores");
        let after = merge_rows(restored.as_mut(), &steps[cut..], true);
        assert_eq!(after, straight, "restored at {cut}");
    }
}

#[test]
fn a_batch_query_restores_the_rows_it_has_collected() {
    assert_restores(
        &format!(
            "{STREAM}SELECT host, count(*) AS n, sum(cpu) AS total FROM m
             GROUP BY host ORDER BY total DESC, host;"
        ),
        &[("m.csv", METRICS)],
    );
}

// --- aggregating operators (opsa)

/// Two keys (one of them NULL on some rows), NULL values, out-of-order
/// rows, and rows that arrive after their window fired: with a delay of
/// one second, 4000 comes after the watermark passed 10000 and 14000 after
/// it passed 20000; 5000 comes after 15000.
const LATE_METRICS: &str = "ts,host,dc,cpu
1000,a,x,1.0
2000,b,y,5.0
1500,,x,2.25
2500,a,y,
11000,a,x,3.0
4000,a,x,2.0
12500,,y,7.0
16000,b,x,
5000,b,y,4.0
21000,a,x,6.0
14000,a,x,2.5
22000,b,y,0.1
31000,b,x,9.5
32000,,x,0.3";

fn late_stream(lateness: &str) -> String {
    let with = match lateness {
        "" => String::new(),
        l => format!(", allowed_lateness = '{l}'"),
    };
    format!(
        "CREATE STREAM m (ts TIMESTAMP, host TEXT, dc TEXT, cpu DOUBLE, \
         WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (path = 'm.csv'{with});\n"
    )
}

fn restores_over_late_metrics(lateness: &str, query: &str) {
    assert_restores(
        &format!("{}{query}", late_stream(lateness)),
        &[("m.csv", LATE_METRICS)],
    );
}

const BASIC_AGGREGATES: &str = "count(*) AS n, count(cpu) AS n_cpu, sum(cpu) AS total, \
     avg(cpu) AS mean, min(cpu) AS lo, max(cpu) AS hi, count(DISTINCT host) AS hosts";

#[test]
fn a_tumbling_window_restores_with_every_basic_aggregate() {
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, window_end, host, {BASIC_AGGREGATES}
             FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host;"
        ),
    );
}

#[test]
fn a_tumbling_window_restores_with_several_keys_and_null_keys() {
    restores_over_late_metrics(
        "",
        "SELECT window_start, dc, host, count(*) AS n, sum(cpu) AS total
         FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, dc, host;",
    );
}

#[test]
fn a_window_without_keys_restores() {
    restores_over_late_metrics(
        "",
        "SELECT window_end, count(*) AS n, avg(cpu) AS mean
         FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end;",
    );
}

#[test]
fn a_hopping_window_restores_panes_shared_by_windows() {
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, window_end, host, {BASIC_AGGREGATES}
             FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '15' SECOND)
             GROUP BY window_start, window_end, host;"
        ),
    );
}

#[test]
fn quantiles_and_vigil_aggregates_restore_in_windows() {
    let quantiles = "median(cpu) AS med, percentile_cont(cpu, 0.9) AS p90, \
         approx_percentile_cont(cpu, 0.5) AS ap50, approx_percentile(cpu, 0.9) AS sk90, \
         mad(cpu) AS spread, stddev(cpu) AS sd";
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, host, {quantiles}, ewma(cpu, 0.3) AS smooth
             FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, host;"
        ),
    );
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, host, {quantiles}
             FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
             GROUP BY window_start, host;"
        ),
    );
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, window_end, host, {quantiles}
             FROM SESSION(m, ts, INTERVAL '3' SECOND) GROUP BY window_start, window_end, host;"
        ),
    );
}

#[test]
fn session_windows_restore_open_and_merging_sessions() {
    restores_over_late_metrics(
        "",
        &format!(
            "SELECT window_start, window_end, host, {BASIC_AGGREGATES}
             FROM SESSION(m, ts, INTERVAL '3' SECOND) GROUP BY window_start, window_end, host;"
        ),
    );
    restores_over_late_metrics(
        "",
        "SELECT window_start, window_end, count(*) AS n, sum(cpu) AS total
         FROM SESSION(m, ts, INTERVAL '2' SECOND) GROUP BY window_start, window_end;",
    );
}

#[test]
fn cascading_windows_restore() {
    restores_over_late_metrics(
        "",
        "SELECT window_end, count(*) AS hosts, sum(n) AS rows_in, max(total) AS top
         FROM (
           SELECT window_start, window_end, host, count(*) AS n, sum(cpu) AS total
           FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
           GROUP BY window_start, window_end, host
         )
         GROUP BY window_start, window_end;",
    );
    restores_over_late_metrics(
        "",
        "CREATE VIEW per_host AS
           SELECT window_start, window_end, host, avg(cpu) AS mean
           FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, window_end, host;
         SELECT window_start, count(*) AS hosts, max(mean) AS top
         FROM per_host GROUP BY window_start, window_end;",
    );
}

#[test]
fn allowed_lateness_restores_windows_that_fire_again() {
    let query = |window: &str| {
        format!(
            "SELECT window_start, window_end, host, count(*) AS n, sum(cpu) AS total, \
             median(cpu) AS med FROM {window} GROUP BY window_start, window_end, host;"
        )
    };
    for window in [
        "TUMBLE(m, ts, INTERVAL '10' SECOND)",
        "HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)",
        "SESSION(m, ts, INTERVAL '3' SECOND)",
    ] {
        restores_over_late_metrics("5 seconds", &query(window));
    }
}

#[test]
fn emit_changes_restores_what_each_key_last_emitted() {
    restores_over_late_metrics(
        "",
        "SELECT host, count(*) AS n, sum(cpu) AS total, max(cpu) AS hi, median(cpu) AS med,
                count(DISTINCT dc) AS dcs
         FROM m GROUP BY host EMIT CHANGES;",
    );
    restores_over_late_metrics(
        "",
        "SELECT dc, host, max(cpu) AS hi, mad(cpu) AS spread, approx_percentile(cpu, 0.5) AS sk50
         FROM m GROUP BY dc, host EMIT CHANGES;",
    );
    restores_over_late_metrics(
        "",
        "SELECT count(*) AS n, min(cpu) AS lo FROM m EMIT CHANGES;",
    );
    restores_over_late_metrics(
        "5 seconds",
        "SELECT window_start, host, count(*) AS n, max(cpu) AS hi
         FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_start, host EMIT CHANGES;",
    );
}

#[test]
fn emit_every_restores_windows_without_ticks() {
    restores_over_late_metrics(
        "",
        "SELECT window_start, host, sum(cpu) AS total
         FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
         GROUP BY window_start, host EMIT EVERY INTERVAL '1' HOUR;",
    );
}

/// Early results come on processing-time ticks, which the harness does not
/// send: here the query is cut after every batch, restored, and both the
/// original and the copy are ticked, then fed the rest, then ticked again.
#[test]
fn emit_every_restores_which_windows_changed_since_the_last_tick() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("m.csv"), LATE_METRICS).expect("writes");
    let script = format!(
        "{}SELECT window_start, host, sum(cpu) AS total, count(*) AS n
         FROM HOP(m, ts, INTERVAL '5' SECOND, INTERVAL '10' SECOND)
         GROUP BY window_start, host EMIT EVERY INTERVAL '1' HOUR;",
        late_stream("")
    );
    let mode = ExecutionMode::MicroBatch;
    let input = read_input(&plan(&script, dir.path(), mode), mode);
    let ticked = |chains: &mut Vec<Chain>, from: usize| -> Vec<String> {
        let mut rows = tick(chains);
        for message in messages(&input[from..]) {
            rows.extend(feed(chains, message));
            rows.extend(tick(chains));
        }
        rows
    };
    for cut in 0..=input.len() {
        let taken = Taken::default();
        let mut first = chains(plan(&script, dir.path(), mode), &taken);
        for batch in &input[..cut] {
            feed(&mut first, Message::Batch(batch.clone()));
        }
        feed(&mut first, Message::Barrier(1));
        let mut restored = chains(plan(&script, dir.path(), mode), &Taken::default());
        for (stage, op, state) in std::mem::take(&mut *taken.lock().unwrap()) {
            if let Some(state) = state {
                restored[stage].restore(op, state).expect("restores");
            }
        }
        let carried_on = ticked(&mut first, cut);
        assert!(carried_on.iter().any(|r| r.starts_with("Early")));
        assert_eq!(ticked(&mut restored, cut), carried_on, "cut at batch {cut}");
    }
}

/// Ticks every chain, each one's output going through the chains after it.
fn tick(chains: &mut [Chain]) -> Vec<String> {
    let mut rows = Vec::new();
    for i in 0..chains.len() {
        let mut current = chains[i].tick().expect("ticks");
        for chain in chains[i + 1..].iter_mut() {
            let mut next = Vec::new();
            for m in current {
                next.extend(chain.process(m).expect("processes"));
            }
            current = next;
        }
        rows.extend(current.iter().flat_map(rows_of));
    }
    rows
}

fn rows_of(message: &Message) -> Vec<String> {
    rows(message)
}
