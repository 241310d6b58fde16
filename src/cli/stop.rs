//! Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM.
//!
//! The first signal asks every source to stop: each ends at its next row,
//! or its next poll when following a file, without the final watermark.
//! The queries then end, the sinks flush what they were sent, and the
//! summary is printed. A second signal exits at once, for a source stuck
//! in a read that no stop request reaches (stdin, a pipe).

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::connector::SourceStats;
use crate::runtime::RunReport;

#[derive(Default)]
struct State {
    /// The signal that asked for the stop, once one came.
    signal: Option<i32>,
    /// The sources of the running run.
    sources: Vec<Arc<SourceStats>>,
    /// Asks the run to stop in its own way (after a last checkpoint),
    /// instead of stopping the sources at once.
    on_stop: Option<Box<dyn Fn() + Send>>,
}

/// Catches SIGINT and SIGTERM for the rest of the process's life.
#[derive(Clone)]
pub(super) struct Stopper {
    state: Arc<Mutex<State>>,
}

impl Stopper {
    /// Installs the handlers; `None` (and the default behaviour: exit at
    /// once) if they cannot be installed.
    pub fn install() -> Option<Self> {
        let mut signals = Signals::new([SIGINT, SIGTERM]).ok()?;
        let stopper = Stopper {
            state: Arc::default(),
        };
        let state = stopper.state.clone();
        std::thread::Builder::new()
            .name("vigil-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
                    if state.signal.is_some() {
                        let mut err = std::io::stderr().lock();
                        if err.is_terminal() {
                            let _ = err.write_all(b"\r\x1b[2K");
                        }
                        let _ = writeln!(err, "vigil: {}: exiting at once", name(signal));
                        let _ = err.flush();
                        std::process::exit(128 + signal);
                    }
                    state.signal = Some(signal);
                    let mut err = std::io::stderr().lock();
                    if err.is_terminal() {
                        let _ = err.write_all(b"\r\x1b[2K");
                    }
                    let _ = writeln!(
                        err,
                        "vigil: {}: stopping (send it again to exit at once)",
                        name(signal)
                    );
                    let _ = err.flush();
                    drop(err);
                    state.stop();
                }
            })
            .ok()?;
        Some(stopper)
    }

    /// Stops the sources of `report`'s run when a signal comes (at once if
    /// one already came).
    pub fn watch(&self, report: &RunReport) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.sources = report.streams.iter().map(|(_, s)| s.clone()).collect();
        if state.signal.is_some() {
            state.stop();
        }
    }

    /// Like [`Stopper::watch`], but a signal calls `on_stop` instead of
    /// stopping the sources at once.
    pub fn watch_with(&self, report: &RunReport, on_stop: Box<dyn Fn() + Send>) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).on_stop = Some(on_stop);
        self.watch(report);
    }

    /// The name of the signal that stopped the run, if one did.
    pub fn stopped_by(&self) -> Option<&'static str> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.signal.map(name)
    }
}

impl State {
    fn stop(&self) {
        match &self.on_stop {
            Some(on_stop) => on_stop(),
            None => {
                for source in &self.sources {
                    source.stop.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

fn name(signal: i32) -> &'static str {
    match signal {
        SIGINT => "SIGINT",
        SIGTERM => "SIGTERM",
        _ => "signal",
    }
}
