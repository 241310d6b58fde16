//! The results of one query, kept for its followers within a byte budget.
//!
//! Each follower has a queue of the batches it has not read yet. Batches
//! are shared (Arrow buffers are reference counted), and every queue holds
//! the latest batches, so the memory the feed keeps alive is that of the
//! longest queue. A queue over the budget drops its oldest batches (but
//! never its newest one), and its follower is told how many it missed. With
//! no followers nothing is kept.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::Notify;

/// What a follower reads next.
#[derive(Debug, Clone)]
pub(super) enum Update {
    /// Result rows.
    Rows(RecordBatch),
    /// This many batches were dropped because the follower fell behind.
    Lagged(u64),
    /// The query failed with this error; nothing follows.
    Failed(String),
}

/// How a query ended.
#[derive(Debug, Clone)]
pub(super) enum End {
    /// Its inputs ended (or it was stopped).
    Finished,
    /// It failed with this error.
    Failed(String),
}

/// The results of one query, for its followers.
pub(super) struct Feed {
    budget: usize,
    inner: Mutex<FeedInner>,
}

struct FeedInner {
    followers: Vec<Weak<Queue>>,
    end: Option<End>,
}

/// One follower's unread batches.
struct Queue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Default)]
struct QueueState {
    batches: VecDeque<(RecordBatch, usize)>,
    bytes: usize,
    skipped: u64,
    end: Option<End>,
}

/// A follower of a [`Feed`]: the batches published after it subscribed.
pub(super) struct Follower {
    queue: Arc<Queue>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Feed {
    /// A feed whose followers each keep at most `budget` bytes of unread
    /// batches (at least the newest one).
    pub(super) fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::new(FeedInner {
                followers: Vec::new(),
                end: None,
            }),
        }
    }

    /// Hands `batch` to every follower; dropped if there is none.
    pub(super) fn publish(&self, batch: RecordBatch) {
        let size = batch.get_array_memory_size();
        let queues: Vec<Arc<Queue>> = {
            let mut inner = lock(&self.inner);
            inner.followers.retain(|f| f.strong_count() > 0);
            inner.followers.iter().filter_map(Weak::upgrade).collect()
        };
        for queue in queues {
            {
                let mut state = lock(&queue.state);
                state.batches.push_back((batch.clone(), size));
                state.bytes += size;
                while state.bytes > self.budget && state.batches.len() > 1 {
                    let (_, dropped) = state.batches.pop_front().expect("more than one");
                    state.bytes -= dropped;
                    state.skipped += 1;
                }
            }
            queue.ready.notify_one();
        }
    }

    /// Ends the feed: followers read what they have, then `end`.
    pub(super) fn end(&self, end: End) {
        let queues: Vec<Arc<Queue>> = {
            let mut inner = lock(&self.inner);
            inner.end = Some(end.clone());
            inner.followers.iter().filter_map(Weak::upgrade).collect()
        };
        for queue in queues {
            lock(&queue.state).end = Some(end.clone());
            queue.ready.notify_one();
        }
    }

    /// A new follower; it sees the batches published from now on (or only
    /// the end, if the feed has ended).
    pub(super) fn subscribe(&self) -> Follower {
        let mut inner = lock(&self.inner);
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                end: inner.end.clone(),
                ..QueueState::default()
            }),
            ready: Notify::new(),
        });
        inner.followers.push(Arc::downgrade(&queue));
        Follower { queue }
    }

    /// The bytes of the batches kept for followers that have not read them:
    /// those of the longest queue, as every queue holds the latest batches.
    pub(super) fn buffered_bytes(&self) -> usize {
        let inner = lock(&self.inner);
        inner
            .followers
            .iter()
            .filter_map(Weak::upgrade)
            .map(|q| lock(&q.state).bytes)
            .max()
            .unwrap_or(0)
    }
}

impl Follower {
    /// The next update; `None` once the query has ended (after a
    /// [`Update::Failed`] if it failed).
    pub(super) async fn next(&mut self) -> Option<Update> {
        loop {
            // `notify_one` keeps a permit when nobody waits, so an update
            // published between the check and the wait is not missed.
            let ready = self.queue.ready.notified();
            if let Some(update) = self.take() {
                return update;
            }
            ready.await;
        }
    }

    /// The next update if there is one: `Some(None)` at the end.
    fn take(&self) -> Option<Option<Update>> {
        let mut state = lock(&self.queue.state);
        if state.skipped > 0 {
            return Some(Some(Update::Lagged(std::mem::take(&mut state.skipped))));
        }
        if let Some((batch, size)) = state.batches.pop_front() {
            state.bytes -= size;
            return Some(Some(Update::Rows(batch)));
        }
        match state.end.take() {
            Some(End::Failed(error)) => {
                // Ended for good: later calls see `Finished`.
                state.end = Some(End::Finished);
                Some(Some(Update::Failed(error)))
            }
            Some(End::Finished) => {
                state.end = Some(End::Finished);
                Some(None)
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;

    fn batch(rows: i64) -> RecordBatch {
        RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from_iter_values(0..rows)) as _)])
            .unwrap()
    }

    fn now(follower: &mut Follower) -> Option<Option<Update>> {
        follower.take()
    }

    #[test]
    fn nothing_is_kept_without_followers() {
        let feed = Feed::new(1 << 20);
        for _ in 0..100 {
            feed.publish(batch(1000));
        }
        assert_eq!(feed.buffered_bytes(), 0);
        let mut late = feed.subscribe();
        assert!(now(&mut late).is_none(), "a follower sees only later rows");
    }

    #[test]
    fn a_slow_follower_keeps_at_most_the_budget_and_learns_what_it_missed() {
        let size = batch(1000).get_array_memory_size();
        let feed = Feed::new(size * 5);
        let mut slow = feed.subscribe();
        for _ in 0..100 {
            feed.publish(batch(1000));
            assert!(feed.buffered_bytes() <= size * 5);
        }
        assert_eq!(feed.buffered_bytes(), size * 5);
        assert!(matches!(now(&mut slow), Some(Some(Update::Lagged(95)))));
        for _ in 0..5 {
            assert!(matches!(now(&mut slow), Some(Some(Update::Rows(b))) if b.num_rows() == 1000));
        }
        assert!(now(&mut slow).is_none());
        assert_eq!(feed.buffered_bytes(), 0);
    }

    #[test]
    fn a_batch_over_the_budget_still_reaches_its_follower() {
        let feed = Feed::new(16);
        let mut follower = feed.subscribe();
        feed.publish(batch(10));
        feed.publish(batch(20));
        assert!(matches!(now(&mut follower), Some(Some(Update::Lagged(1)))));
        assert!(matches!(now(&mut follower), Some(Some(Update::Rows(b))) if b.num_rows() == 20));
    }

    #[test]
    fn followers_read_the_rows_then_the_failure() {
        let feed = Feed::new(1 << 20);
        let mut follower = feed.subscribe();
        feed.publish(batch(3));
        feed.end(End::Failed("boom".into()));
        assert!(matches!(now(&mut follower), Some(Some(Update::Rows(_)))));
        assert!(matches!(now(&mut follower), Some(Some(Update::Failed(e))) if e == "boom"));
        assert!(matches!(now(&mut follower), Some(None)));
        let mut late = feed.subscribe();
        assert!(matches!(now(&mut late), Some(Some(Update::Failed(e))) if e == "boom"));
        drop((follower, late));
        let gone = feed.subscribe();
        drop(gone);
        feed.publish(batch(3));
        assert_eq!(feed.buffered_bytes(), 0, "a gone follower keeps nothing");
    }

    #[tokio::test]
    async fn a_waiting_follower_wakes_for_a_batch() {
        let feed = Arc::new(Feed::new(1 << 20));
        let mut follower = feed.subscribe();
        let publisher = feed.clone();
        let task = tokio::spawn(async move { follower.next().await });
        tokio::task::yield_now().await;
        publisher.publish(batch(2));
        let update = task.await.unwrap();
        assert!(matches!(update, Some(Update::Rows(b)) if b.num_rows() == 2));
    }
}
