//! A TCP forwarder between watchproxy and etcd that tests cut, blackhole
//! or slow down.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;

/// A TCP forwarder between watchproxy and etcd that a test can cut, to
/// make watchproxy lose etcd while etcd itself keeps running.
pub struct Forwarder {
    pub url: String,
    open: Arc<Mutex<bool>>,
    /// While true, bytes are held in both directions and nothing is
    /// closed: a network path that drops every packet.
    blackholed: tokio::sync::watch::Sender<bool>,
    /// Added to every byte's way from etcd to watchproxy.
    latency: tokio::sync::watch::Sender<Duration>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    task: JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(upstream: &str) -> Forwarder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = upstream.trim_start_matches("http://").to_owned();
        let open = Arc::new(Mutex::new(true));
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (blackholed, holes) = tokio::sync::watch::channel(false);
        let (latency, delays) = tokio::sync::watch::channel(Duration::ZERO);
        let (o, c) = (open.clone(), conns.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !*o.lock() {
                    continue; // dropped: the connection is refused
                }
                let upstream = upstream.clone();
                let holes = holes.clone();
                let delays = delays.clone();
                c.lock().push(tokio::spawn(async move {
                    if let Ok(out) = tokio::net::TcpStream::connect(&upstream).await {
                        let (ri, wi) = inbound.into_split();
                        let (ro, wo) = out.into_split();
                        let no_delay = tokio::sync::watch::channel(Duration::ZERO).1;
                        tokio::join!(
                            pump(ri, wo, holes.clone(), no_delay),
                            pump(ro, wi, holes, delays)
                        );
                    }
                }));
            }
        });
        Forwarder {
            url,
            open,
            blackholed,
            latency,
            conns,
            task,
        }
    }

    /// Delays what etcd sends by `by`, from now on.
    pub fn delay(&self, by: Duration) {
        self.latency.send_replace(by);
    }

    /// Holds every byte, closing nothing, until [`Forwarder::restore`].
    pub fn blackhole(&self) {
        self.blackholed.send_replace(true);
    }

    /// Breaks every connection and refuses new ones.
    pub fn cut(&self) {
        *self.open.lock() = false;
        for c in self.conns.lock().drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        *self.open.lock() = true;
        self.blackholed.send_replace(false);
        self.latency.send_replace(Duration::ZERO);
    }
}

/// Copies `from` to `to`, each chunk `delays` after it was read (in
/// order, without slowing the throughput), and holding what it read while
/// the path is blackholed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut holes: tokio::sync::watch::Receiver<bool>,
    delays: tokio::sync::watch::Receiver<Duration>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let due = tokio::time::Instant::now() + *delays.borrow();
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if holes.wait_for(|held| !held).await.is_err() {
                break;
            }
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
