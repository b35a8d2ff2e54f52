//! gRPC's framing on HTTP/2, for the calls the connection serves itself:
//! the length prefix of each message, and the `grpc-timeout` header.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use super::protocol::frame::{kind, HEAD};
use super::protocol::out::{frame_head, Out};
use crate::api::error::ApiError;

/// A message's prefix: a compressed flag and a big-endian length.
pub(super) const PREFIX: usize = 5;

/// The message of a request whose body is `buf`, all of it arrived.
pub(super) fn request_message(buf: &mut BytesMut, max: usize) -> Result<Bytes, ApiError> {
    take_message(buf, max)?
        .ok_or_else(|| ApiError::MalformedRequest("the request ended before its message".into()))
}

/// The first message in `buf` once all of it has arrived.
pub(super) fn take_message(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, ApiError> {
    if buf.len() < PREFIX {
        return Ok(None);
    }
    if buf[0] != 0 {
        return Err(ApiError::MalformedRequest(
            "the request is marked compressed but names no grpc-encoding".into(),
        ));
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > max {
        return Err(ApiError::RequestTooLarge { len, max });
    }
    if buf.len() < PREFIX + len {
        return Ok(None);
    }
    Ok(Some(buf.split_to(PREFIX + len).freeze().split_off(PREFIX)))
}

/// Appends one uncompressed message of about `len_hint` bytes, which
/// `write` puts after its prefix.
pub(super) fn put_message(dst: &mut BytesMut, len_hint: usize, write: impl FnOnce(&mut BytesMut)) {
    let at = dst.len();
    // One allocation for the message rather than growth while writing it.
    dst.reserve(PREFIX + len_hint);
    dst.put_slice(&[0; PREFIX]);
    write(dst);
    let len = (dst.len() - at - PREFIX) as u32;
    dst[at + 1..at + PREFIX].copy_from_slice(&len.to_be_bytes());
}

/// One DATA frame on `stream` carrying one message, `compressed` or not,
/// made of `parts` back to back; as [`put_data_with`].
pub(super) fn put_data_message(
    out: &mut Out,
    stream: u32,
    compressed: bool,
    parts: [&[u8]; 2],
) -> usize {
    let len = parts[0].len() + parts[1].len();
    put_data_with(out, stream, compressed, len, |b| {
        b.put_slice(parts[0]);
        b.put_slice(parts[1]);
    })
}

/// One DATA frame on `stream` carrying one message of `len` bytes, which
/// `write` puts after its prefix; the frame's head and the message's
/// prefix are written in one piece. It must fit the windows; returns the
/// frame's payload length, taken from the connection window.
pub(super) fn put_data_with(
    out: &mut Out,
    stream: u32,
    compressed: bool,
    len: usize,
    write: impl FnOnce(&mut BytesMut),
) -> usize {
    let payload = PREFIX + len;
    out.buf.reserve(HEAD + payload);
    let mut head = [0; HEAD + PREFIX];
    head[..HEAD].copy_from_slice(&frame_head(payload, kind::DATA, 0, stream));
    head[HEAD] = u8::from(compressed);
    head[HEAD + 1..].copy_from_slice(&(len as u32).to_be_bytes());
    out.buf.put_slice(&head);
    let at = out.buf.len();
    write(&mut out.buf);
    debug_assert_eq!(out.buf.len() - at, len, "the message is as long as said");
    out.window.take(payload);
    payload
}

/// Appends one message compressed in the stream's `grpc-encoding`.
pub(super) fn put_compressed(dst: &mut BytesMut, message: &[u8]) {
    dst.reserve(PREFIX + message.len());
    dst.put_u8(1);
    dst.put_u32(message.len() as u32);
    dst.put_slice(message);
}

/// Reads a `grpc-timeout` header: at most 8 digits and a unit.
pub(super) fn grpc_timeout(v: &http::HeaderValue) -> Option<Duration> {
    let v = v.to_str().ok()?;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_protocol_spells_them() {
        let t = |s: &str| grpc_timeout(&http::HeaderValue::from_str(s).unwrap());
        assert_eq!(t("300m"), Some(Duration::from_millis(300)));
        assert_eq!(t("2S"), Some(Duration::from_secs(2)));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "123456789m", "12x", "-1S", "1.5S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn messages_are_taken_whole_once_they_have_arrived() {
        let mut framed = BytesMut::new();
        put_message(&mut framed, 3, |b| b.put_slice(b"abc"));
        put_message(&mut framed, 0, |b| b.put_slice(b"de"));
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 3]);
        let mut buf = BytesMut::new();
        for (i, byte) in framed.iter().enumerate() {
            assert_eq!(take_message(&mut buf, 16).unwrap(), None, "at {i}");
            buf.put_u8(*byte);
            if i == 7 {
                break;
            }
        }
        assert_eq!(
            take_message(&mut buf, 16).unwrap().as_deref(),
            Some(&b"abc"[..])
        );
        buf.extend_from_slice(&framed[8..]);
        assert_eq!(
            take_message(&mut buf, 16).unwrap().as_deref(),
            Some(&b"de"[..])
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_and_compressed_messages_are_refused() {
        let mut big = BytesMut::from(&[0u8, 0, 0, 1, 0][..]);
        assert!(matches!(
            take_message(&mut big, 255),
            Err(ApiError::RequestTooLarge { len: 256, max: 255 })
        ));
        let mut compressed = BytesMut::from(&[1u8, 0, 0, 0, 0][..]);
        assert!(matches!(
            take_message(&mut compressed, 255),
            Err(ApiError::MalformedRequest(_))
        ));
    }

    proptest::proptest! {
        #![proptest_config(crate::fuzzing::config())]
        #[test]
        fn fuzz_grpc_timeouts(v in crate::fuzzing::bytes("grpc_timeout")) {
            if let Ok(v) = http::HeaderValue::from_bytes(&v) {
                let _ = grpc_timeout(&v);
            }
        }

    }
}
