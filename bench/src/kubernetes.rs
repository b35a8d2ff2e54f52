//! Watchers of Kubernetes' API: HTTP/2 in plain text (prior knowledge),
//! one JSON watch per watcher, as client-go's informers watch an
//! apiserver over TLS; each line is counted as the other targets' events
//! are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::watchers::Seen;

/// One HTTP/2 connection to the API, its driver running in a task.
pub async fn connect(
    endpoint: &str,
    window: u32,
) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(endpoint).await?;
    tcp.set_nodelay(true)?;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .initial_connection_window_size(window.saturating_mul(16))
        .max_concurrent_reset_streams(0)
        .handshake(tcp)
        .await
        .context("HTTP/2 handshake with Kubernetes' API")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(send)
}

/// The path of a watch from `start_rev`, of the pods on `node` if given.
pub fn watch_path(start_rev: i64, node: Option<&str>) -> String {
    let mut path = format!("/api/v1/pods?watch=true&resourceVersion={start_rev}");
    if let Some(node) = node {
        path.push_str(&format!("&fieldSelector=spec.nodeName%3D{node}"));
    }
    path
}

/// A watch on `send`: what it receives until `stop`. Opened once its
/// response's head came (retried while the cache is not ready).
pub async fn follow(
    send: h2::client::SendRequest<Bytes>,
    authority: String,
    path: String,
    stop: CancellationToken,
    opened: Arc<AtomicU64>,
    counted: Arc<AtomicU64>,
) -> anyhow::Result<Seen> {
    let mut seen = Seen::default();
    let mut body = None;
    for _ in 0..100 {
        let request = http::Request::get(format!("http://{authority}{path}"))
            .header("accept", "application/json")
            .body(())?;
        let mut ready = send.clone().ready().await?;
        let (response, _) = ready.send_request(request, true)?;
        let response = response.await?;
        match response.status().as_u16() {
            200 => {
                body = Some(response.into_body());
                break;
            }
            503 => tokio::time::sleep(Duration::from_millis(100)).await,
            other => bail!("a watch of Kubernetes' API answered {other}"),
        }
    }
    let mut body = body.context("Kubernetes' API did not become ready in 10 s")?;
    opened.fetch_add(1, Ordering::Relaxed);
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let data = tokio::select! {
            _ = stop.cancelled() => break,
            data = body.data() => data,
        };
        let Some(data) = data else {
            seen.ended = Some("end of stream".into());
            break;
        };
        let data = data?;
        let _ = body.flow_control().release_capacity(data.len());
        seen.bytes += data.len() as u64;
        pending.extend_from_slice(&data);
        let mut start = 0;
        while let Some(end) = pending[start..].iter().position(|b| *b == b'\n') {
            let line = &pending[start..start + end];
            start += end + 1;
            if line.starts_with(br#"{"type":"BOOKMARK""#) {
                continue;
            }
            if line.starts_with(br#"{"type":"ERROR""#) {
                seen.ended = Some(String::from_utf8_lossy(line).into_owned());
                return Ok(seen);
            }
            if seen.record(line, None) {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }
        pending.drain(..start);
    }
    Ok(seen)
}
