//! The [`Driver`]: what every decoder hands its rows to. It batches them,
//! checks event times, holds rows back for a restore's exact position,
//! writes bad rows to the dead-letter file and emits batches to the queries.

use super::*;

/// One decoded row, as the decoders hand it to the [`Driver`].
pub(super) struct Row<'r> {
    /// Its first physical line.
    pub(super) line: u64,
    pub(super) vals: &'r [Val],
    /// The text that `Val::Text` ranges index into.
    pub(super) text: &'r [u8],
    /// The original line(s), for the dead-letter file.
    pub(super) raw: &'r [u8],
    /// Whether the event time was written as an epoch number.
    pub(super) epoch_time: bool,
    /// The point just past its last line.
    pub(super) end: Mark,
}

/// A row the future guard holds back, copied out of the decoder's buffers.
pub(super) struct HeldRow {
    pub(super) line: u64,
    pub(super) time: i64,
    pub(super) vals: Vec<Val>,
    pub(super) text: Vec<u8>,
    pub(super) raw: Vec<u8>,
    /// Why it is bad, if it turns out to be an outlier.
    pub(super) reason: String,
}

impl HeldRow {
    pub(super) fn copy(row: &Row<'_>, time: i64, reason: String) -> Self {
        HeldRow {
            line: row.line,
            time,
            vals: row.vals.to_vec(),
            text: row.text.to_vec(),
            raw: row.raw.to_vec(),
            reason,
        }
    }
}

/// A row the guard accepted that is not in a batch yet: one of a jump's
/// rows, or the row a realtime pause is for.
pub(super) struct PendingRow {
    pub(super) vals: Vec<Val>,
    pub(super) text: Vec<u8>,
}

/// Shared row handling for both formats: batching, pacing, bad rows, the
/// event-time guard, positions.
pub(super) struct Driver<'a> {
    pub(super) stream: &'a str,
    pub(super) stats: &'a SourceStats,
    pub(super) emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    pub(super) batcher: Batcher,
    pub(super) batch_size: usize,
    pub(super) decode: Decoding,
    pub(super) pacer: Option<Pacer>,
    pub(super) dead_letter: Option<DeadLetter>,
    pub(super) guard: Option<FutureGuard>,
    /// Rows the guard holds back, in input order.
    pub(super) held: Vec<HeldRow>,
    /// Rows accepted and still to be batched, in input order: the row a
    /// realtime pause waits to release, then the rest of a jump's rows.
    pub(super) waiting: Option<PendingRow>,
    pub(super) accepted: VecDeque<PendingRow>,
    pub(super) unit_check: Option<UnitCheck>,
    /// The largest event time among the rows taken since the last flush.
    pub(super) max_event_time: i64,
    /// Whether the input can be read again from a position: a regular
    /// file. Only then are positions stored.
    pub(super) replayable: bool,
    /// The input is consumed up to here: every row before it is emitted,
    /// bad, or kept by the driver (held, accepted).
    pub(super) mark: Mark,
    /// Threads that decode a file whose lines decode on their own (see
    /// [`parallel`]); 1 decodes on the reading thread.
    pub(super) threads: usize,
    /// Bytes of input per chunk for those threads.
    pub(super) chunk_size: usize,
    /// For input made of messages (see [`read_messages`]): the message
    /// each line is, which bad rows name instead of the line.
    pub(super) origin: Option<&'a dyn Fn(u64) -> MessageOrigin>,
}

impl<'a> Driver<'a> {
    pub(super) fn new(
        config: &'a SourceConfig,
        stats: &'a SourceStats,
        emit: &'a mut dyn FnMut(RecordBatch) -> bool,
    ) -> Result<Driver<'a>> {
        let pacer = match (config.replay, config.event_time) {
            (Replay::Realtime { speed }, Some(column)) if speed > 0.0 => {
                Some(Pacer::new(column, speed))
            }
            _ => None,
        };
        let pushed = config.location == SourceLocation::Push;
        let guard = match (config.event_time, config.decode.max_future_ms) {
            (Some(_), Some(max_ahead)) => Some(FutureGuard::new(max_ahead, pushed)),
            _ => None,
        };
        // Each push is decoded on its own: a warning would repeat per push.
        let unit_check =
            (config.event_time.is_some() && !pushed).then(|| UnitCheck::new(config.decode.ts_unit));
        Ok(Driver {
            stream: &config.stream,
            stats,
            emit,
            batcher: Batcher::new(config)?,
            batch_size: config.batch_size.max(1),
            decode: config.decode,
            pacer,
            dead_letter: config
                .dead_letter
                .clone()
                .map(|path| DeadLetter { path, out: None }),
            guard,
            held: Vec::new(),
            waiting: None,
            accepted: VecDeque::new(),
            unit_check,
            max_event_time: i64::MIN,
            replayable: false,
            mark: Mark::default(),
            threads: config.decode_threads.max(1),
            chunk_size: parallel::chunk_size(),
            origin: None,
        })
    }

    /// Takes one parsed row. Returns `Ok(false)` once downstream is gone.
    pub(super) fn row(&mut self, row: Row<'_>) -> Result<bool> {
        if self.stopped() {
            // The row is not taken: the position stays before it.
            self.flush()?;
            return Ok(false);
        }
        self.mark = row.end;
        if let Err(reason) = self.batcher.check(row.vals) {
            self.bad(row.line, reason, row.raw)?;
            return Ok(true);
        }
        let time = self.batcher.event_time.and_then(|i| match row.vals[i] {
            Val::Int(t) => Some(t),
            _ => None,
        });
        if let (Some(t), true, Some(check)) = (time, row.epoch_time, &mut self.unit_check) {
            check.observe(t, self.stream);
        }
        let (Some(t), Some(guard)) = (time, &mut self.guard) else {
            return self.accept(row.vals, row.text);
        };
        let admit = guard.admit(t);
        match admit {
            Admit::Accept => {
                self.reject_held()?;
                self.accept(row.vals, row.text)
            }
            Admit::Reject(reason) => {
                let reason = self.time_reason(reason);
                self.bad(row.line, reason, row.raw)?;
                Ok(true)
            }
            Admit::Hold { reason, breaks_run } => {
                if breaks_run {
                    self.reject_held()?;
                }
                let reason = self.time_reason(reason);
                self.held.push(HeldRow::copy(&row, t, reason));
                if self.held.len() < JUMP_ROWS {
                    return Ok(true);
                }
                // Enough rows agree: the stream jumped ahead (a gap in the
                // data); they are not outliers.
                let held = std::mem::take(&mut self.held);
                if let Some(guard) = &mut self.guard {
                    for h in &held {
                        guard.raise(h.time);
                    }
                }
                self.accepted.extend(held.into_iter().map(|h| PendingRow {
                    vals: h.vals,
                    text: h.text,
                }));
                self.accept_pending()
            }
        }
    }

    /// Whether the source was asked to stop.
    pub(super) fn stopped(&self) -> bool {
        self.stats.stop.load(Ordering::Relaxed)
    }

    /// The input is consumed up to `mark`.
    pub(super) fn advance(&mut self, mark: Mark) {
        self.mark = mark;
    }

    /// A guard's reason, naming the event-time column.
    pub(super) fn time_reason(&self, reason: String) -> String {
        let column = self
            .batcher
            .event_time
            .map_or("", |i| self.batcher.schema.field(i).name().as_str());
        format!("column {column}: {reason}")
    }

    /// Batches the accepted rows still pending, in order.
    pub(super) fn accept_pending(&mut self) -> Result<bool> {
        while let Some(row) = self.accepted.pop_front() {
            if !self.accept(&row.vals, &row.text)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Adds a checked row to the pending batch, pacing it first.
    pub(super) fn accept(&mut self, vals: &[Val], text: &[u8]) -> Result<bool> {
        if let Some(pacer) = &mut self.pacer
            && let Val::Int(t) = vals[pacer.column]
            && let Some(wait) = pacer.delay(t)
        {
            // Until the pause ends the row is pending, and positions
            // stored meanwhile keep it.
            self.waiting = Some(PendingRow {
                vals: vals.to_vec(),
                text: text.to_vec(),
            });
            let go_on = self.flush()? && self.pause(wait)?;
            self.waiting = None;
            if !go_on {
                return Ok(false);
            }
        }
        if let Some(Val::Int(t)) = self.batcher.event_time.map(|i| vals[i]) {
            self.max_event_time = self.max_event_time.max(t);
        }
        self.batcher.push(vals, text);
        if self.batcher.len >= self.batch_size {
            return self.flush();
        }
        Ok(true)
    }

    /// Waits `wait`, emitting empty batches meanwhile.
    pub(super) fn pause(&mut self, wait: Duration) -> Result<bool> {
        let stats = self.stats;
        pause(wait, &stats.stop, &mut || self.idle())
    }

    /// Records the rows the guard held back as bad: they were outliers.
    pub(super) fn reject_held(&mut self) -> Result<()> {
        for h in std::mem::take(&mut self.held) {
            self.bad(h.line, h.reason, &h.raw)?;
        }
        Ok(())
    }

    /// Records a malformed row.
    pub(super) fn bad(&mut self, line: u64, reason: String, raw: &[u8]) -> Result<()> {
        if let Some(origin) = self.origin {
            let message = origin(line);
            if let Some(dead) = &mut self.dead_letter {
                dead.write(&message.at, &reason, &message.raw)?;
            }
            self.stats.record_bad(BadRow {
                line: message.line,
                reason: format!("{}: {reason}", message.at),
            });
            return Ok(());
        }
        if let Some(dead) = &mut self.dead_letter {
            dead.write(&line, &reason, raw)?;
        }
        self.stats.record_bad(BadRow { line, reason });
        Ok(())
    }

    /// Records a malformed record that may span several lines: every line
    /// is a bad row of its own (counted, and dead-lettered as itself), so
    /// the counts add up to the lines of the input.
    pub(super) fn bad_record(&mut self, first: u64, reason: String, raw: &[u8]) -> Result<()> {
        let mut lines = raw.split_inclusive(|&b| b == b'\n');
        let Some(head) = lines.next() else {
            return self.bad(first, reason, raw);
        };
        let rest = format!("{reason} (in the record that starts at line {first})");
        self.bad(first, reason, split_terminator(head).0)?;
        for (i, line) in lines.enumerate() {
            self.bad(first + 1 + i as u64, rest.clone(), split_terminator(line).0)?;
        }
        Ok(())
    }

    /// Ends the input: held rows are outliers, pending rows go on, and the
    /// unit check decides on what it has seen.
    pub(super) fn finish(&mut self) -> Result<()> {
        self.reject_held()?;
        if let Some(check) = &mut self.unit_check {
            check.decide(self.stream);
        }
        self.flush()?;
        Ok(())
    }

    /// Emits the pending rows, if any. Returns `Ok(false)` once downstream
    /// is gone.
    pub(super) fn flush(&mut self) -> Result<bool> {
        match self.batcher.take()? {
            Some(batch) => {
                self.stats
                    .rows
                    .fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                self.stats.max_event_time.raise(self.max_event_time);
                self.send(batch)
            }
            None => Ok(true),
        }
    }

    /// While waiting for input: emits the pending rows, or else an empty
    /// batch.
    pub(super) fn idle(&mut self) -> Result<bool> {
        if self.batcher.len > 0 {
            return self.flush();
        }
        self.send(RecordBatch::new_empty(self.batcher.schema.clone()))
    }

    /// Stores the position after `batch`, then emits it.
    pub(super) fn send(&mut self, batch: RecordBatch) -> Result<bool> {
        if let Some(dead) = &mut self.dead_letter {
            dead.flush()?;
        }
        if self.replayable {
            let position = self.position()?;
            *self
                .stats
                .position
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(position);
        }
        Ok((self.emit)(batch))
    }

    /// Where the source stands now (see [`FileState`]).
    pub(super) fn position(&self) -> Result<SourcePosition> {
        let saved = |row: &PendingRow| save_vals(&row.vals, &row.text);
        let state = FileState {
            file: self.mark.file,
            guard: self.guard.as_ref().map(FutureGuard::state),
            unit_check: self.unit_check.as_ref().map(UnitCheck::state),
            max_event_time: self.stats.max_event_time.get(),
            held: self.held.iter().map(SavedHeld::save).collect(),
            accepted: self
                .waiting
                .iter()
                .chain(&self.accepted)
                .map(saved)
                .collect(),
        };
        Ok(SourcePosition {
            offset: self.mark.offset,
            line: self.mark.line,
            rows: self.stats.rows.load(Ordering::Relaxed),
            bad_rows: self.stats.bad_rows.load(Ordering::Relaxed),
            extra: serde_json::to_value(state).map_err(|e| {
                Error::Connector(format!(
                    "stream {}: cannot record its position: {e}",
                    self.stream
                ))
            })?,
        })
    }

    /// Takes up from `position`: the counters, the guard and unit check,
    /// the rows kept. Returns the followed file recorded, if any.
    pub(super) fn restore(&mut self, position: &SourcePosition) -> Result<Option<FileId>> {
        let state: FileState = match &position.extra {
            Value::Null => FileState::default(),
            extra => serde_json::from_value(extra.clone()).map_err(|e| {
                Error::Connector(format!(
                    "stream {}: the checkpoint's position is not one of a file source: {e}",
                    self.stream
                ))
            })?,
        };
        self.stats.rows.store(position.rows, Ordering::Relaxed);
        self.stats
            .bad_rows
            .store(position.bad_rows, Ordering::Relaxed);
        if let Some(t) = state.max_event_time {
            self.stats.max_event_time.raise(t);
        }
        if let (Some(guard), Some(saved)) = (&mut self.guard, state.guard) {
            guard.restore(saved);
        }
        if let (Some(check), Some(saved)) = (&mut self.unit_check, state.unit_check) {
            check.restore(saved);
        }
        let columns = self.batcher.kinds.len();
        for saved in state.accepted {
            let (vals, text) = load_vals(saved, columns, self.stream)?;
            self.accepted.push_back(PendingRow { vals, text });
        }
        for saved in state.held {
            let held = saved.load(columns, self.stream)?;
            // Without a guard (max_future changed to 'none'), nothing is
            // held: the row goes on.
            match self.guard {
                Some(_) => self.held.push(held),
                None => self.accepted.push_back(PendingRow {
                    vals: held.vals,
                    text: held.text,
                }),
            }
        }
        Ok(state.file)
    }

    /// Whether the lines of `input` are decoded by several threads: a
    /// file read to its end (not followed, not a pipe), when there are
    /// several. The decoders say whether their format allows it.
    pub(super) fn parallel<R: Read>(&self, input: &Input<'_, R>) -> bool {
        self.threads > 1 && !input.live && input.opened.is_none()
    }

    /// On live input, emits the pending rows before a read that may block.
    pub(super) fn flush_if_dry<R: Read>(&mut self, input: &Input<'_, R>) -> Result<bool> {
        if input.dry() && self.batcher.len > 0 {
            return self.flush();
        }
        Ok(true)
    }

    pub(super) fn close_dead_letter(&mut self) -> Result<()> {
        match &mut self.dead_letter {
            Some(dead) => dead.close(),
            None => Ok(()),
        }
    }
}
