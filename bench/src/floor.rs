//! The write floor: the least a fan-out proxy can do for the same load, as
//! a reference for the others' CPU. One etcd watch; for each response from
//! etcd, one write to each connection that has watchers for its events,
//! carrying each event's value as is (length-prefixed, once per such
//! watcher). No HTTP/2, no cache, no filtering beyond the node, no flow
//! control: its CPU is what receiving the events and the writes themselves
//! cost on this machine.
//!
//! A client opens a connection with a hello, a big-endian `u32` count and
//! that many `u32` node indices, one per watcher on the connection
//! ([`EVERY`] for a watcher that wants every event); it then reads frames
//! of a `u32` length and a value.

use std::collections::HashMap;
use std::net::SocketAddr;

use anyhow::Context;
use etcd_client::{Client, WatchOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The node index of a watcher that wants every event.
pub const EVERY: u32 = u32::MAX;

struct Conn {
    tcp: TcpStream,
    /// Watchers that want every event.
    every: u32,
    /// Watchers per wanted node.
    of_node: HashMap<u32, u32>,
    /// What this response brings the connection.
    out: Vec<u8>,
}

/// Serves `connections` clients from one watch of `prefix` from `start`;
/// returns when a client leaves.
pub async fn serve(
    listen: SocketAddr,
    etcd: &str,
    prefix: &str,
    start: i64,
    connections: usize,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    let mut conns = Vec::new();
    while conns.len() < connections {
        let (mut tcp, _) = listener.accept().await?;
        // A connection without a hello is a probe of the port.
        let Ok(wants) = read_hello(&mut tcp).await else {
            continue;
        };
        tcp.set_nodelay(true)?;
        let mut conn = Conn {
            tcp,
            every: 0,
            of_node: HashMap::new(),
            out: Vec::new(),
        };
        for node in wants {
            match node {
                EVERY => conn.every += 1,
                n => *conn.of_node.entry(n).or_default() += 1,
            }
        }
        conns.push(conn);
    }
    let mut client = Client::connect([etcd], None).await?;
    let options = WatchOptions::new().with_prefix().with_start_revision(start);
    let mut stream = client.watch(prefix, Some(options)).await?;
    while let Some(response) = stream.message().await? {
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let node = node_index(crate::load::parse(kv.value()).1);
            for conn in &mut conns {
                let copies = conn.every
                    + node
                        .and_then(|n| conn.of_node.get(&n))
                        .copied()
                        .unwrap_or(0);
                for _ in 0..copies {
                    conn.out
                        .extend_from_slice(&(kv.value().len() as u32).to_be_bytes());
                    conn.out.extend_from_slice(kv.value());
                }
            }
        }
        for conn in &mut conns {
            if !conn.out.is_empty() {
                conn.tcp.write_all(&conn.out).await?;
                conn.out.clear();
            }
        }
    }
    Ok(())
}

/// `node-N` as N.
fn node_index(node: &[u8]) -> Option<u32> {
    std::str::from_utf8(node.strip_prefix(b"node-")?)
        .ok()?
        .parse()
        .ok()
}

async fn read_hello(tcp: &mut TcpStream) -> anyhow::Result<Vec<u32>> {
    let n = tcp.read_u32().await?;
    let mut wants = Vec::with_capacity(n as usize);
    for _ in 0..n {
        wants.push(tcp.read_u32().await?);
    }
    Ok(wants)
}

/// Opens a client connection for watchers that want `wants`.
pub async fn connect(addr: &str, wants: &[u32]) -> anyhow::Result<TcpStream> {
    let mut tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the floor at {addr}"))?;
    let mut hello = Vec::with_capacity(4 + 4 * wants.len());
    hello.extend_from_slice(&(wants.len() as u32).to_be_bytes());
    for w in wants {
        hello.extend_from_slice(&w.to_be_bytes());
    }
    tcp.write_all(&hello).await?;
    Ok(tcp)
}

/// Reads the next value on a client connection into `buf`; false at the
/// connection's end.
pub async fn next_value(
    tcp: &mut tokio::io::BufReader<TcpStream>,
    buf: &mut Vec<u8>,
) -> anyhow::Result<bool> {
    let len = match tcp.read_u32().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    buf.resize(len, 0);
    tcp.read_exact(buf).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::node_index;

    #[test]
    fn node_names_read_as_indices() {
        assert_eq!(node_index(b"node-17"), Some(17));
        assert_eq!(node_index(b"node-"), None);
        assert_eq!(node_index(b"other-1"), None);
    }
}
