//! Request bodies for `vigil serve`, sent to its router in-process: the
//! input up to the first 0 byte is posted to `/statements` (after the
//! stream declarations), the rest to `/streams/m/rows` as CSV or JSON
//! lines. Every answer must be a well-formed status; a panic inside a
//! handler would abort here.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower_service::Service;
use vigil::service::{AppState, Config, router};
use vigil::session::Session;

/// A stream rows can be pushed into, and a query reading it.
const PRELUDE: &str = "CREATE STREAM m (ts TIMESTAMP, host TEXT, cpu DOUBLE, n BIGINT, ok BOOLEAN,
    WATERMARK FOR ts AS ts) WITH (connector = 'push');
SELECT window_end, host, avg(cpu) FROM TUMBLE(m, ts, INTERVAL '10' SECOND) GROUP BY window_end, host;";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

async fn post(app: &mut axum::Router, uri: &str, content_type: &str, body: Vec<u8>) -> StatusCode {
    let request = Request::post(uri)
        .header("content-type", content_type)
        .body(Body::from(body))
        .expect("a request");
    let response = app.call(request).await.expect("infallible");
    let status = response.status();
    let _ = http_body_util::BodyExt::collect(response.into_body()).await;
    status
}

fuzz_target!(|data: &[u8]| {
    let (sql, rows) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    runtime().block_on(async {
        let state = AppState::new(Session::new(), &Config::default());
        let mut app = router(state.clone());
        let declared = post(
            &mut app,
            "/statements",
            "text/plain",
            PRELUDE.as_bytes().to_vec(),
        )
        .await;
        assert_eq!(declared, StatusCode::OK);
        let status = post(&mut app, "/statements", "text/plain", sql.to_vec()).await;
        assert!(status.is_success() || status.is_client_error(), "{status}");
        let json = rows.first().is_some_and(|b| b % 2 == 1);
        let content_type = if json {
            "application/x-ndjson"
        } else {
            "text/csv"
        };
        let status = post(&mut app, "/streams/m/rows", content_type, rows.to_vec()).await;
        assert!(status.is_success() || status.is_client_error(), "{status}");
        state.shutdown().await;
    });
});
