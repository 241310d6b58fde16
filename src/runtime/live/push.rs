//! Rows pushed into a stream: delivered to every query reading it, logged
//! first in a durable session, and replayed from the log to a query that
//! joins late.

use super::*;

impl Live {
    /// Sends `batch` to every query reading push stream `stream`, waiting
    /// while they are busy (back-pressure). Rows pushed while no query reads
    /// the stream are counted and dropped, as a live feed would. A stream
    /// with a write-ahead log (see [`Live::attach_wal`]) appends the batch
    /// to it first: when this returns `Ok`, the batch is on disk. The work
    /// runs on a task of its own, so a caller that gives up waiting cannot
    /// leave a logged batch half handed out.
    pub async fn push(&self, stream: &str, batch: RecordBatch) -> Result<()> {
        self.push_until(stream, batch, None).await
    }

    /// Sends `batch` like [`Live::push`], but waits at most `timeout` for
    /// the stream's queries to have room for it; then gives up with
    /// [`Error::Busy`], having handed out nothing. With a write-ahead log,
    /// the room is looked for before the batch is logged, and a logged
    /// batch is always handed out: if other pushes took the room meanwhile,
    /// this one waits for it past `timeout`, holding only its own rows.
    pub async fn push_within(
        &self,
        stream: &str,
        batch: RecordBatch,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.push_until(stream, batch, Some(deadline)).await
    }

    pub(super) async fn push_until(
        &self,
        stream: &str,
        batch: RecordBatch,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<()> {
        let (wal, order) = {
            let mut state = self.lock();
            let hub = state.hubs.entry(stream.to_string()).or_default();
            if hub.ended {
                return Err(Error::Connector(format!("stream {stream} has ended")));
            }
            (hub.wal.clone(), hub.order.clone())
        };
        let Some(wal) = wal else {
            return self.deliver(stream, batch, None, deadline).await;
        };
        if let Some(deadline) = deadline {
            self.wait_for_room(stream, &batch, deadline).await?;
        }
        let live = self.clone();
        let stream = stream.to_string();
        tokio::spawn(async move { live.push_logged(&stream, &wal, &order, batch).await })
            .await
            .unwrap_or_else(|e| Err(Error::Connector(format!("a push failed: {e}"))))
    }

    /// Appends `batch` to the log, then hands it out in log order, with
    /// the hub's position set to its sequence number.
    pub(super) async fn push_logged(
        &self,
        stream: &str,
        wal: &Arc<Wal>,
        order: &Sequencer,
        batch: RecordBatch,
    ) -> Result<()> {
        let (ticket, appended) = {
            let mut next = order.next.lock().await;
            *next += 1;
            let (wal, logged) = (wal.clone(), batch.clone());
            let mut append = Box::pin(async move { wal.append(&logged).await });
            // The first poll queues the record; holding the lock over it
            // makes ticket order the log's order.
            let first = futures::poll!(&mut append);
            (*next, (first, append))
        };
        let outcome = match appended {
            (std::task::Poll::Ready(outcome), _) => outcome,
            (std::task::Poll::Pending, append) => append.await,
        };
        let mut done = order.done.subscribe();
        let _ = done.wait_for(|&d| d + 1 >= ticket).await;
        let result = match outcome {
            Ok(seq) => self.deliver(stream, batch, Some(seq), None).await,
            Err(e) => Err(e),
        };
        order.done.send_replace(ticket);
        result
    }

    /// The live subscribers of push stream `stream`, and its gate and
    /// counters.
    pub(super) fn hub_parts(
        &self,
        stream: &str,
    ) -> (Arc<tokio::sync::Mutex<()>>, Arc<SourceStats>) {
        let mut state = self.lock();
        let hub = state.hubs.entry(stream.to_string()).or_default();
        (hub.gate.clone(), hub.stats.clone())
    }

    pub(super) fn live_subscribers(&self, stream: &str) -> Vec<Subscriber> {
        let mut state = self.lock();
        state
            .hubs
            .entry(stream.to_string())
            .or_default()
            .listening()
    }

    /// Hands `batch` to the stream's subscribers; its position becomes
    /// `seq` (a logged batch) or goes up by one. With a deadline, takes room
    /// in every subscriber first and hands out nothing if it cannot by then.
    pub(super) async fn deliver(
        &self,
        stream: &str,
        batch: RecordBatch,
        seq: Option<u64>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<()> {
        let (gate, stats) = self.hub_parts(stream);
        let _turn = gate.lock().await;
        let subscribers = self.live_subscribers(stream);
        let started = std::time::Instant::now();
        let rooms = match deadline {
            Some(deadline) => Some(reserve_all(&subscribers, stream, &batch, deadline).await?),
            None => None,
        };
        if let Some(hub) = self.lock().hubs.get_mut(stream) {
            hub.pushed = seq.unwrap_or(hub.pushed + 1);
        }
        stats
            .rows
            .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        match rooms {
            Some(rooms) => {
                for room in rooms.into_iter().flatten() {
                    room.send(Message::Batch(batch.clone())).await;
                }
            }
            None => {
                for subscriber in &subscribers {
                    subscriber.send_async(&batch).await;
                }
            }
        }
        let waited = started.elapsed().as_nanos() as u64;
        stats.blocked_ns.fetch_add(waited, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until every query reading `stream` has room for `batch`, or
    /// fails with [`Error::Busy`] at `deadline`.
    pub(super) async fn wait_for_room(
        &self,
        stream: &str,
        batch: &RecordBatch,
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        let subscribers = self.live_subscribers(stream);
        reserve_all(&subscribers, stream, batch, deadline).await?;
        Ok(())
    }

    /// Makes push stream `stream` durable: later pushes are appended to
    /// `wal` before queries see them, and its position (what checkpoints
    /// record) is the log's sequence number, starting from the log's last.
    pub fn attach_wal(&self, stream: &str, wal: Arc<Wal>) {
        let mut state = self.lock();
        let hub = state.hubs.entry(stream.to_string()).or_default();
        hub.pushed = hub.pushed.max(wal.last_seq());
        hub.wal = Some(wal);
    }

    /// The write-ahead logs of the push streams, by stream.
    pub fn wals(&self) -> Vec<(String, Arc<Wal>)> {
        let mut wals: Vec<(String, Arc<Wal>)> = self
            .lock()
            .hubs
            .iter()
            .filter_map(|(name, hub)| Some((name.clone(), hub.wal.clone()?)))
            .collect();
        wals.sort_by(|a, b| a.0.cmp(&b.0));
        wals
    }

    /// The position of push stream `stream`: batches handed out so far, or
    /// the sequence number of the last one with a write-ahead log.
    pub fn pushed(&self, stream: &str) -> u64 {
        self.lock().hubs.get(stream).map_or(0, |hub| hub.pushed)
    }

    /// Gives `subscribers` (queries restored to position `after` of push
    /// stream `stream`) the logged batches after it, then lets them join
    /// the stream's hub. Holding the gate, no batch is handed out
    /// meanwhile: they see every batch once, in order.
    pub(super) async fn join_replayed(
        &self,
        stream: &str,
        wal: &Arc<Wal>,
        gate: &tokio::sync::Mutex<()>,
        after: u64,
        subscribers: Vec<Subscriber>,
    ) {
        let _turn = gate.lock().await;
        let through = self.pushed(stream);
        let reading = wal.clone();
        let records = tokio::task::spawn_blocking(move || reading.replay(after))
            .await
            .unwrap_or_else(|e| Err(Error::Connector(format!("a task failed: {e}"))));
        let records = match records {
            Ok(records) => records,
            Err(e) => {
                crate::diag::warning!("stream {stream}: cannot replay its log: {e}");
                Vec::new()
            }
        };
        if let Some((first, _)) = records.first()
            && *first > after + 1
        {
            crate::diag::warning!(
                "stream {stream}: the log no longer holds batches {} to {}; the restored queries miss them",
                after + 1,
                first - 1
            );
        }
        for (seq, batch) in records {
            if seq > through {
                break;
            }
            for subscriber in &subscribers {
                subscriber.send_async(&batch).await;
            }
        }
        let mut state = self.lock();
        match state.hubs.get_mut(stream).filter(|h| !h.ended) {
            Some(hub) => hub.subscribers.extend(subscribers),
            None => {
                for subscriber in subscribers {
                    end_soon(subscriber);
                }
            }
        }
    }

    /// The counters of push stream `stream` (rows pushed, bad rows).
    pub fn push_stats(&self, stream: &str) -> Arc<SourceStats> {
        self.lock()
            .hubs
            .entry(stream.to_string())
            .or_default()
            .stats
            .clone()
    }

    /// Ends push stream `stream`: its queries see the end of input (every
    /// window fires) and finish.
    pub async fn end_stream(&self, stream: &str) {
        let subscribers = {
            let mut state = self.lock();
            let hub = state.hubs.entry(stream.to_string()).or_default();
            hub.ended = true;
            std::mem::take(&mut hub.subscribers)
        };
        for subscriber in subscribers {
            subscriber
                .send_message(Message::Watermark(END_OF_INPUT))
                .await;
        }
    }

    /// Forgets push stream `stream` (it was dropped or replaced): the
    /// queries reading it see the end of its input, and a stream declared
    /// later under the same name starts with a hub of its own. Must be
    /// called within a tokio runtime: the end is sent by a task, as a busy
    /// query may not take it at once.
    pub fn retire_stream(&self, stream: &str) {
        let Some(mut hub) = self.lock().hubs.remove(stream) else {
            return;
        };
        // The log closes now, before a stream of the same name opens it.
        drop(hub.wal.take());
        tokio::spawn(async move {
            for subscriber in hub.subscribers {
                subscriber
                    .send_message(Message::Watermark(END_OF_INPUT))
                    .await;
            }
        });
    }
}

/// Takes room for `batch` in every subscriber (`None` for one that has
/// stopped listening), or fails with [`Error::Busy`] if one of them has
/// none by `deadline`. A query with a disk buffer has room while its buffer
/// does.
async fn reserve_all(
    subscribers: &[Subscriber],
    stream: &str,
    batch: &RecordBatch,
    deadline: tokio::time::Instant,
) -> Result<Vec<Option<Room>>> {
    let rows = batch.num_rows();
    let mut rooms = Vec::with_capacity(subscribers.len());
    for subscriber in subscribers {
        let reserved = match &subscriber.buffer {
            Some(buffer) => buffer.room_within(batch, deadline).await.map(|room| {
                room.map(|channel| match channel {
                    Some(channel) => Room::Channel(channel),
                    None => Room::Buffer(buffer.clone()),
                })
            }),
            None => subscriber
                .tx
                .reserve_within(rows, deadline)
                .await
                .map(|room| room.map(Room::Channel)),
        };
        match reserved {
            Ok(Some(room)) => rooms.push(Some(room)),
            Ok(None) => {
                return Err(Error::Busy {
                    message: format!(
                        "stream {stream}: its queries are behind and had no room for {rows} rows within the ingest timeout"
                    ),
                    retry_after: std::time::Duration::from_secs(1),
                });
            }
            Err(crate::runtime::channel::Closed) => rooms.push(None),
        }
    }
    Ok(rooms)
}
