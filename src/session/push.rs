//! Rows pushed into a session's streams: Arrow batches, JSON lines or CSV,
//! conformed to the stream's columns and logged first when durable.

use super::*;

impl Session {
    /// Declares a push stream from Rust: `schema`'s columns (TIMESTAMP
    /// (ms), TEXT, DOUBLE, BIGINT or BOOLEAN), its event-time column and
    /// watermark delay.
    pub fn register_stream(
        &mut self,
        name: &str,
        schema: SchemaRef,
        event_time: Option<&str>,
        delay_ms: i64,
    ) -> Result<()> {
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let event_time = event_time
            .map(|column| {
                let i = schema.index_of(column).map_err(|_| {
                    Error::Plan(format!(
                        "stream {name}: no column '{column}' for event time"
                    ))
                })?;
                match schema.field(i).data_type() {
                    DataType::Timestamp(TimeUnit::Millisecond, None) => Ok(i),
                    other => Err(Error::Plan(format!(
                        "stream {name}: event-time column '{column}' is {other}, not TIMESTAMP"
                    ))),
                }
            })
            .transpose()?;
        let source = SourceConfig {
            stream: name.to_string(),
            schema: schema.clone(),
            connector: "push",
            location: SourceLocation::Push,
            format: Format::Jsonl,
            replay: Replay::Fast,
            event_time,
            batch_size: 8192,
            dead_letter: None,
            follow: false,
            decode_threads: 1,
            decode: Decoding::default(),
        };
        self.engine.add_stream(StreamDef {
            name: name.to_string(),
            schema,
            event_time,
            delay_ms: delay_ms.max(0),
            lateness_ms: 0,
            idle_timeout: None,
            source,
            late_of: None,
            buffer: Default::default(),
        })?;
        self.open_wal(name)
    }

    /// Gives push stream `stream` its write-ahead log, in a durable
    /// session.
    pub(super) fn open_wal(&self, stream: &str) -> Result<()> {
        let Some(durable) = &self.durable else {
            return Ok(());
        };
        let Ok(def) = self.push_stream(stream) else {
            return Ok(());
        };
        let wal = Wal::open(
            &durable.wal_dir(),
            &def.name,
            def.schema.clone(),
            durable.wal,
        )?;
        self.live.attach_wal(&def.name, Arc::new(wal));
        Ok(())
    }

    /// Pushes rows into push stream `stream`; columns are matched by name
    /// and cast to the stream's types.
    pub async fn push(&self, stream: &str, batch: RecordBatch) -> Result<()> {
        self.push_conformed(stream, batch, None).await
    }

    /// Pushes rows like [`Session::push`], waiting at most `timeout` for
    /// the stream's queries to have room for them; then fails with
    /// [`Error::Busy`] having pushed nothing (see [`Live::push_within`]).
    pub async fn push_within(
        &self,
        stream: &str,
        batch: RecordBatch,
        timeout: std::time::Duration,
    ) -> Result<()> {
        self.push_conformed(stream, batch, Some(timeout)).await
    }

    /// Casts `batch` to the stream's columns and pushes it, waiting at most
    /// `timeout` for room when given; then raises the stream's largest
    /// event time.
    pub(super) async fn push_conformed(
        &self,
        stream: &str,
        batch: RecordBatch,
        timeout: Option<std::time::Duration>,
    ) -> Result<()> {
        let def = self.push_stream(stream)?;
        let batch = conform(&def.schema, &batch, stream)?;
        let latest = latest_event_time(&def, &batch);
        match timeout {
            Some(timeout) => self.live.push_within(stream, batch, timeout).await?,
            None => self.live.push(stream, batch).await?,
        }
        if let Some(t) = latest {
            self.live.push_stats(stream).max_event_time.raise(t);
        }
        Ok(())
    }

    /// Pushes rows written as JSON lines (one object per line); malformed
    /// lines are skipped and counted (see [`Session::push_stats`]). Returns
    /// the number of rows pushed.
    pub async fn push_json(&self, stream: &str, text: &str) -> Result<u64> {
        self.push_text(stream, Format::Jsonl, text).await
    }

    /// Pushes rows written as CSV with a header line; like
    /// [`Session::push_json`].
    pub async fn push_csv(&self, stream: &str, text: &str) -> Result<u64> {
        self.push_text(stream, Format::Csv, text).await
    }

    pub(super) async fn push_text(&self, stream: &str, format: Format, text: &str) -> Result<u64> {
        let def = self.push_stream(stream)?;
        let stats = self.live.push_stats(stream);
        let parsed = SourceStats::default();
        let mut batches = Vec::new();
        read_bytes(&def.source, format, text.as_bytes(), &parsed, &mut |b| {
            batches.push(b);
            true
        })?;
        let bad = parsed.bad_rows.load(Ordering::Relaxed);
        let samples =
            std::mem::take(&mut *parsed.bad_samples.lock().unwrap_or_else(|e| e.into_inner()));
        let unsampled = bad - samples.len() as u64;
        for row in samples {
            stats.record_bad(row);
        }
        stats.bad_rows.fetch_add(unsampled, Ordering::Relaxed);
        let mut rows = 0;
        for batch in batches {
            rows += batch.num_rows() as u64;
            self.live.push(stream, batch).await?;
        }
        if let Some(t) = parsed.max_event_time.get() {
            stats.max_event_time.raise(t);
        }
        if bad > 0 && rows == 0 {
            return Err(Error::Connector(format!(
                "stream {stream}: no valid row among the {bad} pushed"
            )));
        }
        Ok(rows)
    }

    /// Rows pushed into `stream` so far, and the malformed ones.
    pub fn push_stats(&self, stream: &str) -> Arc<SourceStats> {
        self.live.push_stats(stream)
    }

    pub(super) fn push_stream(&self, stream: &str) -> Result<Arc<StreamDef>> {
        let def = self
            .engine
            .catalog()
            .stream(stream)
            .cloned()
            .ok_or_else(|| Error::Plan(format!("unknown stream '{stream}'")))?;
        if def.source.location != SourceLocation::Push {
            return Err(Error::Plan(format!(
                "stream {stream} reads its own input; only streams with connector = 'push' take pushed rows"
            )));
        }
        Ok(def)
    }

    /// Ends push stream `stream`: its windows fire and its queries finish.
    pub async fn end_stream(&self, stream: &str) {
        self.live.end_stream(stream).await
    }
}

/// `batch` with the columns of `schema`, matched by name and cast.
pub(super) fn conform(
    schema: &SchemaRef,
    batch: &RecordBatch,
    stream: &str,
) -> Result<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let column = batch.column_by_name(field.name()).ok_or_else(|| {
                Error::Connector(format!(
                    "stream {stream}: the pushed rows have no column '{}'",
                    field.name()
                ))
            })?;
            Ok(cast(column, field.data_type())?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// The largest event time in `batch`, a batch of stream `def`'s rows (for
/// the stream's lag in `/metrics`).
pub(super) fn latest_event_time(def: &StreamDef, batch: &RecordBatch) -> Option<i64> {
    let column = batch.column(def.event_time?);
    let times = column
        .as_any()
        .downcast_ref::<datafusion::arrow::array::TimestampMillisecondArray>()?;
    datafusion::arrow::compute::max(times)
}
