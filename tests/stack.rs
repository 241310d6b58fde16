//! The real monitoring programs that vigil's connectors talk to (Prometheus,
//! node_exporter, Alertmanager), started for one test on 127.0.0.1 with a
//! free port and a temporary data directory, and stopped when dropped
//! (with its process group, through `tests/support`; the kernel kills it if
//! the test binary dies first).
//!
//! They come from Debian (`prometheus`, `prometheus-node-exporter`,
//! `prometheus-alertmanager`); `.ci/run` installs them. A missing program
//! fails the test with the package to install: these tests never pass by
//! skipping.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, Guarded};

/// How long a program may take to answer its readiness endpoint.
const READY: Duration = Duration::from_secs(60);

/// How long one HTTP request to a program (or to vigil) may take.
const HTTP: Duration = Duration::from_secs(30);

/// An HTTP client whose every request ends within [`HTTP`]; a non-2xx
/// answer is an error, as with `ureq::get`.
pub(crate) fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(HTTP))
        .build()
        .into()
}

/// A running program, killed (and its directory removed) when dropped:
/// the guard is declared before `dir`, so the program is gone before its
/// directory goes.
pub(crate) struct Program {
    name: &'static str,
    /// Held for its drop, which kills the program's process group.
    _child: Guarded,
    /// Its port on 127.0.0.1.
    pub(crate) port: u16,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Program {
    /// `http://127.0.0.1:PORT` followed by `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its temporary directory (configuration and data).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What it wrote on stdout and stderr so far, for failure messages.
    pub(crate) fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        format!("--- {} log ---\n{text}", self.name)
    }
}

/// A port on 127.0.0.1 that nothing listens on now.
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The path of `binary`, or a failure naming the Debian package.
pub(crate) fn require(binary: &str, package: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/usr/sbin"] {
        let path = Path::new(dir).join(binary);
        if path.exists() {
            return path;
        }
    }
    panic!(
        "{binary} is not installed: these tests need the real program \
         (`apt-get install {package}`; .ci/run installs it)"
    );
}

/// Starts `binary` with `args(port, dir)` and waits until `ready_path`
/// answers 200 on its port.
fn start(
    name: &'static str,
    binary: &str,
    package: &str,
    ready_path: &str,
    args: impl FnOnce(u16, &Path) -> Vec<String>,
) -> Program {
    let path = require(binary, package);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let port = free_port();
    let log = dir.path().join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    let child = support::spawn(
        Command::new(path)
            .args(args(port, dir.path()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out),
        binary,
    );
    let program = Program {
        name,
        _child: child,
        port,
        dir,
        log,
    };
    wait_ready(&program, ready_path);
    program
}

fn wait_ready(program: &Program, path: &str) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let deadline = Instant::now() + READY;
    while Instant::now() < deadline {
        if let Ok(answer) = agent.get(&program.url(path)).call()
            && answer.into_parts().0.status == 200
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "{} did not become ready on port {}\n{}",
        program.name,
        program.port,
        program.log()
    );
}

/// node_exporter with its default collectors, on a free port.
pub(crate) fn node_exporter() -> Program {
    start(
        "node_exporter",
        "prometheus-node-exporter",
        "prometheus-node-exporter",
        "/metrics",
        |port, _| vec![format!("--web.listen-address=127.0.0.1:{port}")],
    )
}

/// Alertmanager with `config` (YAML) as its configuration; with `None`, one
/// route to a receiver that sends nowhere (alerts are then only seen
/// through its API). Clustering is off.
pub(crate) fn alertmanager(config: Option<&str>) -> Program {
    let config = config
        .unwrap_or("route:\n  receiver: 'null'\n  group_wait: 1s\nreceivers:\n  - name: 'null'\n")
        .to_string();
    start(
        "alertmanager",
        "prometheus-alertmanager",
        "prometheus-alertmanager",
        "/-/ready",
        move |port, dir| {
            let file = dir.join("alertmanager.yml");
            std::fs::write(&file, config).expect("write alertmanager.yml");
            vec![
                format!("--config.file={}", file.display()),
                format!("--storage.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--cluster.listen-address=".into(),
            ]
        },
    )
}

/// Prometheus with `config` (the text of prometheus.yml) and `extra`
/// flags (for example `--web.enable-remote-write-receiver`), its TSDB in
/// the temporary directory.
pub(crate) fn prometheus(config: &str, extra: &[&str]) -> Program {
    let config = config.to_string();
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    start(
        "prometheus",
        "prometheus",
        "prometheus",
        "/-/ready",
        move |port, dir| {
            let file = dir.join("prometheus.yml");
            std::fs::write(&file, config).expect("write prometheus.yml");
            let mut args = vec![
                format!("--config.file={}", file.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ];
            args.extend(extra);
            args
        },
    )
}

#[test]
fn the_programs_start_and_answer() {
    let node = node_exporter();
    let body = http()
        .get(&node.url("/metrics"))
        .call()
        .expect("node_exporter answers")
        .body_mut()
        .read_to_string()
        .expect("text");
    assert!(body.contains("node_cpu_seconds_total"), "{}", node.log());
    let am = alertmanager(None);
    assert!(am.dir().join("alertmanager.yml").exists());
    let prom = prometheus("global:\n  scrape_interval: 1s\n", &[]);
    assert_ne!(prom.address(), am.address());
}
