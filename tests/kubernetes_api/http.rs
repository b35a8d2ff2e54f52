//! A plain HTTP/1.1 client, enough to read what a Kubernetes client reads:
//! a response's status and headers, then its body whole or, for a watch,
//! line by line as its chunks arrive.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// What was read of the body and not yet taken as a line.
    pending: Vec<u8>,
    done: bool,
}

/// Sends `method target` with `headers` and reads the response's head.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(tcp);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (name, value) = l.split_once(':').unwrap();
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut response = Response {
        status,
        headers,
        reader,
        chunked,
        pending: Vec::new(),
        done: false,
    };
    if !chunked {
        let length: usize = response
            .header("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        response.reader.read_exact(&mut body).await.unwrap();
        response.pending = body;
        response.done = true;
    }
    response
}

/// `GET target` read whole: its status and body.
pub async fn get(
    addr: SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    let mut r = request(addr, "GET", target, headers).await;
    let body = r.body().await;
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{target}: {e}: {}", String::from_utf8_lossy(&body)));
    (r.status, json)
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The next chunk; false at the body's end.
    async fn chunk(&mut self) -> bool {
        if self.done {
            return false;
        }
        let mut size = String::new();
        self.reader.read_line(&mut size).await.unwrap();
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            self.done = true;
            return false;
        }
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk).await.unwrap();
        chunk.truncate(size);
        self.pending.extend_from_slice(&chunk);
        true
    }

    pub async fn body(&mut self) -> Vec<u8> {
        while self.chunked && self.chunk().await {}
        std::mem::take(&mut self.pending)
    }

    /// The next line of a watch, parsed; none at the end of the body.
    pub async fn next_line(&mut self) -> Option<serde_json::Value> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let more = tokio::time::timeout(Duration::from_secs(10), self.chunk())
                .await
                .expect("a watch line within 10 s");
            if !more {
                assert!(self.pending.is_empty(), "a line cut short");
                return None;
            }
        }
    }
}
