//! Local HTTP servers for the connectors' unit tests.

use std::net::SocketAddr;

use axum::Router;

/// Serves each app on a free port of 127.0.0.1 until the runtime drops.
pub fn serve(apps: Vec<Router>) -> (Vec<SocketAddr>, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut addrs = Vec::new();
    for app in apps {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        addrs.push(listener.local_addr().unwrap());
        runtime.spawn(async move { axum::serve(listener, app).await });
    }
    (addrs, runtime)
}
