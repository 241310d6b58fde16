//! The `prometheus` source against the real node_exporter (`stack.rs`),
//! through the `vigil` binary: queries over its real samples, a disk-full
//! alert, and a target that is down next to a live one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use crate::stack;
use crate::support::run_within;

/// How long a run of a few scrapes may take, and node_exporter to answer.
const PATIENCE: Duration = Duration::from_secs(120);

/// The scrapes' interval and timeout: node_exporter collects everything
/// at each scrape, which on a loaded machine can take over a second.
const INTERVAL: &str = "5 seconds";

/// Runs `vigil run q.sql` in `dir` with `sql` as the script.
fn run(dir: &Path, sql: &str) -> Output {
    std::fs::write(dir.join("q.sql"), sql).expect("write q.sql");
    run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["run", "q.sql"])
            .current_dir(dir),
        PATIENCE,
        "vigil run scraping node_exporter",
    )
}

/// The rows of a CSV file written by a sink, as column -> value maps.
fn rows(path: &Path) -> Vec<BTreeMap<String, String>> {
    let mut reader =
        csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = reader.headers().expect("a header").clone();
    reader
        .records()
        .map(|r| {
            let r = r.expect("a record");
            header
                .iter()
                .zip(r.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn number(row: &BTreeMap<String, String>, column: &str) -> f64 {
    row[column]
        .parse()
        .unwrap_or_else(|_| panic!("{column} is not a number in {row:?}"))
}

/// The page node_exporter serves now.
fn page(node: &stack::Program) -> String {
    ureq::Agent::config_builder()
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent()
        .get(&node.url("/metrics"))
        .call()
        .expect("node_exporter answers")
        .body_mut()
        .read_to_string()
        .expect("text")
}

/// A field of /proc/meminfo, in bytes.
fn meminfo(field: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/meminfo"));
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number of kB");
    kib * 1024.0
}

fn check(out: &Output, node: &stack::Program) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}\n{}", node.log());
    stderr
}

#[test]
fn memory_and_cpu_of_a_real_node_exporter() {
    let node = stack::node_exporter();
    let cpu_series = page(&node)
        .lines()
        .filter(|l| l.starts_with("node_cpu_seconds_total{"))
        .count();
    assert!(cpu_series > 0, "{}", node.log());
    let dir = tempfile::tempdir().expect("temp dir");
    let sql = format!(
        "CREATE STREAM node (ts TIMESTAMP, instance TEXT, name TEXT, value DOUBLE,
           WATERMARK FOR ts AS ts)
           WITH (connector = 'prometheus', targets = '{}', interval = '{INTERVAL}',
                 timeout = '{INTERVAL}', limit = '3',
                 match = 'node_cpu_seconds_total|node_memory_.*');
         CREATE SINK mem WITH (path = 'mem.csv');
         CREATE SINK cpu WITH (path = 'cpu.csv');
         INSERT INTO mem
         SELECT window_end, instance, avg(value) AS available, count(*) AS n
         FROM TUMBLE(node, ts, INTERVAL '1' SECOND)
         WHERE name = 'node_memory_MemAvailable_bytes'
         GROUP BY window_end, instance;
         INSERT INTO cpu
         SELECT window_end, count(*) AS n, min(value) AS least, count(DISTINCT name) AS names
         FROM TUMBLE(node, ts, INTERVAL '1' SECOND)
         WHERE name LIKE 'node_cpu%'
         GROUP BY window_end;",
        node.url("/metrics")
    );
    let out = run(dir.path(), &sql);
    let stderr = check(&out, &node);
    assert!(stderr.contains("vigil: stream node: rows="), "{stderr}");
    assert!(stderr.contains(" bad=0"), "{stderr}");

    // One MemAvailable sample per scrape, three scrapes.
    let mem = rows(&dir.path().join("mem.csv"));
    let samples: f64 = mem.iter().map(|r| number(r, "n")).sum();
    assert_eq!(samples, 3.0, "{mem:?}");
    let total = meminfo("MemTotal");
    let now = meminfo("MemAvailable");
    for row in &mem {
        assert_eq!(row["instance"], node.address());
        let available = number(row, "available");
        assert!(available > 0.0 && available <= total, "{row:?}");
        // node_exporter read the same /proc/meminfo a few seconds earlier.
        assert!(
            (available - now).abs() < total / 4.0,
            "{available} vs {now}"
        );
    }

    // Every node_cpu_seconds_total series of the page, each scrape; CPU
    // seconds are counters since boot, never negative.
    let cpu = rows(&dir.path().join("cpu.csv"));
    let samples: f64 = cpu.iter().map(|r| number(r, "n")).sum();
    assert_eq!(samples, 3.0 * cpu_series as f64, "{cpu:?}");
    for row in &cpu {
        assert!(number(row, "least") >= 0.0, "{row:?}");
        assert_eq!(row["names"], "1", "{row:?}");
    }
}

/// The mountpoints of the page whose filesystem has less available than
/// its size: all of them, as root keeps blocks back and something is used.
fn mountpoints_not_empty(page: &str) -> BTreeSet<String> {
    let value = |metric: &str| -> BTreeMap<String, f64> {
        page.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .filter_map(|l| {
                let start = l.find("mountpoint=\"")? + "mountpoint=\"".len();
                let end = start + l[start..].find('"')?;
                let v = l.rsplit(' ').next()?.parse().ok()?;
                Some((l[start..end].to_string(), v))
            })
            .collect()
    };
    let (avail, size) = (
        value("node_filesystem_avail_bytes"),
        value("node_filesystem_size_bytes"),
    );
    avail
        .iter()
        .filter(|(m, a)| size.get(*m).is_some_and(|s| *s > 0.0 && *a < s))
        .map(|(m, _)| m.clone())
        .collect()
}

#[test]
fn a_disk_full_alert_fires_per_mountpoint() {
    let node = stack::node_exporter();
    let expected = mountpoints_not_empty(&page(&node));
    assert!(
        !expected.is_empty(),
        "no filesystem on the page\n{}",
        node.log()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    // The threshold must fire here: less than 100 % free.
    let sql = format!(
        "CREATE STREAM fs (ts TIMESTAMP, instance TEXT, name TEXT, labels MAP<TEXT, TEXT>,
           value DOUBLE, WATERMARK FOR ts AS ts)
           WITH (connector = 'prometheus', targets = '{}', interval = '{INTERVAL}',
                 timeout = '{INTERVAL}', limit = '2',
                 match = 'node_filesystem_(avail|size)_bytes');
         CREATE SINK pages WITH (path = 'alerts.csv');
         CREATE ALERT disk_full AS
           SELECT window_end, instance, labels['mountpoint'] AS mountpoint,
                  100 * sum(CASE WHEN name = 'node_filesystem_avail_bytes' THEN value END)
                      / sum(CASE WHEN name = 'node_filesystem_size_bytes' THEN value END)
                      AS free_pct
           FROM TUMBLE(fs, ts, INTERVAL '1' SECOND)
           GROUP BY window_end, instance, labels['mountpoint']
         ALERT BY instance, mountpoint WHEN free_pct < 100
           SEVERITY 'warning' MESSAGE '{{mountpoint}} on {{instance}}: {{free_pct:.1}} % free';
         INSERT INTO pages SELECT * FROM disk_full;",
        node.address()
    );
    let out = run(dir.path(), &sql);
    check(&out, &node);
    let alerts = rows(&dir.path().join("alerts.csv"));
    let firing: BTreeSet<String> = alerts
        .iter()
        .filter(|r| r["state"] == "firing")
        .map(|r| r["mountpoint"].clone())
        .collect();
    assert_eq!(firing, expected, "{alerts:?}");
    for row in alerts.iter().filter(|r| r["state"] == "firing") {
        let free = number(row, "free_pct");
        assert!((0.0..100.0).contains(&free), "{row:?}");
        assert_eq!(row["severity"], "warning");
        assert!(
            row["message"].starts_with(&format!("{} on {}: ", row["mountpoint"], node.address())),
            "{row:?}"
        );
    }
}

#[test]
fn a_down_target_gives_up_0_and_the_live_one_its_samples() {
    let node = stack::node_exporter();
    let closed = stack::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let sql = format!(
        "CREATE STREAM node (ts TIMESTAMP, job TEXT, instance TEXT, name TEXT, value DOUBLE,
           WATERMARK FOR ts AS ts)
           WITH (connector = 'prometheus', targets = '127.0.0.1:{closed}, {}',
                 interval = '{INTERVAL}', timeout = '{INTERVAL}', limit = '2',
                 match = 'node_memory_MemAvailable_bytes');
         CREATE SINK out WITH (path = 'out.csv');
         INSERT INTO out SELECT job, instance, name, value FROM node;",
        node.url("/metrics")
    );
    let out = run(dir.path(), &sql);
    let stderr = check(&out, &node);
    assert!(
        stderr.contains(&format!(
            "vigil: warning: stream node: target http://127.0.0.1:{closed}/metrics is down: "
        )),
        "{stderr}"
    );
    let rows = rows(&dir.path().join("out.csv"));
    let of = |instance: &str, name: &str| -> Vec<f64> {
        rows.iter()
            .filter(|r| r["instance"] == instance && r["name"] == name)
            .map(|r| number(r, "value"))
            .collect()
    };
    let dead = format!("127.0.0.1:{closed}");
    let live = node.address();
    assert_eq!(of(&dead, "up"), [0.0, 0.0], "{rows:?}");
    assert_eq!(of(&dead, "scrape_samples_scraped"), [0.0, 0.0]);
    assert!(of(&dead, "node_memory_MemAvailable_bytes").is_empty());
    assert_eq!(of(&live, "up"), [1.0, 1.0], "{rows:?}");
    assert_eq!(
        of(&live, "scrape_samples_post_metric_relabeling"),
        [1.0, 1.0]
    );
    let available = of(&live, "node_memory_MemAvailable_bytes");
    assert_eq!(available.len(), 2, "{rows:?}");
    assert!(available.iter().all(|&v| v > 0.0));
    assert!(
        of(&live, "scrape_samples_scraped")
            .iter()
            .all(|&n| n > 100.0)
    );
    // 2 scrapes x (4 report series + MemAvailable) + 2 x 4 for the dead one.
    assert_eq!(rows.len(), 18, "{rows:?}");
    assert!(rows.iter().all(|r| r["job"] == "node"));
}
