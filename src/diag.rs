//! The one path by which the engine's layers (connectors, operators, the
//! runtime) tell the person running vigil something while queries run: a
//! warning (a file rotated, a target down, a checkpoint not written) or a
//! note (a query restored, a partition's pipeline started). Front ends
//! print their own output; library code calls [`warning!`] or [`note!`].
//!
//! By default each message goes to stderr as one `vigil: ...` line
//! (`vigil: warning: ...` for a warning), which is what the command-line
//! tools and their tests read. An embedder takes them instead with
//! [`set_sink`] (to its own log, say).

use std::sync::{Arc, RwLock};

/// How much a message matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Something worth knowing: nothing went wrong.
    Note,
    /// Something went wrong or was skipped, and vigil went on.
    Warning,
}

/// Where messages go instead of stderr.
pub type Sink = Arc<dyn Fn(Level, &str) + Send + Sync>;

static SINK: RwLock<Option<Sink>> = RwLock::new(None);

/// Sends every message from now on to `sink` (`None`: back to stderr).
pub fn set_sink(sink: Option<Sink>) {
    *SINK.write().unwrap_or_else(|e| e.into_inner()) = sink;
}

/// Hands `message` to the sink, or writes it to stderr as a `vigil:` line.
pub fn emit(level: Level, message: &str) {
    let sink = SINK.read().unwrap_or_else(|e| e.into_inner()).clone();
    match (sink, level) {
        (Some(sink), _) => sink(level, message),
        (None, Level::Note) => eprintln!("vigil: {message}"),
        (None, Level::Warning) => eprintln!("vigil: warning: {message}"),
    }
}

/// Reports a warning, formatted as `format!` does.
macro_rules! warning {
    ($($arg:tt)*) => {
        $crate::diag::emit($crate::diag::Level::Warning, &format!($($arg)*))
    };
}

/// Reports a note, formatted as `format!` does.
macro_rules! note {
    ($($arg:tt)*) => {
        $crate::diag::emit($crate::diag::Level::Note, &format!($($arg)*))
    };
}

pub(crate) use {note, warning};

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn an_embedder_takes_the_messages() {
        let seen: Arc<Mutex<Vec<(Level, String)>>> = Arc::default();
        let keep = seen.clone();
        set_sink(Some(Arc::new(move |level, message: &str| {
            keep.lock().unwrap().push((level, message.to_string()));
        })));
        warning!("stream {}: target {} is down", "m", "t");
        note!("query {} restored", 3);
        set_sink(None);
        let seen = seen.lock().unwrap();
        assert!(seen.contains(&(Level::Warning, "stream m: target t is down".into())));
        assert!(seen.contains(&(Level::Note, "query 3 restored".into())));
    }
}
