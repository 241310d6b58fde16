//! Embedding vigil in a program: declare a stream the program feeds and an
//! alert over it in SQL, push events as JSON lines, print the alerts as they
//! fire.
//!
//! Run: `cargo run --example embed`

use vigil::error::{Error, Result};
use vigil::session::{Executed, Session};

const SETUP: &str = "
CREATE STREAM events (ts TIMESTAMP, host TEXT, cpu DOUBLE, WATERMARK FOR ts AS ts)
  WITH (connector = 'push');

CREATE ALERT hot_cpu AS
  SELECT window_end, host, avg(cpu) AS avg_cpu
  FROM TUMBLE(events, ts, INTERVAL '10' SECOND)
  GROUP BY window_end, host
ALERT WHEN avg_cpu > 90 FOR 2 WINDOWS
  RESOLVE WHEN avg_cpu < 50
  MESSAGE '{state}: {host} averaged {avg_cpu:.1} % CPU';
";

#[tokio::main]
async fn main() -> Result<()> {
    for line in run().await? {
        println!("{line}");
    }
    Ok(())
}

/// Feeds a minute of events for two hosts (web-2 runs hot from 20 s to 45 s)
/// and returns the alert messages in the order they fired.
pub async fn run() -> Result<Vec<String>> {
    let mut session = Session::new();
    let mut alert = None;
    for executed in session.execute(SETUP)? {
        if let Executed::Query(handle) = executed {
            alert = Some(handle);
        }
    }
    let mut alert = alert.ok_or_else(|| Error::Plan("the setup starts no alert".into()))?;

    // Read the alerts while the events go in.
    let reader = tokio::spawn(async move {
        let mut messages = Vec::new();
        while let Some(batch) = alert.next().await {
            let column = batch
                .column_by_name("message")
                .expect("alert rows have a message");
            let text = column
                .as_any()
                .downcast_ref::<datafusion::arrow::array::StringArray>()
                .expect("message is text");
            messages.extend(text.iter().flatten().map(str::to_string));
        }
        messages
    });

    for second in 0..60 {
        let hot = (20..45).contains(&second);
        let lines = format!(
            "{{\"ts\": {ms}, \"host\": \"web-1\", \"cpu\": 30}}\n{{\"ts\": {ms}, \"host\": \"web-2\", \"cpu\": {cpu}}}\n",
            ms = second * 1000,
            cpu = if hot { 97 } else { 35 }
        );
        session.push_json("events", &lines).await?;
    }
    // The end of the events: every window fires, the alert query ends.
    session.end_stream("events").await;
    reader
        .await
        .map_err(|e| Error::Connector(format!("the alert reader failed: {e}")))
}
