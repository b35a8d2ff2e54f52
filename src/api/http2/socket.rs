//! A connection's socket whose writes are gathered and sent together.
//!
//! One event goes to many watch streams of a connection at once. HTTP/2
//! (h2) writes each DATA frame it does not copy with its own `writev` and
//! flushes after each, so twenty streams receiving the same event cost
//! twenty system calls, twenty TCP segments and twenty wake-ups of the
//! client. Here writes only fill a buffer, flushes return at once, and the
//! buffer goes out in one write after each poll of the connection's task,
//! which serves every stream that the event made ready.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes gathered before writes wait for the socket: bounds a connection's
/// buffer and makes a large response go out while it is being produced.
const GATHER_LIMIT: usize = 64 * 1024;

/// The first allocation of a connection's buffer.
const MIN_CAPACITY: usize = 4 * 1024;

/// A buffer larger than this is freed when writes are small again.
const KEPT_CAPACITY: usize = 16 * 1024;

thread_local! {
    /// The buffer lent to each connection polled on this thread, and given
    /// back once its writes have gone out, as they nearly always have by
    /// the end of the poll. One buffer in the CPU's cache for every
    /// connection, rather than one per connection that had to be fetched
    /// again for each pass as it was written.
    static LENT: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// The socket as the HTTP/2 connection reads and writes it: a TCP stream,
/// or a TLS stream over one.
pub struct Socket {
    read: Reader,
    out: Arc<Mutex<Outgoing>>,
}

/// The write side, shared by the [`Socket`] and the [`Gathered`] future
/// that drives the connection (both in the same task, so never contended).
struct Outgoing {
    write: Writer,
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already written.
    sent: usize,
    /// A failed write, reported to the connection at its next write.
    failed: Option<io::ErrorKind>,
    /// Writes made to the socket.
    writes: u64,
}

impl Outgoing {
    fn pending(&self) -> bool {
        self.sent < self.buf.len()
    }

    /// Writes what is buffered; `Pending` once the socket is full.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while self.pending() {
            let n = match ready!(Pin::new(&mut self.write).poll_write(cx, &self.buf[self.sent..])) {
                Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                other => other,
            };
            match n {
                Ok(n) => {
                    self.sent += n;
                    self.writes += 1;
                }
                Err(e) => {
                    self.failed = Some(e.kind());
                    return Poll::Ready(Err(e));
                }
            }
        }
        // A buffer grown by a burst is given back once writes are small
        // again, so that idle connections hold little.
        if self.buf.capacity() > KEPT_CAPACITY && self.buf.len() < self.buf.capacity() / 4 {
            self.buf = Vec::new();
        }
        self.buf.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes as much of `bufs` as the gathering limit allows.
    fn gather(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.buf.len() >= GATHER_LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let want = (self.buf.len() + total)
            .next_power_of_two()
            .clamp(MIN_CAPACITY, GATHER_LIMIT);
        if want > self.buf.capacity() {
            self.buf.reserve_exact(want - self.buf.len());
        }
        let mut taken = 0;
        for b in bufs {
            let room = GATHER_LIMIT.saturating_sub(self.buf.len());
            let n = b.len().min(room);
            self.buf.extend_from_slice(&b[..n]);
            taken += n;
            if n < b.len() {
                break;
            }
        }
        Poll::Ready(Ok(taken))
    }
}

/// Splits `tcp` into the socket a connection is served on and the handle
/// that [`Gathered`] uses to send what the connection wrote.
pub fn split(tcp: TcpStream) -> (Socket, Flusher) {
    let (read, write) = tcp.into_split();
    halves(Box::new(read), Box::new(write))
}

/// [`split`] for any stream, such as TLS over TCP.
pub fn split_io<T: AsyncRead + AsyncWrite + Send + 'static>(io: T) -> (Socket, Flusher) {
    let (read, write) = tokio::io::split(io);
    halves(Box::new(read), Box::new(write))
}

fn halves(read: Reader, write: Writer) -> (Socket, Flusher) {
    let out = Arc::new(Mutex::new(Outgoing {
        write,
        buf: Vec::new(),
        sent: 0,
        failed: None,
        writes: 0,
    }));
    (
        Socket {
            read,
            out: out.clone(),
        },
        Flusher(out),
    )
}

/// Sends the bytes a [`Socket`] gathered.
pub struct Flusher(Arc<Mutex<Outgoing>>);

impl Flusher {
    /// After each poll of the connection: writes what it gathered.
    /// Whatever is left (the socket is full) is written when the socket
    /// wakes the task.
    fn poll_after(&self, cx: &mut Context<'_>) {
        let mut out = self.0.lock();
        if !out.pending() {
            return;
        }
        if let Poll::Ready(Err(_)) = out.poll_drain(cx) {
            // The connection learns of it at its next write or flush.
            cx.waker().wake_by_ref();
        }
    }
}

/// Drives a connection served on a [`Socket`], sending what it wrote
/// after each poll.
pub struct Gathered<F> {
    conn: Pin<Box<F>>,
    flusher: Flusher,
}

impl<F> Gathered<F> {
    pub fn new(conn: F, flusher: Flusher) -> Self {
        Self {
            conn: Box::pin(conn),
            flusher,
        }
    }
}

impl<F: Future> Future for Gathered<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut out = self.flusher.0.lock();
            if out.buf.capacity() == 0 {
                out.buf = LENT.take();
            }
        }
        let done = self.conn.as_mut().poll(cx);
        if done.is_pending() {
            self.flusher.poll_after(cx);
        }
        let mut out = self.flusher.0.lock();
        if !out.pending() {
            out.buf.clear();
            LENT.set(std::mem::take(&mut out.buf));
        }
        done
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.out.lock().gather(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.out.lock().gather(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Returns at once: the buffer is written after the connection's poll.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.out.lock().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.out.lock();
        ready!(out.poll_drain(cx))?;
        Pin::new(&mut out.write).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair with small kernel buffers, so that a client that
    /// does not read soon stops the server's writes.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpSocket::new_v4().unwrap();
        client.set_recv_buffer_size(16 * 1024).unwrap();
        let client = client.connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let server = accepted.unwrap().0;
        socket2::SockRef::from(&server)
            .set_send_buffer_size(16 * 1024)
            .unwrap();
        (server, client.unwrap())
    }

    /// Frames written in one poll of the connection, each flushed as h2
    /// does, go out in order in one write.
    #[tokio::test]
    async fn the_writes_of_one_poll_go_out_as_one() {
        let (server, mut client) = pair().await;
        let (mut socket, flusher) = split(server);
        let out = flusher.0.clone();
        let frames: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1100]).collect();
        let mut polls = 0;
        let conn = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                for f in &frames {
                    let head = [0xAB; 9];
                    let bufs = [io::IoSlice::new(&head), io::IoSlice::new(f)];
                    let n = Pin::new(&mut socket).poll_write_vectored(cx, &bufs);
                    assert!(matches!(n, Poll::Ready(Ok(1109))));
                    assert!(Pin::new(&mut socket).poll_flush(cx).is_ready());
                }
                assert_eq!(out.lock().writes, 0, "nothing is written during the poll");
            }
            Poll::<()>::Pending
        });
        let mut read = vec![0; 20 * 1109];
        tokio::select! {
            _ = Gathered::new(conn, flusher) => unreachable!(),
            r = client.read_exact(&mut read) => { r.unwrap(); }
        }
        for (chunk, f) in read.chunks(1109).zip(&frames) {
            assert_eq!(&chunk[..9], &[0xAB; 9]);
            assert_eq!(&chunk[9..], &f[..]);
        }
        assert_eq!(out.lock().writes, 1);
    }

    /// More than the buffer holds, to a client that reads late: writes wait
    /// for the socket, and shutdown sends the rest before closing.
    #[tokio::test]
    async fn a_large_response_waits_for_the_socket_and_arrives_whole() {
        let (server, mut client) = pair().await;
        let (mut socket, flusher) = split(server);
        let out = flusher.0.clone();
        let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let conn = Gathered::new(
            async move {
                for chunk in sent.chunks(16 * 1024 + 9) {
                    socket.write_all(chunk).await?;
                    socket.flush().await?;
                }
                socket.shutdown().await
            },
            flusher,
        );
        let writer = tokio::spawn(conn);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "4 MiB fit in the buffers unread");
        let mut read = Vec::new();
        client.read_to_end(&mut read).await.unwrap();
        writer.await.unwrap().unwrap();
        assert!(read == data, "the bytes arrive whole and in order");
        assert!(out.lock().buf.capacity() <= GATHER_LIMIT);
    }

    /// A write that fails reaches the connection as an error.
    #[tokio::test]
    async fn a_failed_write_ends_the_connection_with_an_error() {
        let (server, client) = pair().await;
        let (mut socket, flusher) = split(server);
        drop(client);
        let conn = Gathered::new(
            async move {
                let chunk = vec![7u8; 16 * 1024];
                for _ in 0..10_000 {
                    socket.write_all(&chunk).await?;
                    socket.flush().await?;
                    tokio::task::yield_now().await;
                }
                Ok::<_, io::Error>(())
            },
            flusher,
        );
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), conn).await;
        assert!(ended.expect("ends").is_err(), "the closed peer is an error");
    }
}
