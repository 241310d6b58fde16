//! `connector = 'webhook'`: each batch of result rows POSTed as a JSON
//! array to an HTTP endpoint, so that alerts reach Alertmanager-style
//! receivers, chat proxies and the like. The payload, delivery, retries and
//! idempotency keys are the HTTP kit's ([`super::http`]).

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;

use super::common::APPEND_ONLY;
use super::http::{
    BACKOFF, HEADERS, RETRIES, TIMEOUT, WebhookConfig, WebhookSink, delivery_config,
};
use super::options::Options;
use super::{OutputFormat, Sink, SinkConfig, SinkTarget};
use crate::connector::{Opener, OptionSpec, OptionType, SinkConnector, SinkOpen};
use crate::error::Result;

const OPTIONS: &[OptionSpec] = &[
    OptionSpec {
        name: "url",
        ty: OptionType::Url,
        default: None,
        accepted: "an http:// or https:// URL such as 'http://127.0.0.1:9093/hook'",
        doc: "the endpoint (required)",
    },
    RETRIES,
    BACKOFF,
    TIMEOUT,
    APPEND_ONLY,
    HEADERS,
];

/// `connector = 'webhook'` in `CREATE SINK`.
pub struct WebhookSinkConnector;

impl SinkConnector for WebhookSinkConnector {
    fn name(&self) -> &'static str {
        "webhook"
    }
    fn summary(&self) -> &'static str {
        "each batch POSTed as a JSON array, retried with back-off, with idempotency keys"
    }
    fn options(&self) -> &'static [OptionSpec] {
        OPTIONS
    }
    fn configure(&self, name: &str, opts: &Options<'_>, _: &Path) -> Result<SinkConfig> {
        let config = delivery_config(name, "webhook", opts)?;
        Ok(SinkConfig {
            name: name.to_string(),
            target: SinkTarget::Connector(Opener(Arc::new(config))),
            // The payload is always JSON; the format only matters to other sinks.
            format: OutputFormat::Jsonl,
            append_only: opts.flag("append_only")?,
        })
    }
}

impl SinkOpen for WebhookConfig {
    /// Only scheme, host and path: the query string or credentials may
    /// hold secrets.
    fn describe(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(url) => format!(
                "webhook {}://{}{}",
                url.scheme(),
                url.host_str().unwrap_or(""),
                url.path()
            ),
            Err(_) => "webhook".to_string(),
        }
    }

    fn open(&self, name: &str, _schema: &SchemaRef) -> Result<Box<dyn Sink>> {
        Ok(Box::new(WebhookSink::open(name, self)?))
    }
}
