//! Compressed watch messages on the service's own HTTP/2 path: the codec a
//! client accepts, and each message's compressed form, made once for every
//! stream that sends it (see [`super::wire::Packed`]).

use std::cell::RefCell;
use std::io::Write;

use bytes::Bytes;

pub use crate::config::Codec;

/// Messages shorter than this go uncompressed: their header would eat the
/// gain. gRPC lets each message say whether it is compressed.
const MIN_BYTES: usize = 128;

/// zstd's level: its fastest that still finds a Kubernetes object's
/// repeated keys.
const ZSTD_LEVEL: i32 = 1;

thread_local! {
    /// A zstd context per thread, kept: making one per message cost more
    /// than the compression (26 µs for a 330-byte pod).
    static ZSTD: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::Zstd => "zstd",
            Codec::Gzip => "gzip",
        }
    }

    pub fn slot(self) -> usize {
        self as usize
    }

    /// The first of `offered` (the service's order of preference) that a
    /// `grpc-accept-encoding` header names.
    pub fn negotiate(accept: Option<&http::HeaderValue>, offered: &[Codec]) -> Option<Codec> {
        let accept = accept?.to_str().ok()?;
        let accepted: Vec<&str> = accept.split(',').map(str::trim).collect();
        offered
            .iter()
            .copied()
            .find(|c| accepted.contains(&c.name()))
    }

    /// The codec a `grpc-encoding` value names.
    pub fn named(name: &[u8]) -> Option<Codec> {
        [Codec::Zstd, Codec::Gzip]
            .into_iter()
            .find(|c| c.name().as_bytes() == name)
    }

    /// `packed` decompressed, read no further than `max` bytes: `None`
    /// once it would pass them, so a small message cannot inflate to
    /// gigabytes before it is refused.
    pub fn decompress(self, packed: &[u8], max: usize) -> std::io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        let mut message = Vec::new();
        let limit = max as u64 + 1;
        match self {
            Codec::Gzip => flate2::read::GzDecoder::new(packed)
                .take(limit)
                .read_to_end(&mut message)?,
            Codec::Zstd => zstd::stream::read::Decoder::new(packed)?
                .take(limit)
                .read_to_end(&mut message)?,
        };
        Ok((message.len() <= max).then_some(message))
    }

    /// `message` compressed; none when that would not make it smaller.
    pub fn compress(self, message: &[u8]) -> Option<Bytes> {
        if message.len() < MIN_BYTES {
            return None;
        }
        let out = match self {
            Codec::Zstd => ZSTD.with(|z| {
                let mut z = z.borrow_mut();
                let z = match &mut *z {
                    Some(z) => z,
                    None => z.insert(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?),
                };
                z.compress(message).ok()
            })?,
            Codec::Gzip => {
                let mut e = flate2::write::GzEncoder::new(
                    Vec::with_capacity(message.len() / 2),
                    flate2::Compression::fast(),
                );
                e.write_all(message).ok()?;
                e.finish().ok()?
            }
        };
        (out.len() < message.len()).then(|| Bytes::from(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_service_picks_its_first_choice_the_client_accepts() {
        let h = |s: &'static str| http::HeaderValue::from_static(s);
        let both = [Codec::Zstd, Codec::Gzip];
        assert_eq!(
            Codec::negotiate(Some(&h("gzip, zstd")), &both),
            Some(Codec::Zstd)
        );
        assert_eq!(
            Codec::negotiate(Some(&h("identity,gzip")), &both),
            Some(Codec::Gzip)
        );
        assert_eq!(Codec::negotiate(Some(&h("deflate")), &both), None);
        assert_eq!(Codec::negotiate(None, &both), None);
        assert_eq!(Codec::negotiate(Some(&h("gzip")), &[]), None);
    }

    #[test]
    fn compressed_messages_decompress_to_themselves() {
        let message = br#"{"metadata":{"name":"web-1","namespace":"ns-1","labels":{"app":"web"}},"spec":{"nodeName":"node-7","containers":[{"name":"web","image":"registry.example/web:1"}]}}"#.repeat(3);
        let z = Codec::Zstd.compress(&message).unwrap();
        assert_eq!(zstd::bulk::decompress(&z, 1 << 20).unwrap(), message);
        let g = Codec::Gzip.compress(&message).unwrap();
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&g[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, message);
        assert_eq!(Codec::Zstd.compress(b"short"), None);
    }
}
