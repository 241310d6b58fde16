//! A group that autoscales (`SET autoscale = 'on'` in `vigil run --group`)
//! reports the processes its topic's rate needs and runs its hook once
//! when that number changes. The query spends a known CPU time per row
//! (`test_row_cost`, in debug builds), so that a process's capacity is
//! about 4,000 rows per second on two cores whatever the machine: a
//! trickle needs one process, a burst of 12,000 rows all four (one per
//! partition).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::mocking::MockCluster;

use crate::kafka::{member, produce_hosts};
use crate::support;

/// The longest the group may take to report a verdict of the kind awaited.
const VERDICT_LIMIT: Duration = Duration::from_secs(120);

fn script(bootstrap: &str) -> String {
    format!(
        "SET autoscale = 'on';
         SET autoscale.interval = '1s';
         SET autoscale.cooldown = '1h';
         SET autoscale.hook = 'echo \"$VIGIL_GROUP $VIGIL_GROUP_WANTED $VIGIL_GROUP_PROCESSES\" >> hook.txt';
         CREATE STREAM metrics (ts TIMESTAMP, host TEXT, cpu DOUBLE,
           WATERMARK FOR ts AS ts - INTERVAL '5' SECOND)
         WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'metrics',
               properties.session.timeout.ms = '6000',
               properties.heartbeat.interval.ms = '500');
         CREATE SINK out WITH (connector = 'kafka', bootstrap = '{bootstrap}', topic = 'out',
               key = 'host');
         CREATE VIEW costly AS SELECT ts, host, test_row_cost(cpu, 500) AS cpu FROM metrics;
         INSERT INTO out
           SELECT window_start, host, count(*) AS n, sum(cpu) AS total
           FROM TUMBLE(costly, ts, INTERVAL '1' MINUTE)
           GROUP BY window_start, window_end, host;"
    )
}

/// The leader's last verdict, as `autoscale.json` beside the status files.
fn verdict(dir: &Path) -> Option<serde_json::Value> {
    let text = fs::read_to_string(dir.join("ck/groups/cpu/autoscale.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Waits for a verdict decided after `after` (epoch ms) that `accept`s.
fn next_verdict(
    dir: &Path,
    after: i64,
    what: &str,
    accept: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut seen = Vec::new();
    let found = support::wait_until_or(VERDICT_LIMIT, || {
        let v = verdict(dir)?;
        if seen.last() != Some(&v) {
            seen.push(v.clone());
        }
        (v["decided_ms"].as_i64() > Some(after) && accept(&v)).then_some(v)
    });
    let stderr = fs::read_to_string(dir.join("a.stderr")).unwrap_or_default();
    let seen: Vec<String> = seen.iter().map(|v| v.to_string()).collect();
    found.unwrap_or_else(|| {
        panic!(
            "waited {VERDICT_LIMIT:?} for {what}; verdicts:\n{}\nstderr:\n{stderr}",
            seen.join("\n")
        )
    })
}

fn hook_lines(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("hook.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn a_group_reports_the_processes_its_rate_needs_and_runs_its_hook_once() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("metrics", 4, 1).unwrap();
    cluster.create_topic("out", 1, 1).unwrap();
    let bootstrap = cluster.bootstrap_servers();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    fs::write(dir.join("q.sql"), script(&bootstrap)).unwrap();
    let mut a = member(dir, "a");

    // A trickle: six rows every half second.
    let trickling = Arc::new(AtomicBool::new(true));
    let trickle = {
        let (bootstrap, on) = (bootstrap.clone(), trickling.clone());
        std::thread::spawn(move || {
            let mut second = 0;
            while on.load(Ordering::Relaxed) {
                produce_hosts(&bootstrap, 6, second..second + 1);
                second += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            second
        })
    };
    let calm = next_verdict(dir, 0, "a verdict on the trickle", |v| {
        v["offered"].as_f64().is_some_and(|o| o > 0.0) && v["capacity"].is_number()
    });
    assert_eq!(calm["wanted"], 1, "{calm}");
    assert_eq!(calm["processes"], 1, "{calm}");
    trickling.store(false, Ordering::Relaxed);
    let seconds = support::join_within(trickle, Duration::from_secs(60), "the trickle");
    assert!(hook_lines(dir).is_empty(), "{:?}", hook_lines(dir));

    // A burst: 12,000 rows as fast as the producer sends them.
    produce_hosts(&bootstrap, 6, seconds..seconds + 2000);
    let busy = next_verdict(
        dir,
        calm["decided_ms"].as_i64().unwrap(),
        "a verdict that wants more processes",
        |v| v["wanted"].as_u64() > Some(1),
    );
    let wanted = busy["wanted"].as_u64().unwrap();
    assert!(wanted <= 4, "at most one process per partition: {busy}");
    let listing = support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .current_dir(dir)
            .args(["group", "cpu", "--checkpoint-dir", "ck"]),
        Duration::from_secs(60),
        "vigil group cpu",
    );
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    assert!(listing.contains("autoscale: needs "), "{listing}");

    // The hook ran once, with the number and the processes there were;
    // the verdicts after it (the burst over, back to one) fall within its
    // cool-down.
    let mut after = busy["decided_ms"].as_i64().unwrap();
    for _ in 0..3 {
        after = next_verdict(dir, after, "a later verdict", |_| true)["decided_ms"]
            .as_i64()
            .unwrap();
    }
    let lines = hook_lines(dir);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let ran: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(ran[0], "cpu");
    assert!(ran[1].parse::<u64>().unwrap() > 1, "{lines:?}");
    assert_eq!(ran[2], "1", "{lines:?}");
    let stderr = crate::kafka::terminate(dir, "a", &mut a);
    assert!(stderr.contains("autoscale.hook for "), "{stderr}");
}
