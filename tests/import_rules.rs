//! `vigil import-rules`: the sample node_exporter rules translate, their
//! translation is the one checked in and checks clean, rules outside the
//! supported PromQL are reported with their reason, and two translated
//! alerts fire at the same evaluations as Prometheus' own `promtool test
//! rules` evaluating the original rules over the same series.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use yaml_rust2::{Yaml, YamlEmitter, YamlLoader};

use crate::support;

/// How long one run of vigil or promtool may take (debug build, 2 cores).
const RUN: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sample_rules() -> PathBuf {
    repo().join("queries/prometheus/node-rules.yml")
}

fn vigil(dir: &Path, args: &[&str]) -> Output {
    support::run_within(
        Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(args)
            .current_dir(dir),
        RUN,
        &format!("vigil {}", args.join(" ")),
    )
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The connector the translation's stream declaration names: the
/// `remote_write` source where this build has it, else `push` (the same
/// columns, fed by a program), so that the rest of the SQL checks either way.
fn connector() -> &'static str {
    match vigil::connectors::registry::source("remote_write") {
        Some(_) => "remote_write",
        None => "push",
    }
}

/// The sample's translation, one file per group, in `dir/sql`.
fn translate_sample(dir: &Path) -> Vec<PathBuf> {
    let out = vigil(
        dir,
        &[
            "import-rules",
            sample_rules().to_str().unwrap(),
            "--out",
            "sql",
            "--connector",
            connector(),
        ],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "import-rules failed: {stderr}");
    assert!(stderr.contains("5 of 5 rules translated"), "{stderr}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("sql"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[test]
fn sample_translation_is_checked_in_and_checks_clean() {
    let dir = tempfile::tempdir().unwrap();
    let files = translate_sample(dir.path());
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["node_alerts.sql", "node_recording.sql"]);
    for file in &files {
        let checked_in = repo()
            .join("queries/prometheus")
            .join(file.file_name().unwrap());
        let checked_in = std::fs::read_to_string(&checked_in)
            .unwrap_or_default()
            .replace(
                "connector = 'remote_write'",
                &format!("connector = '{}'", connector()),
            );
        assert_eq!(
            std::fs::read_to_string(file).unwrap(),
            checked_in,
            "{} differs from the translation; regenerate it with `vigil import-rules queries/prometheus/node-rules.yml --out queries/prometheus`",
            file.display()
        );
        let out = vigil(dir.path(), &["check", file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{} does not check: {}",
            file.display(),
            text(&out.stderr)
        );
    }
    // The same SQL on stdout, the stream declared once.
    let out = vigil(
        dir.path(),
        &["import-rules", sample_rules().to_str().unwrap()],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success());
    assert_eq!(
        stdout
            .matches("CREATE OR REPLACE STREAM prom_samples")
            .count(),
        1
    );
    assert_eq!(stdout.matches("CREATE OR REPLACE ALERT").count(), 4);
    assert_eq!(stdout.matches("CREATE OR REPLACE VIEW").count(), 1);
}

#[test]
fn rules_outside_the_subset_are_reported_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let rules = r#"
groups:
  - name: mixed
    rules:
      - alert: HostDiskWillFillIn24Hours
        expr: predict_linear(node_filesystem_avail_bytes[6h], 24 * 3600) < 0
      - alert: NodeExporterAbsent
        expr: absent(up{job="node"})
      - alert: ReadOnlyDiskFull
        expr: node_filesystem_avail_bytes < 1e9 and on (instance, device) node_filesystem_readonly == 0
      - alert: LoadVsLastWeek
        expr: node_load1 > node_load1 offset 1w
      - alert: Slow
        expr: histogram_quantile(0.99, sum by (le) (rate(http_request_duration_seconds_bucket[5m]))) > 1
      - alert: Down
        expr: up == 0
        annotations:
          summary: "{{ $labels.instance }} down"
"#;
    std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
    let out = vigil(
        dir.path(),
        &["import-rules", "rules.yml", "--stream", "samples"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for (line, rule, reason) in [
        (
            5,
            "HostDiskWillFillIn24Hours",
            "function predict_linear() is not supported",
        ),
        (
            7,
            "NodeExporterAbsent",
            "function absent() is not supported",
        ),
        (
            9,
            "ReadOnlyDiskFull",
            "set operator `and` between two vectors is not supported",
        ),
        (
            11,
            "LoadVsLastWeek",
            "`offset` (in `node_load1 offset 1w`) is not supported",
        ),
        (13, "Slow", "function histogram_quantile() is not supported"),
    ] {
        let expected =
            format!("rules.yml:{line}: group mixed, rule {rule}: not translated: {reason}");
        assert!(stderr.contains(&expected), "no `{expected}` in:\n{stderr}");
        assert!(!stdout.contains(rule), "{rule} was emitted:\n{stdout}");
    }
    assert!(stderr.contains("1 of 6 rules translated"), "{stderr}");
    // The rule that translates is there, over the named stream, undeclared.
    assert!(
        stdout.contains("CREATE OR REPLACE ALERT \"Down\""),
        "{stdout}"
    );
    assert!(stdout.contains("FROM HOP(samples, ts"), "{stdout}");
    assert!(!stdout.contains("CREATE OR REPLACE STREAM"), "{stdout}");
    // A file that is not a rule file is one error.
    std::fs::write(
        dir.path().join("bad.yml"),
        "groups: [{name: g, rules: [{alert: A}]}]",
    )
    .unwrap();
    let out = vigil(dir.path(), &["import-rules", "bad.yml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("error: bad.yml: group 'g': rule 1: no `expr:`"));
}

/// One input series, in promtool's notation.
struct Series {
    name: &'static str,
    labels: &'static [(&'static str, &'static str)],
    /// `a+bxn` (n + 1 values from a, step b), `a-bxn`, `axn` (a, n + 1
    /// times) or a number, separated by spaces.
    values: &'static str,
}

impl Series {
    fn promtool(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{v}\""))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }

    fn expand(&self) -> Vec<f64> {
        let mut out = Vec::new();
        for item in self.values.split_whitespace() {
            let Some((start, times)) = item.split_once('x') else {
                out.push(item.parse().unwrap());
                continue;
            };
            let times: usize = times.parse().unwrap();
            let (first, step) = match start.rfind(['+', '-']).filter(|&i| i > 0) {
                Some(i) => {
                    let step: f64 = start[i + 1..].parse().unwrap();
                    let sign = if &start[i..=i] == "-" { -1.0 } else { 1.0 };
                    (start[..i].parse::<f64>().unwrap(), sign * step)
                }
                None => (start.parse().unwrap(), 0.0),
            };
            out.extend((0..=times).map(|k| first + step * k as f64));
        }
        out
    }

    /// The series as sample rows (JSON lines), one every minute from 0,
    /// with their times.
    fn rows(&self) -> Vec<(i64, String)> {
        let get = |key: &str| {
            self.labels
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .unwrap_or("")
        };
        let rest: serde_json::Map<String, serde_json::Value> = self
            .labels
            .iter()
            .filter(|(k, _)| !matches!(*k, "job" | "instance"))
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        self.expand()
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                let ts = i as i64 * 60_000;
                let row = serde_json::json!({
                    "ts": ts,
                    "job": get("job"),
                    "instance": get("instance"),
                    "name": self.name,
                    "labels": rest,
                    "value": value,
                });
                (ts, row.to_string())
            })
            .collect()
    }
}

const SERIES: &[Series] = &[
    // Instance a goes down from 11m to 21m; b stays up.
    Series {
        name: "up",
        labels: &[("job", "node"), ("instance", "a:9100")],
        values: "1x10 0x10 1x14",
    },
    Series {
        name: "up",
        labels: &[("job", "node"), ("instance", "b:9100")],
        values: "1x36",
    },
    // Two CPUs of a: idle 1 s/s, then busy (idle 0.1 s/s) from 10m to 26m;
    // cpu 1's counter resets at 19m.
    Series {
        name: "node_cpu_seconds_total",
        labels: &[
            ("job", "node"),
            ("instance", "a:9100"),
            ("cpu", "0"),
            ("mode", "idle"),
        ],
        values: "0+60x10 606+6x15 702+60x9",
    },
    Series {
        name: "node_cpu_seconds_total",
        labels: &[
            ("job", "node"),
            ("instance", "a:9100"),
            ("cpu", "1"),
            ("mode", "idle"),
        ],
        values: "0+60x10 606+6x7 0+6x7 48+60x9",
    },
    // Busy time of a, and b idle all along: not idle mode, so not read.
    Series {
        name: "node_cpu_seconds_total",
        labels: &[
            ("job", "node"),
            ("instance", "a:9100"),
            ("cpu", "0"),
            ("mode", "user"),
        ],
        values: "0+1x10 10+54x15 820+1x9",
    },
    Series {
        name: "node_cpu_seconds_total",
        labels: &[
            ("job", "node"),
            ("instance", "b:9100"),
            ("cpu", "0"),
            ("mode", "idle"),
        ],
        values: "0+60x36",
    },
];

/// The two alerts compared, and the labels of their series.
const COMPARED: [&str; 2] = ["InstanceDown", "HostHighCpuLoad"];
/// Evaluation times compared: every minute while every series has samples.
const LAST_MINUTE: i64 = 34;

/// The sample rules with their annotations left out: promtool compares
/// annotations as rendered by Go templates, which vigil's messages render
/// otherwise; what fires and when does not depend on them.
fn rules_without_annotations() -> String {
    let text = std::fs::read_to_string(sample_rules()).unwrap();
    let mut doc = YamlLoader::load_from_str(&text).unwrap().remove(0);
    let Yaml::Hash(root) = &mut doc else {
        panic!("a mapping")
    };
    let Some(Yaml::Array(groups)) = root.get_mut(&Yaml::String("groups".into())) else {
        panic!("groups")
    };
    for group in groups {
        let Yaml::Hash(group) = group else {
            panic!("a group")
        };
        let Some(Yaml::Array(rules)) = group.get_mut(&Yaml::String("rules".into())) else {
            continue;
        };
        for rule in rules {
            let Yaml::Hash(rule) = rule else {
                panic!("a rule")
            };
            rule.remove(&Yaml::String("annotations".into()));
        }
    }
    let mut out = String::new();
    YamlEmitter::new(&mut out).dump(&doc).unwrap();
    out
}

/// When each compared alert is firing according to vigil, per evaluation
/// minute: `alert -> minute -> firing (job, instance)`.
type Firing = BTreeMap<&'static str, BTreeMap<i64, BTreeSet<(String, String)>>>;

/// Runs the translated alerts over the series; returns, per compared
/// alert, the set of firing series at each evaluation minute.
fn vigil_firing(dir: &Path) -> Firing {
    let files = translate_sample(dir);
    let alerts = files
        .iter()
        .find(|f| f.ends_with("node_alerts.sql"))
        .unwrap();
    // In time order, as remote write delivers them: a series written after
    // the others would be late.
    let mut rows: Vec<(i64, String)> = SERIES.iter().flat_map(|s| s.rows()).collect();
    rows.sort_by_key(|r| r.0);
    let rows: Vec<String> = rows.into_iter().map(|r| r.1).collect();
    std::fs::write(dir.join("samples.jsonl"), rows.join("\n") + "\n").unwrap();
    // Swap the remote-write source for the file of rows, as a user would.
    let sql = std::fs::read_to_string(alerts).unwrap().replace(
        &format!("WITH (connector = '{}')", connector()),
        "WITH (path = 'samples.jsonl', format = 'jsonl')",
    );
    assert!(
        sql.contains("samples.jsonl"),
        "no stream declaration to swap:\n{sql}"
    );
    std::fs::write(dir.join("alerts.sql"), sql).unwrap();
    let out = vigil(dir, &["run", "alerts.sql", "--format", "jsonl"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "vigil run: {}", text(&out.stderr));
    // Replay the state changes: event_time is the evaluation time + 1 ms.
    let mut changes: Vec<(i64, &'static str, (String, String), bool)> = Vec::new();
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let alert = row["alert"].as_str().unwrap();
        let Some(alert) = COMPARED.iter().find(|a| **a == alert) else {
            continue;
        };
        let at = event_ms(&row["event_time"]);
        assert_eq!(
            at.rem_euclid(60_000),
            1,
            "not an evaluation time + 1 ms: {line}"
        );
        let key = (
            row["job"].as_str().unwrap().to_string(),
            row["instance"].as_str().unwrap().to_string(),
        );
        changes.push((at / 60_000, alert, key, row["state"] == "firing"));
    }
    changes.sort();
    let mut firing = Firing::new();
    let mut now: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
    let mut next = changes.iter().peekable();
    for minute in 0..=LAST_MINUTE {
        while let Some((_, alert, key, fires)) = next.next_if(|c| c.0 <= minute) {
            let set = now.entry(alert).or_default();
            match fires {
                true => set.insert(key.clone()),
                false => set.remove(key),
            };
        }
        for alert in COMPARED {
            let set = now.get(alert).cloned().unwrap_or_default();
            firing.entry(alert).or_default().insert(minute, set);
        }
    }
    firing
}

/// Epoch milliseconds of a JSON timestamp (text or number).
fn event_ms(value: &serde_json::Value) -> i64 {
    if let Some(n) = value.as_i64() {
        return n;
    }
    let s = value.as_str().expect("a timestamp");
    let parsed =
        chrono::NaiveDateTime::parse_from_str(s.trim_end_matches('Z'), "%Y-%m-%dT%H:%M:%S%.f")
            .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f"))
            .unwrap_or_else(|e| panic!("timestamp {s}: {e}"));
    parsed.and_utc().timestamp_millis()
}

/// A promtool unit test asserting, at every evaluation minute, exactly the
/// alerts vigil had firing then.
fn promtool_test(firing: &Firing) -> String {
    let severity = |alert: &str| match alert {
        "InstanceDown" => "critical",
        _ => "warning",
    };
    let mut out = String::from(
        "rule_files:\n  - rules.yml\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
    );
    for s in SERIES {
        out.push_str(&format!(
            "      - series: '{}'\n        values: '{}'\n",
            s.promtool(),
            s.values
        ));
    }
    out.push_str("    alert_rule_test:\n");
    for (alert, minutes) in firing {
        for (minute, series) in minutes {
            out.push_str(&format!(
                "      - eval_time: {minute}m\n        alertname: {alert}\n        exp_alerts:"
            ));
            if series.is_empty() {
                out.push_str(" []\n");
            }
            out.push('\n');
            for (job, instance) in series {
                out.push_str(&format!(
                    "          - exp_labels: {{severity: {}, job: {job}, instance: '{instance}'}}\n",
                    severity(alert)
                ));
            }
        }
    }
    out
}

#[test]
fn two_translated_alerts_fire_when_prometheus_fires() {
    let promtool = Path::new("/usr/bin/promtool");
    assert!(
        promtool.exists(),
        "promtool is not installed (Debian package prometheus); .ci/run installs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let firing = vigil_firing(dir.path());
    // Both alerts fire and resolve within the series, on instance a only.
    for alert in COMPARED {
        let minutes = &firing[alert];
        let fired: Vec<i64> = minutes
            .iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(m, _)| *m)
            .collect();
        assert!(!fired.is_empty(), "{alert} never fired: {firing:?}");
        assert!(
            fired.last() < Some(&LAST_MINUTE),
            "{alert} never resolved: {fired:?}"
        );
        assert!(
            minutes.values().flatten().all(|(_, i)| i == "a:9100"),
            "{alert}: {minutes:?}"
        );
    }
    std::fs::write(dir.path().join("rules.yml"), rules_without_annotations()).unwrap();
    let test = promtool_test(&firing);
    std::fs::write(dir.path().join("test.yml"), &test).unwrap();
    let out = support::run_within(
        Command::new(promtool)
            .args(["test", "rules", "test.yml"])
            .current_dir(dir.path()),
        RUN,
        "promtool test rules",
    );
    assert!(
        out.status.success(),
        "Prometheus disagrees with vigil's firing times:\n{}{}\nvigil: {firing:?}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn series_notation_expands_as_promtool_does() {
    let s = Series {
        name: "x",
        labels: &[],
        values: "1+2x2 5 3x1 10-1x2",
    };
    assert_eq!(s.expand(), [1.0, 3.0, 5.0, 5.0, 3.0, 3.0, 10.0, 9.0, 8.0]);
}
