//! What every test that starts a process or waits needs: a child that dies
//! with its test, runs and waits with a deadline that say what they waited
//! for. Every spawn and wait in the suite goes through here; the test
//! `bare_waits_stay_in_the_support_module` refuses a bare `.wait()`,
//! `.output()` or `.wait_with_output()` anywhere else.
//!
//! Why process groups and `PR_SET_PDEATHSIG`: a guard's `Drop` does not run
//! when the test binary is killed (a runner's timeout, a SIGKILL), and a
//! child that outlives its test loads every later run on the machine. The
//! kernel kills a child whose parent thread ends; `Drop` kills the child's
//! whole group (it may have started programs of its own).

use std::io::Read;
use std::ops::{Deref, DerefMut};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child process in its own process group, killed with it when the guard
/// drops and by the kernel when the thread that started it ends (so start
/// it on the test's own thread, not on a helper thread that ends first).
pub(crate) struct Guarded {
    child: std::process::Child,
    what: String,
}

/// Starts `command` guarded; `what` names it in failures.
pub(crate) fn spawn(command: &mut Command, what: &str) -> Guarded {
    command.process_group(0);
    die_with_test(command);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    Guarded {
        child,
        what: what.to_string(),
    }
}

/// Makes the kernel kill the child `command` starts when the thread that
/// starts it ends (for children another library forks, such as rexpect's
/// shell; [`spawn`] does this itself).
pub(crate) fn die_with_test(command: &mut Command) {
    // SAFETY: prctl and getppid are async-signal-safe; nothing is allocated
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other(
                    "the test ended before its child started",
                ));
            }
            Ok(())
        });
    }
}

impl Guarded {
    /// Waits for the exit, at most `limit`; past it the child's group is
    /// killed and the test fails naming what it waited for.
    pub(crate) fn wait_within(&mut self, limit: Duration) -> ExitStatus {
        match self.wait_for_exit(limit) {
            Some(status) => status,
            None => {
                self.kill_group();
                panic!("{} did not exit within {limit:?}", self.what)
            }
        }
    }

    /// The exit status if the child exits within `limit`, else `None` (the
    /// child keeps running).
    pub(crate) fn wait_for_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit within `limit`, collecting stdout and stderr if
    /// they were piped (drained on threads, so a full pipe never blocks).
    pub(crate) fn output_within(self, limit: Duration) -> Output {
        let what = self.what.clone();
        let (output, timed_out) = self.output_or_kill(limit);
        assert!(
            !timed_out,
            "{what} did not exit within {limit:?}; its stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Like [`Guarded::output_within`], but a child still running at
    /// `limit` is killed with its group and its output so far returned,
    /// with `true` for "timed out".
    pub(crate) fn output_or_kill(mut self, limit: Duration) -> (Output, bool) {
        let out = drain(self.child.stdout.take());
        let err = drain(self.child.stderr.take());
        let exited = self.wait_for_exit(limit);
        if exited.is_none() {
            self.kill_group();
        }
        let status = match exited {
            Some(status) => status,
            None => self
                .child
                .try_wait()
                .ok()
                .flatten()
                .expect("a killed child is reaped"),
        };
        let (stdout, stderr) = (join(out), join(err));
        let output = Output {
            status,
            stdout,
            stderr,
        };
        (output, exited.is_none())
    }

    /// Sends SIGKILL to the child's whole group and reaps the child.
    pub(crate) fn kill_group(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: a plain syscall; the group id is the child's pid.
            unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
            let _ = self.child.kill();
            let _ = self.child.wait();
        } else {
            // The child is gone; its group may not be.
            unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        }
    }

    /// Sends `signal` to the child alone.
    pub(crate) fn signal(&self, signal: libc::c_int) {
        // SAFETY: a plain syscall on our own child.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "cannot signal {}", self.what);
    }
}

impl Deref for Guarded {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.child
    }
}

impl DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.child
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// Runs `command` to its end within `limit`, stdin empty, stdout and stderr
/// captured; fails naming `what` when it does not end in time.
pub(crate) fn run_within(command: &mut Command, limit: Duration, what: &str) -> Output {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(command, what).output_within(limit)
}

/// Polls `probe` until it gives a value, at most `limit`; fails naming
/// `what` when time runs out.
pub(crate) fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `probe` until it gives a value, at most `limit`: `None` when
/// time runs out, for a caller that says more about what it waited for.
pub(crate) fn wait_until_or<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
    pipe.map(|mut pipe| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    })
}

fn join(reader: Option<JoinHandle<Vec<u8>>>) -> Vec<u8> {
    reader
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default()
}

/// The test files under `tests/` other than this module hold no bare wait
/// on a child: each goes through a deadline here.
#[test]
fn bare_waits_stay_in_the_support_module() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read test file");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for bare in [".wait()", ".output()", ".wait_with_output()", ".status()"] {
                if code.contains(bare) {
                    found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "waits without a deadline (use tests/support: run_within, Guarded::wait_within):\n{}",
        found.join("\n")
    );
}

/// [`run_within`] with `input` written to the child's stdin (on a thread,
/// so a child that writes much before it reads cannot block the test), then
/// stdin closed. Fails naming `what` when the child does not take all of
/// `input`.
pub(crate) fn run_with_input(
    command: &mut Command,
    input: &[u8],
    limit: Duration,
    what: &str,
) -> Output {
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn(command, what);
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let output = child.output_within(limit);
    if let Ok(Err(e)) = writer.join() {
        panic!(
            "{what} did not read all its stdin ({e}); its stderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

/// Joins `thread` once it has finished, at most `limit`; fails naming
/// `what` when it has not (a thread reading a child's output or feeding its
/// input ends once the child does: the caller's guard kills the child as
/// the failure unwinds). A panic of the thread goes on in the caller.
pub(crate) fn join_within<T>(thread: JoinHandle<T>, limit: Duration, what: &str) -> T {
    wait_until(what, limit, || thread.is_finished().then_some(()));
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Samples a process's peak resident memory (`VmHWM`) until stopped.
pub struct PeakRss {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl PeakRss {
    /// Starts sampling process `pid` every 100 ms.
    pub fn watch(pid: u32) -> Self {
        let peak = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(hwm) = status_kib(pid, "VmHWM:") {
                    p.fetch_max(hwm * 1024, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { peak, stop, thread }
    }

    /// The highest peak seen.
    pub fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the watcher ends");
        self.peak.load(Ordering::Relaxed)
    }
}

/// A field of /proc/PID/status in KiB; `None` once the process is gone.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
