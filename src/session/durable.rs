//! A session with a state directory: queries started from their
//! checkpoints, the write-ahead logs trimmed, savepoints taken.

use super::*;

impl Session {
    /// Starts a query under its stable name, restored from its checkpoint
    /// or else reading the push streams' logs from its first start.
    pub(super) fn start_durable(
        &self,
        durable: &Arc<Durable>,
        name: Option<String>,
        graph: crate::planner::QueryGraph,
        sink: Box<dyn Sink>,
        label: &str,
    ) -> Result<QueryId> {
        let n = durable.started.fetch_add(1, Ordering::Relaxed) + 1;
        let name = name.unwrap_or_else(|| format!("query-{n}"));
        let mut streams: Vec<String> = graph
            .inputs
            .iter()
            .filter(|i| i.stream.source.location == SourceLocation::Push)
            .map(|i| i.stream.name.clone())
            .collect();
        streams.dedup();
        let now = streams
            .iter()
            .map(|stream| SourceEntry {
                stream: stream.clone(),
                position: Some(crate::connector::SourcePosition {
                    rows: self.live.pushed(stream),
                    ..Default::default()
                }),
                ended: false,
                buffer: None,
            })
            .collect();
        let start = durable.start_of(&name, now)?;
        self.live.set_start_positions(&name, start);
        let id = self
            .live
            .start_named(graph, sink, label, Some(name.clone()))?;
        durable
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, (name, streams));
        self.start_trimming(durable);
        Ok(id)
    }

    /// Starts the task that cuts the write-ahead logs behind what the kept
    /// checkpoints need, once per checkpoint interval; it ends with the
    /// session.
    pub(super) fn start_trimming(&self, durable: &Arc<Durable>) {
        if durable.trimming.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(durable);
        let live = self.live.clone();
        let period = durable.checkpoints.interval;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(durable) = weak.upgrade() else {
                    return;
                };
                let live = live.clone();
                let trimmed = tokio::task::spawn_blocking(move || trim_wals(&durable, &live)).await;
                if let Ok(Err(e)) = trimmed {
                    crate::diag::warning!("cannot trim the write-ahead logs: {e}");
                }
            }
        });
    }

    /// Takes a savepoint of every running checkpointed query under `root`
    /// (one folder per query), waiting at most `timeout` for them; the
    /// names of the queries it holds. A session restores from it when
    /// built with [`SessionBuilder::from_savepoint`].
    pub async fn savepoint(
        &self,
        root: &Path,
        timeout: std::time::Duration,
    ) -> Result<Vec<String>> {
        let Some(durable) = &self.durable else {
            return Err(Error::Plan(
                "savepoints need a session with a state directory".into(),
            ));
        };
        let running: Vec<QueryId> = self.queries().iter().map(|q| q.id).collect();
        let mut names: Vec<String> = {
            let named = durable.running.lock().unwrap_or_else(|e| e.into_inner());
            running
                .iter()
                .filter_map(|id| named.get(id).map(|(name, _)| name.clone()))
                .collect()
        };
        names.sort();
        let Some(id) = self.live.savepoint(root, false).await else {
            return Err(Error::Plan("this session takes no checkpoints".into()));
        };
        let coordinator = self
            .live
            .coordinator()
            .expect("a durable session checkpoints");
        let done = coordinator.wait_for(id, names.len(), timeout).await;
        if done < names.len() {
            return Err(Error::Connector(format!(
                "savepoint {}: {done} of {} queries wrote their state within {timeout:?}",
                root.display(),
                names.len()
            )));
        }
        Ok(names)
    }

    /// What the checkpoints did (for metrics), in a durable session.
    pub fn checkpoint_stats(&self) -> Option<Arc<CheckpointStats>> {
        self.live.coordinator().map(|c| c.stats().clone())
    }

    /// Bytes each push stream's write-ahead log holds, by stream.
    pub fn wal_bytes(&self) -> Vec<(String, u64)> {
        self.live
            .wals()
            .into_iter()
            .map(|(stream, wal)| (stream, wal.bytes()))
            .collect()
    }

    /// Cuts the write-ahead logs behind what the kept checkpoints of the
    /// queries reading them need (done on its own every checkpoint
    /// interval).
    pub fn trim_wals(&self) -> Result<()> {
        match &self.durable {
            Some(durable) => trim_wals(durable, &self.live),
            None => Ok(()),
        }
    }
}

/// Cuts each push stream's log behind the oldest position the running
/// checkpointed queries reading it may need; a stream nobody reads keeps
/// only its last segment.
pub(super) fn trim_wals(durable: &Durable, live: &Live) -> Result<()> {
    // A query being changed is between runs: its next run restores under
    // the same name and replays the log from its checkpoint.
    let running: std::collections::HashSet<QueryId> =
        live.running_or_restarting().into_iter().collect();
    let readers: Vec<(String, Vec<String>)> = {
        let mut named = durable.running.lock().unwrap_or_else(|e| e.into_inner());
        named.retain(|id, _| running.contains(id));
        named.values().cloned().collect()
    };
    for (stream, wal) in live.wals() {
        let mut through = live.pushed(&stream);
        for (name, streams) in &readers {
            if streams.contains(&stream) {
                through = through.min(durable.needed(name, &stream)?.unwrap_or(0));
            }
        }
        wal.truncate_through(through)?;
    }
    Ok(())
}
