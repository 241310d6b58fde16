//! The series queries of the pack (`queries/pack/series/`) on the bundled real data: the
//! NAB machine-temperature series, whose four labelled anomaly windows (NAB
//! `labels/combined_windows.json`) are copied below. The full scoring over 24 NAB series and
//! 8 SMD machines is `benches/detection/score.py`.

use std::path::PathBuf;
use std::process::Command;

/// NAB's labelled windows of `realKnownCause/machine_temperature_system_failure.csv`,
/// inclusive, as ISO text (which sorts like time).
const WINDOWS: [(&str, &str); 4] = [
    ("2013-12-10T06:25:00", "2013-12-12T05:35:00"),
    ("2013-12-15T17:50:00", "2013-12-17T17:00:00"),
    ("2014-01-27T14:20:00", "2014-01-29T13:30:00"),
    ("2014-02-07T14:55:00", "2014-02-09T14:05:00"),
];

/// Runs a pack file on its bundled data; returns the `event_time` of every firing row.
fn firings(file: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("queries/pack/series")
        .join(file);
    let output = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["run", path.to_str().unwrap(), "--format", "csv"])
        .output()
        .expect("run vigil");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{file}: {stderr}");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let state = header
        .iter()
        .position(|c| *c == "state")
        .expect("state column");
    let time = header
        .iter()
        .position(|c| *c == "event_time")
        .expect("event_time column");
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f[state] == "firing")
        .map(|f| f[time].to_string())
        .collect()
}

fn inside(t: &str) -> bool {
    WINDOWS.iter().any(|(a, b)| *a <= t && t <= *b)
}

#[test]
fn robust_z_hourly_detects_every_labelled_failure_window() {
    let fired = firings("robust_z_hourly.sql");
    for (a, b) in WINDOWS {
        assert!(
            fired.iter().any(|t| a <= t.as_str() && t.as_str() <= b),
            "no alert in [{a}, {b}]; alerts: {fired:?}"
        );
    }
    // The per-sample baseline rule raises hundreds of alerts on this series; the hourly
    // rule with hysteresis stays in the tens over 2.5 months.
    let outside = fired.iter().filter(|t| !inside(t)).count();
    assert!(
        outside < 60,
        "{outside} alerts outside the labelled windows"
    );
}
