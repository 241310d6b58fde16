//! Stopping queries: at a checkpoint, at once, or all of them at shutdown,
//! and waiting for them to end.

use super::*;

impl Live {
    /// Stops queries `ids` after one more checkpoint, taken for them all:
    /// their sources stop right after its barrier (without the end of
    /// input, so open windows stay open in it), and each query ends once
    /// its sink has written the checkpoint and committed what it holds, so
    /// whoever restores it next repeats nothing. Queries that share a file
    /// source with them stop too. A push stream goes on for its other
    /// readers: these queries leave it right after the barrier, which the
    /// stream's gate keeps between two pushes, and the rows pushed later
    /// are in its log for whoever restores them. Waits up to `timeout` for
    /// them all to end; false if one did not (it is still running:
    /// [`Live::stop`] cancels it), or if checkpoints are off.
    pub async fn stop_at_checkpoint(&self, ids: &[QueryId], timeout: std::time::Duration) -> bool {
        let Some(coordinator) = self.coordinator.clone() else {
            return false;
        };
        let (files, pushed) = self.sources_by_kind(ids);
        let id = coordinator.request();
        for source in &files {
            source.stop_after.store(id, Ordering::Release);
        }
        let ended = async {
            for (stream, queries) in &pushed {
                self.leave_at_barrier(stream, queries, id).await;
            }
            for &query in ids {
                self.wait_run(query).await;
            }
        };
        tokio::time::timeout(timeout, ended).await.is_ok()
    }

    /// The file sources of queries `ids`, and per push stream they read,
    /// the checkpoints of the queries of `ids` reading it.
    pub(super) fn sources_by_kind(
        &self,
        ids: &[QueryId],
    ) -> (Vec<Arc<SourceStats>>, Vec<PushReaders>) {
        let state = self.lock();
        let mut files = Vec::new();
        let mut pushed: Vec<PushReaders> = Vec::new();
        for id in ids {
            let Some(query) = state.queries.get(id) else {
                continue;
            };
            for (name, stats) in &query.sources {
                let hub = state
                    .hubs
                    .values()
                    .any(|hub| Arc::ptr_eq(&hub.stats, stats));
                match (hub, &query.checkpoints) {
                    (false, _) => files.push(stats.clone()),
                    (true, Some(checkpoints)) => {
                        match pushed.iter_mut().find(|(stream, _)| stream == name) {
                            Some((_, queries)) => queries.push(checkpoints.clone()),
                            None => pushed.push((name.clone(), vec![checkpoints.clone()])),
                        }
                    }
                    (true, None) => {}
                }
            }
        }
        (files, pushed)
    }

    /// Sends barrier `id` to the readers of push stream `stream` that
    /// collect their checkpoints in `queries`, and takes them off it: the
    /// barrier is the last message their input gets, so they end without
    /// the end of input.
    pub(super) async fn leave_at_barrier(
        &self,
        stream: &str,
        queries: &[Arc<QueryCheckpoints>],
        id: u64,
    ) {
        let Some((gate, joining)) = self
            .lock()
            .hubs
            .get(stream)
            .map(|hub| (hub.gate.clone(), hub.joining.subscribe()))
        else {
            return;
        };
        // A run just started may still be catching up from the log, not
        // yet among the subscribers: the barrier would miss it and it
        // would never end. Its join ends soon (it replays what the log
        // holds), and no new one starts for a query being stopped.
        let mut joining = joining;
        let _ = joining.wait_for(|n| *n == 0).await;
        let _turn = gate.lock().await;
        let (leaving, pushed) = {
            let mut state = self.lock();
            let Some(hub) = state.hubs.get_mut(stream) else {
                return;
            };
            let (leaving, staying) = std::mem::take(&mut hub.subscribers)
                .into_iter()
                .partition::<Vec<_>, _>(|s| {
                    s.checkpoints
                        .as_ref()
                        .is_some_and(|c| queries.iter().any(|q| Arc::ptr_eq(c, q)))
                });
            hub.subscribers = staying;
            (leaving, hub.pushed)
        };
        let position = SourcePosition {
            rows: pushed,
            ..SourcePosition::default()
        };
        for subscriber in leaving {
            subscriber.add_source(id, stream, Some(position.clone()));
            subscriber.send_message(Message::Barrier(id)).await;
        }
    }

    /// Stops query `id`: its tasks are cancelled, its sink finishes with
    /// what it has and it is no longer listed. False if no such query is
    /// running.
    pub fn stop(&self, id: QueryId) -> bool {
        let query = {
            let mut state = self.lock();
            match state.queries.get(&id) {
                Some(q) if q.state == QueryState::Running => state.queries.remove(&id),
                _ => None,
            }
        };
        let Some(query) = query else {
            return false;
        };
        for task in &query.tasks {
            task.abort();
        }
        true
    }

    /// Removes ended (failed or finished) query `id` from the listing;
    /// false if no such query is kept or it is still running.
    pub fn forget(&self, id: QueryId) -> bool {
        let mut state = self.lock();
        match state.queries.get(&id) {
            Some(q) if q.state != QueryState::Running => state.queries.remove(&id).is_some(),
            _ => false,
        }
    }

    /// Waits until query `id` ends (its inputs ended, or it was stopped);
    /// its error, if it failed. The query is looked up when this is called,
    /// so the future borrows nothing and can be awaited later; it resolves
    /// at once for an unknown id.
    pub fn wait(&self, id: QueryId) -> impl Future<Output = Result<()>> + Send + 'static {
        let done = self.lock().queries.get(&id).map(|q| q.life.subscribe());
        async move {
            let Some(mut done) = done else {
                return Ok(());
            };
            loop {
                if let Some(outcome) = done.borrow().clone() {
                    return outcome.map_err(Error::Connector);
                }
                if done.changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    /// Waits until the current run of query `id` ends (unlike
    /// [`Live::wait`], also a run that ends to be replaced).
    pub(super) async fn wait_run(&self, id: QueryId) {
        let done = self.lock().queries.get(&id).map(|q| q.done.clone());
        if let Some(mut done) = done {
            let _ = done.wait_for(|outcome| outcome.is_some()).await;
        }
    }

    /// Stops every query and ends every push stream.
    pub async fn shutdown(&self) {
        let ids: Vec<QueryId> = self.queries().iter().map(|q| q.id).collect();
        for id in ids {
            self.stop(id);
        }
        let streams: Vec<String> = self.lock().hubs.keys().cloned().collect();
        for stream in streams {
            self.end_stream(&stream).await;
        }
    }
}

/// Waits for every task of a query; the first error, in the order they
/// fail. A failure stops the other tasks: a query whose operator failed
/// must not keep reading (another input of a join would keep it running).
pub(super) async fn wait_all(tasks: Vec<JoinHandle<Result<()>>>) -> Result<()> {
    let mut first_error = None;
    let mut pending = tasks;
    while !pending.is_empty() {
        let (joined, _, rest) = futures::future::select_all(pending).await;
        pending = rest;
        let outcome = match joined {
            Ok(outcome) => outcome,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => Err(Error::Connector(format!("a task failed: {e}"))),
        };
        if let Err(e) = outcome
            && first_error.is_none()
        {
            first_error = Some(e);
            for task in &pending {
                task.abort();
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}
