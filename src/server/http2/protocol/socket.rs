//! A connection's socket: its two halves, and the outgoing frames of each
//! pass of the connection's task written in one system call after it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// TCP keepalive on accepted connections: finds peers gone without a word
/// even where HTTP/2 pings are not answered for long.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// The socket options of an accepted connection.
pub fn tune(tcp: &TcpStream) {
    // Events go out as they happen: without TCP_NODELAY, Nagle holds each
    // small write until the client's delayed ACK (measured: p50 +10 ms,
    // p99 +40 ms at 200 events/s).
    let _ = tcp.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
    let _ = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive);
}

/// Outgoing bytes past which a connection stops producing until the socket
/// takes them: bounds its buffer when the client reads slowly.
pub const WRITE_LIMIT: usize = 64 * 1024;

/// A buffer larger than this is freed once it is written out.
const KEPT_CAPACITY: usize = 64 * 1024;

type Lent = std::thread::LocalKey<std::cell::Cell<BytesMut>>;

thread_local! {
    /// The buffers lent to each connection polled on this thread, one for
    /// its outgoing frames and one for what it reads, and given back once
    /// empty, as they nearly always are by the end of the poll: one pair in
    /// the CPU's cache for every connection, rather than one per connection
    /// (or, for reads, one allocated and freed at every pass).
    pub static OUTGOING: std::cell::Cell<BytesMut> = std::cell::Cell::new(BytesMut::new());
    pub static INCOMING: std::cell::Cell<BytesMut> = std::cell::Cell::new(BytesMut::new());
}

/// Lends the thread's buffer to a connection that holds none.
pub fn lend(lent: &'static Lent, buf: &mut BytesMut) {
    if buf.capacity() == 0 {
        *buf = lent.take();
    }
}

/// Gives the buffer back once it is empty; a connection with bytes still
/// to write, or a frame half read, keeps its own.
pub fn return_lent(lent: &'static Lent, buf: &mut BytesMut) {
    if buf.is_empty() && buf.capacity() > 0 {
        buf.clear();
        lent.set(std::mem::take(buf));
    }
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;
type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A TCP stream, or a TLS stream over one, split in two.
pub struct Socket {
    pub read: Reader,
    write: Writer,
}

impl Socket {
    pub fn tcp(tcp: TcpStream) -> Self {
        let (read, write) = tcp.into_split();
        Self {
            read: Box::new(read),
            write: Box::new(write),
        }
    }

    pub fn io<T: AsyncRead + AsyncWrite + Send + 'static>(io: T) -> Self {
        let (read, write) = tokio::io::split(io);
        Self {
            read: Box::new(read),
            write: Box::new(write),
        }
    }

    /// Writes what `out` holds; `Pending` once the socket is full, with
    /// the rest kept in `out`.
    pub fn poll_write_out(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut BytesMut,
    ) -> Poll<io::Result<()>> {
        while !out.is_empty() {
            match std::task::ready!(Pin::new(&mut self.write).poll_write(cx, out)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => out.advance(n),
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        // Written out whole, the buffer starts again at its beginning: left
        // past what it sent, it would move the next pass's frames back
        // there once they filled the rest (a copy of every pass's bytes,
        // a quarter of a delivery's instructions). Nothing held, nothing
        // moves.
        let _ = out.try_reclaim(out.capacity() + 1);
        // A buffer grown by a burst is given back, so that idle
        // connections hold little.
        if out.capacity() > KEPT_CAPACITY {
            *out = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }

    pub fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.write).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
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

    /// More than the kernel holds, to a client that reads late: the write
    /// waits for the socket and the bytes arrive whole.
    #[tokio::test]
    async fn a_large_write_waits_for_the_socket_and_arrives_whole() {
        let (server, mut client) = pair().await;
        let mut socket = Socket::tcp(server);
        let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let mut out = BytesMut::from(&data[..]);
        let writer = tokio::spawn(async move {
            std::future::poll_fn(|cx| socket.poll_write_out(cx, &mut out)).await?;
            std::future::poll_fn(|cx| socket.poll_shutdown(cx)).await
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writer.is_finished(), "4 MiB fit in the buffers unread");
        let mut read = Vec::new();
        client.read_to_end(&mut read).await.unwrap();
        writer.await.unwrap().unwrap();
        assert!(read == data, "the bytes arrive whole and in order");
    }

    /// A buffer written out whole is whole again: its next frames start at
    /// its beginning, not where the last write ended.
    #[tokio::test]
    async fn a_buffer_written_whole_starts_again_at_its_beginning() {
        let (server, mut client) = pair().await;
        let mut socket = Socket::tcp(server);
        let mut out = BytesMut::with_capacity(8 * 1024);
        let capacity = out.capacity();
        out.extend_from_slice(&[1u8; 6 * 1024]);
        std::future::poll_fn(|cx| socket.poll_write_out(cx, &mut out))
            .await
            .unwrap();
        assert_eq!(
            out.capacity(),
            capacity,
            "the capacity written past is back"
        );
        let mut read = vec![0u8; 6 * 1024];
        client.read_exact(&mut read).await.unwrap();
    }

    /// A write to a peer that left fails.
    #[tokio::test]
    async fn a_write_to_a_closed_peer_fails() {
        let (server, client) = pair().await;
        let mut socket = Socket::tcp(server);
        drop(client);
        let chunk = vec![7u8; 16 * 1024];
        let failed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            for _ in 0..10_000 {
                let mut out = BytesMut::from(&chunk[..]);
                if std::future::poll_fn(|cx| socket.poll_write_out(cx, &mut out))
                    .await
                    .is_err()
                {
                    return true;
                }
                tokio::task::yield_now().await;
            }
            false
        })
        .await;
        assert!(failed.expect("ends"), "the closed peer is an error");
    }
}
