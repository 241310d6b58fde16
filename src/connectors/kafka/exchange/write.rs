//! The writer end of an exchange, [`ExchangeSink`]: a partition's rows and
//! watermarks produced into the internal topic, exactly once (see the
//! parent module's documentation).

use super::*;

/// Where an exchange writer's rows go.
pub enum Route {
    /// All to one partition of the internal topic (its own number).
    Own(i32),
    /// Each row to the partition that owns its key, of `partitions`: the
    /// key groups split into contiguous ranges, as between the instances
    /// of a stage.
    ByKey {
        /// The key.
        keys: Vec<Arc<dyn PhysicalExpr>>,
        /// Partitions of the internal topic.
        partitions: i32,
    },
}

/// The writer end of an exchange (see the module documentation).
pub struct ExchangeSink {
    producing: Producing,
    writer: i32,
    route: Route,
    /// The newest watermark not sent yet: consecutive watermarks between
    /// two batches go as one.
    held: Option<i64>,
    /// At the last barrier, its source had read its partition to the end,
    /// up to this offset, and handed on every row.
    idle_at: Option<i64>,
    /// It said it is idle up to this offset, and sent nothing since.
    said_idle: Option<i64>,
}

impl ExchangeSink {
    /// A writer for partition `writer`'s part, producing to `endpoint`'s
    /// topic exactly once under `transactional_id`.
    pub fn open(
        endpoint: &Endpoint,
        transactional_id: &str,
        writer: i32,
        route: Route,
    ) -> Result<Self> {
        let what = format!("exchange {} (partition {writer})", endpoint.topic);
        Ok(ExchangeSink {
            producing: Producing::open(endpoint, &what, Some(transactional_id))?,
            writer,
            route,
            held: None,
            idle_at: None,
            said_idle: None,
        })
    }

    /// The partitions every watermark goes to.
    fn targets(&self) -> Vec<i32> {
        match &self.route {
            Route::Own(p) => vec![*p],
            Route::ByKey { partitions, .. } => (0..*partitions).collect(),
        }
    }

    fn send_held(&mut self) -> Result<()> {
        let Some(watermark) = self.held.take() else {
            return Ok(());
        };
        self.send_marker(WATERMARK_HEADER, watermark.to_string())
    }

    /// Sends a message with header `name` to every partition it writes.
    fn send_marker(&mut self, name: &str, value: String) -> Result<()> {
        let records = self
            .targets()
            .into_iter()
            .map(|p| Record {
                key: None,
                value: Vec::new(),
                partition: Some(p),
                headers: vec![
                    (WRITER_HEADER.into(), self.writer.to_string()),
                    (name.into(), value.clone()),
                ],
            })
            .collect();
        self.producing.write(records)
    }

    /// At a checkpoint: a writer whose source had read its partition to
    /// the end at the barrier says it is idle up to that offset, so that it
    /// does not hold the other partitions' event time back, as an idle
    /// partition does within one process. Its next rows or watermark make
    /// it active again; so does, for the readers, a message in its
    /// partition past that offset (see [`ExchangeReading::advance`]).
    fn say_idle(&mut self) -> Result<()> {
        let Some(offset) = self.idle_at.take() else {
            return Ok(());
        };
        if self.said_idle != Some(offset) {
            self.said_idle = Some(offset);
            self.send_marker(IDLE_HEADER, offset.to_string())?;
        }
        Ok(())
    }

    fn rows(&mut self, batch: &RecordBatch, kind: Option<RowKind>) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        self.said_idle = None;
        self.send_held()?;
        let mut records = Vec::new();
        for (partition, rows) in self.split(batch)? {
            for value in encode(&rows)? {
                records.push(Record {
                    key: None,
                    value,
                    partition: Some(partition),
                    headers: vec![
                        (WRITER_HEADER.into(), self.writer.to_string()),
                        (KIND_HEADER.into(), kind_code(kind).to_string()),
                    ],
                });
            }
        }
        self.producing.write(records)
    }

    /// `batch`'s rows by the partition they go to.
    fn split(&self, batch: &RecordBatch) -> Result<Vec<(i32, RecordBatch)>> {
        let (keys, partitions) = match &self.route {
            Route::Own(p) => return Ok(vec![(*p, batch.clone())]),
            Route::ByKey { keys, partitions } => (keys, *partitions),
        };
        let arrays: Vec<ArrayRef> = keys
            .iter()
            .map(|k| k.evaluate(batch)?.into_array(batch.num_rows()))
            .collect::<datafusion::common::Result<_>>()?;
        let groups = key_groups_of(&arrays, batch.num_rows())?;
        let mut rows: BTreeMap<i32, Vec<u32>> = BTreeMap::new();
        for (row, group) in groups.into_iter().enumerate() {
            let partition = instance_of(group, partitions as usize) as i32;
            rows.entry(partition).or_default().push(row as u32);
        }
        rows.into_iter()
            .map(|(p, indices)| {
                let taken = take_record_batch(batch, &UInt32Array::from(indices))?;
                Ok((p, taken))
            })
            .collect()
    }
}

/// `batch` as Arrow IPC streams of at most about [`MESSAGE_BYTES`] each.
pub(super) fn encode(batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
    let rows = batch.num_rows();
    let per_row = batch.get_array_memory_size() / rows.max(1);
    let chunk = (MESSAGE_BYTES / per_row.max(1)).clamp(1, rows.max(1));
    (0..rows)
        .step_by(chunk)
        .map(|start| {
            let part = batch.slice(start, chunk.min(rows - start));
            let mut writer = StreamWriter::try_new(Vec::new(), &part.schema())?;
            writer.write(&part)?;
            writer.finish()?;
            Ok(writer.into_inner()?)
        })
        .collect()
}

impl Sink for ExchangeSink {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows(batch, None)
    }

    fn write_changes(&mut self, batch: &RecordBatch, kind: RowKind) -> Result<()> {
        self.rows(batch, Some(kind))
    }

    fn watermark(&mut self, ms: i64) -> Result<()> {
        self.held = Some(ms);
        self.said_idle = None;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.held = Some(END_OF_INPUT);
        self.send_held()?;
        self.producing.finish()
    }

    fn stopped(&mut self) -> Result<()> {
        self.producing.stopped()
    }

    fn sources_at_barrier(&mut self, positions: &[SourcePosition]) -> Result<()> {
        let writer = self.writer.to_string();
        self.idle_at = positions
            .iter()
            .find_map(|p| p.extra.get("idle")?.get(&writer)?.as_i64());
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<Option<SinkCommit>> {
        self.send_held()?;
        self.say_idle()?;
        self.producing.checkpoint()
    }

    fn committed(&mut self) -> Result<()> {
        self.producing.committed()
    }

    fn restore(&mut self, commit: &SinkCommit) -> Result<()> {
        self.producing.restore(commit)
    }

    fn client_errors(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicU64>> {
        Some(self.producing.errors())
    }

    fn needs_checkpoints(&self) -> Option<String> {
        Some(format!(
            "partition {}: an exchange between the processes of a group produces when a checkpoint covers its rows: run with --checkpoint-dir",
            self.writer
        ))
    }
}

/// Makes `endpoint`'s topic with `partitions` partitions unless it exists
/// (an operator may create it beforehand, for brokers that refuse
/// clients creating topics); fails if it exists with another number (the
/// group's input was re-partitioned since: its internal topics must be
/// deleted).
pub async fn ensure_topic(endpoint: &Endpoint, partitions: i32) -> Result<()> {
    let what = format!("internal topic {}", endpoint.topic);
    let admin: AdminClient<DefaultClientContext> = endpoint
        .client_config(&[])
        .create()
        .map_err(|e| kafka_error(&what, e))?;
    let found = match partitions_of(&admin, &endpoint.topic) {
        Ok(Some(found)) => found,
        Ok(None) => {
            create_topic(&admin, &endpoint.topic, partitions)
                .await
                .map_err(|e| {
                    Error::Connector(format!(
                        "kafka: cannot create {what} ({e}): create it with {partitions} partitions, as many as the group's topic"
                    ))
                })?;
            partitions
        }
        Err(e) => return Err(kafka_error(&what, e)),
    };
    if found != partitions {
        return Err(Error::Connector(format!(
            "kafka: {what} has {found} partitions, the group's topic {partitions}: delete the internal topic (the group's input was re-partitioned)"
        )));
    }
    Ok(())
}

/// How many partitions `topic` has; `None` when it does not exist. Asks
/// for every topic's metadata, since asking for one may create it with
/// the broker's default partitions.
fn partitions_of(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> std::result::Result<Option<i32>, rdkafka::error::KafkaError> {
    let metadata = admin.inner().fetch_metadata(None, CALL_TIMEOUT)?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len() as i32))
}

async fn create_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    partitions: i32,
) -> std::result::Result<(), String> {
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
    let results = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| e.to_string())?;
    for result in results {
        match result {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(code.to_string()),
        }
    }
    Ok(())
}
