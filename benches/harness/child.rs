//! Runs one measured child process: wall time from spawn to exit, and the
//! CPU seconds and peak RSS the kernel reports for it (`wait4`).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one child run cost.
#[derive(Clone, Debug)]
pub struct Measured {
    /// From spawn to exit.
    pub wall: Duration,
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Peak resident set size, bytes.
    pub peak_rss: u64,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec as u64) + Duration::from_micros(tv.tv_usec as u64)
}

/// Reads a child's pipe to the end on a thread, so that a chatty child
/// never blocks on a full pipe while it is being waited for.
fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Runs `command` to its end, killing it after `timeout`. Its stderr is
/// captured, and its stdout unless `discard_stdout` (then it goes to
/// `/dev/null`); a non-zero exit is an error carrying its stderr.
pub fn run(
    mut command: Command,
    timeout: Duration,
    discard_stdout: bool,
) -> Result<Measured, String> {
    let stdout = if discard_stdout {
        Stdio::null()
    } else {
        Stdio::piped()
    };
    command
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", command.get_program()))?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let waited = wait(child.id(), start, timeout);
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let (wall, cpu, peak_rss) = waited.map_err(|e| {
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        if tail.is_empty() {
            e
        } else {
            format!("{e}: {}", tail.join(" | "))
        }
    })?;
    Ok(Measured {
        wall,
        cpu,
        peak_rss,
        stdout,
        stderr,
    })
}

/// Waits for child `pid` (spawned at `start`, not yet waited for), killing
/// it after `timeout`: its wall time, CPU time and peak RSS in bytes, or an
/// error if it timed out or did not exit with status 0.
pub fn wait(
    pid: u32,
    start: Instant,
    timeout: Duration,
) -> Result<(Duration, Duration, u64), String> {
    let pid = pid as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value, filled in by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: pid is our own child, not yet reaped (std never reaps a
        // child it is not asked to wait for); the pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        if r < 0 {
            return Err(format!("wait4: {}", std::io::Error::last_os_error()));
        }
        if start.elapsed() > timeout && !timed_out {
            timed_out = true;
            // SAFETY: signalling our own unreaped child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let wall = start.elapsed();
    if timed_out {
        return Err(format!("killed after the timeout of {timeout:?}"));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(format!("exit status {status}"));
    }
    let cpu = timeval(usage.ru_utime) + timeval(usage.ru_stime);
    // Linux reports ru_maxrss in KiB.
    Ok((wall, cpu, usage.ru_maxrss as u64 * 1024))
}

/// The CPU time this process has used so far (user plus system).
pub fn own_cpu() -> Duration {
    // SAFETY: an all-zero rusage is valid; getrusage fills it in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    timeval(usage.ru_utime) + timeval(usage.ru_stime)
}
