//! Named crash points: a test hook that kills the process at a chosen
//! moment, to check that checkpoints recover from a crash anywhere.
//!
//! With the environment variable `VIGIL_CRASH_AT=POINT:N`, the N-th call of
//! [`hit`] with `POINT` sends SIGKILL to the process itself: no destructor,
//! flush or exit handler runs, as when the machine loses power or the OOM
//! killer strikes. Without the variable (or with one that does not parse)
//! a call costs one read of a `OnceLock` and nothing happens.
//!
//! The points:
//! - `read`: a source sent a batch to its queries;
//! - `fire`: a window aggregate emitted a window's results;
//! - `checkpoint-write`: a checkpoint's state files are written, its
//!   manifest not yet;
//! - `before-manifest`: a sink committed a checkpoint, the query's manifest
//!   is not written yet;
//! - `after-manifest`: a query's manifest is written, its sink is not yet
//!   told (a Kafka sink has not committed the checkpoint's transaction);
//! - `committed`: a sink was told a checkpoint is complete (a Kafka sink
//!   committed its transaction), the next barrier has not come;
//! - `sink-flush`: a file sink wrote a checkpoint's rows and is about to
//!   sync them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms a crash point.
pub const VARIABLE: &str = "VIGIL_CRASH_AT";

/// The armed point, the hit to die at, and the hits so far.
struct Armed {
    point: String,
    at: u64,
    hits: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

/// Passes crash point `point`; see the [module docs](self).
pub fn hit(point: &'static str) {
    let Some(armed) = ARMED.get_or_init(|| parse(std::env::var(VARIABLE).ok()?.as_str())) else {
        return;
    };
    if armed.point == point && armed.hits.fetch_add(1, Ordering::Relaxed) + 1 == armed.at {
        crate::diag::note!("crash point {point}:{} reached, killing myself", armed.at);
        // A real SIGKILL, not an abort: no handler, no core dump, no unwinding.
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// `POINT:N` with N at least 1.
fn parse(value: &str) -> Option<Armed> {
    let (point, at) = value.rsplit_once(':')?;
    let at: u64 = at.trim().parse().ok().filter(|&n| n > 0)?;
    Some(Armed {
        point: point.trim().to_string(),
        at,
        hits: AtomicU64::new(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_and_a_positive_count_arm_it() {
        let armed = parse("sink-flush:3").unwrap();
        assert_eq!((armed.point.as_str(), armed.at), ("sink-flush", 3));
        assert!(parse("read:0").is_none());
        assert!(parse("read").is_none());
        assert!(parse("read:x").is_none());
    }
}
