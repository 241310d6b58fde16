//! The output of a script's background queries, one query after another.
//!
//! A script piped into the shell starts its alerts (and `&` queries) in
//! the background, as the prompt does, but its output must read like
//! `vigil run`'s: each query's lines together, under its own header, in
//! the order the queries were started, whatever the timing. The first
//! query still running writes straight through; a later one's lines are
//! held until every query before it has ended.

use std::sync::{Arc, Mutex};

/// Orders the lines of background queries by when they were started.
///
/// Lifecycle: [`Turns::join`] when a query starts (it gets its place),
/// [`Turns::write`] for each piece of its output, [`Turns::end`] once, when
/// it has ended; a query that never ends holds every later one back.
#[derive(Clone)]
pub struct Turns {
    state: Arc<Mutex<State>>,
    print: Print,
}

/// Where text whose turn has come goes (the shell's printer).
type Print = Arc<dyn Fn(String) + Send + Sync>;

struct State {
    /// The query writing straight through: those before it have ended.
    head: usize,
    /// Per query, what it wrote before its turn came.
    held: Vec<String>,
    ended: Vec<bool>,
}

impl Turns {
    /// Turns writing through `print`.
    pub fn new(print: impl Fn(String) + Send + Sync + 'static) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                head: 0,
                held: Vec::new(),
                ended: Vec::new(),
            })),
            print: Arc::new(print),
        }
    }

    /// Gives a newly started query its place after those started before.
    pub fn join(&self) -> usize {
        let mut state = self.lock();
        state.held.push(String::new());
        state.ended.push(false);
        state.held.len() - 1
    }

    /// Writes `text` of query `place` now if its turn has come, or holds it.
    pub fn write(&self, place: usize, text: &str) {
        let mut state = self.lock();
        if place == state.head {
            (self.print)(text.to_string());
        } else {
            state.held[place].push_str(text);
        }
    }

    /// Notes that query `place` has ended; the queries after it that can,
    /// write what they held.
    pub fn end(&self, place: usize) {
        let mut state = self.lock();
        state.ended[place] = true;
        while state.head < state.ended.len() && state.ended[state.head] {
            state.head += 1;
            let head = state.head;
            if let Some(held) = state.held.get_mut(head) {
                let text = std::mem::take(held);
                if !text.is_empty() {
                    (self.print)(text);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three queries ending out of order still print in start order.
    #[test]
    fn later_queries_wait_for_the_earlier_ones_to_end() {
        let printed = Arc::new(Mutex::new(String::new()));
        let into = printed.clone();
        let turns = Turns::new(move |text| into.lock().unwrap().push_str(&text));
        let (a, b, c) = (turns.join(), turns.join(), turns.join());
        turns.write(b, "b1\n");
        turns.write(a, "a1\n");
        turns.write(c, "c1\n");
        turns.end(c);
        turns.write(b, "b2\n");
        turns.end(a);
        turns.write(b, "b3\n");
        turns.end(b);
        assert_eq!(*printed.lock().unwrap(), "a1\nb1\nb2\nb3\nc1\n");
    }
}
