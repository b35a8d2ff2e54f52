//! Header blocks (RFC 7541): a request's read with the connection's HPACK
//! decoder, and responses' written as literals that the peer's table never
//! keeps, so that writing them needs no state.

use std::borrow::Cow;

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, StatusCode};

/// The most a request's header list may hold, counted as RFC 9113 §6.5.2
/// counts it; advertised in SETTINGS.
pub const MAX_HEADER_LIST: usize = 16 * 1024;

/// The most a header block may take, in HEADERS and CONTINUATION frames,
/// before it is decoded: a client past it is sent away (ENHANCE_YOUR_CALM).
pub const MAX_HEADER_BLOCK: usize = 4 * MAX_HEADER_LIST;

/// A request's head, as read from its header block.
pub struct RequestHead {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    /// What `content-length` says the body holds, when it is given.
    pub content_length: Option<u64>,
}

/// Why a request's header block was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The block cannot be decoded: the connection's table is lost.
    Compression,
    /// Decoded, but not a request this server can answer.
    Malformed,
    /// Over [`MAX_HEADER_LIST`].
    TooLarge,
}

/// The fields of a request as they are read, and whether it stayed well
/// formed (RFC 9113 §8.2, §8.3).
#[derive(Default)]
struct Fields {
    method: Option<Method>,
    scheme: bool,
    authority: bool,
    path: Option<String>,
    headers: HeaderMap,
    content_length: Option<u64>,
    /// A regular field was read: pseudo-fields may not follow.
    regular: bool,
    malformed: bool,
    size: usize,
}

/// Decodes a header block into `fields`, one `take` each, within
/// [`MAX_HEADER_LIST`]. Every block is decoded whole, even one that is
/// refused, to keep the connection's table in step with the peer's.
fn decode(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
    fields: &mut Fields,
    take: fn(&mut Fields, &[u8], Cow<'_, [u8]>) -> bool,
) -> Result<(), Refused> {
    decoder
        .decode_with_cb(block, |name, value| {
            fields.size += name.len() + value.len() + 32;
            if fields.size > MAX_HEADER_LIST || fields.malformed {
                return;
            }
            fields.malformed = !take(fields, &name, value);
        })
        .map_err(|_| Refused::Compression)?;
    if fields.size > MAX_HEADER_LIST {
        return Err(Refused::TooLarge);
    }
    Ok(())
}

/// Reads a request's header block.
pub fn read_request(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
) -> Result<RequestHead, Refused> {
    let mut f = Fields::default();
    decode(decoder, block, &mut f, take_request)?;
    match (f.method, f.path) {
        (Some(method), Some(path)) if f.scheme && !f.malformed => Ok(RequestHead {
            method,
            path,
            headers: f.headers,
            content_length: f.content_length,
        }),
        _ => Err(Refused::Malformed),
    }
}

/// Reads the trailers that end a request: regular fields only (RFC 9113
/// §8.1). What they say is not used.
pub fn read_trailers(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
) -> Result<(), Refused> {
    let mut f = Fields {
        regular: true,
        ..Fields::default()
    };
    decode(decoder, block, &mut f, take_request)?;
    match f.malformed {
        true => Err(Refused::Malformed),
        false => Ok(()),
    }
}

/// Takes one field; false when it makes the request malformed.
fn take_request(f: &mut Fields, name: &[u8], value: Cow<'_, [u8]>) -> bool {
    if let Some(pseudo) = name.strip_prefix(b":") {
        // Pseudo-fields come first, once each (RFC 9113 §8.3).
        if f.regular {
            return false;
        }
        return match pseudo {
            b"method" if f.method.is_none() => Method::from_bytes(&value)
                .map(|m| f.method = Some(m))
                .is_ok(),
            b"path" if f.path.is_none() && value.first() == Some(&b'/') => {
                String::from_utf8(value.into_owned())
                    .map(|p| f.path = Some(p))
                    .is_ok()
            }
            b"scheme" if !f.scheme && !value.is_empty() => {
                f.scheme = true;
                true
            }
            b"authority" if !f.authority => {
                f.authority = true;
                true
            }
            _ => false,
        };
    }
    f.regular = true;
    if name.iter().any(u8::is_ascii_uppercase) {
        return false;
    }
    match name {
        // Connection-specific fields have no place in HTTP/2 (§8.2.2).
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
            return false
        }
        b"te" if &value[..] != b"trailers" => return false,
        b"content-length" => {
            let parsed = std::str::from_utf8(&value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match parsed {
                Some(n) if f.content_length.is_none_or(|c| c == n) => f.content_length = Some(n),
                _ => return false,
            }
        }
        _ => {}
    }
    match (
        HeaderName::from_bytes(name),
        HeaderValue::from_bytes(&value),
    ) {
        (Ok(n), Ok(v)) => {
            f.headers.append(n, v);
            true
        }
        _ => false,
    }
}

/// Writes a response's head (`status`, then `headers`) or its trailers
/// (`status` none) as a header block.
pub fn write_fields(status: Option<StatusCode>, headers: &HeaderMap, dst: &mut Vec<u8>) {
    match status {
        // `:status: 200` is entry 8 of the static table.
        Some(StatusCode::OK) => dst.push(0x88),
        Some(s) => {
            // A literal that is not indexed, named by entry 8.
            integer(8, 4, 0x00, dst);
            string(s.as_str().as_bytes(), dst);
        }
        None => {}
    }
    for (name, value) in headers {
        dst.push(0x00);
        string(name.as_str().as_bytes(), dst);
        string(value.as_bytes(), dst);
    }
}

/// A string literal, not Huffman-coded.
fn string(s: &[u8], dst: &mut Vec<u8>) {
    integer(s.len(), 7, 0x00, dst);
    dst.extend_from_slice(s);
}

/// An integer with an `n`-bit prefix (RFC 7541 §5.1), the first byte's
/// other bits set to `pattern`.
fn integer(mut v: usize, n: u32, pattern: u8, dst: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        dst.push(pattern | v as u8);
        return;
    }
    dst.push(pattern | max as u8);
    v -= max;
    while v >= 128 {
        dst.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    dst.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        loona_hpack::Decoder::new().decode(block).unwrap()
    }

    #[test]
    fn responses_read_back_as_written() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        let long = "x".repeat(300);
        headers.insert("grpc-message", HeaderValue::from_str(&long).unwrap());
        let mut block = Vec::new();
        write_fields(Some(StatusCode::OK), &headers, &mut block);
        let fields = decode(&block);
        assert_eq!(fields[0], (b":status".to_vec(), b"200".to_vec()));
        assert_eq!(
            fields[1],
            (b"content-type".to_vec(), b"application/grpc".to_vec())
        );
        assert_eq!(fields[2], (b"grpc-message".to_vec(), long.into_bytes()));
        let mut other = Vec::new();
        write_fields(
            Some(StatusCode::UNSUPPORTED_MEDIA_TYPE),
            &HeaderMap::new(),
            &mut other,
        );
        assert_eq!(decode(&other), [(b":status".to_vec(), b"415".to_vec())]);
    }

    /// A block as a client's encoder writes it: indexed and Huffman-coded
    /// fields, and one it adds to the table (RFC 7541 C.4.1).
    #[test]
    fn a_request_is_read_with_its_fields() {
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
        block.extend([0x04, 0x0a]); // :path, literal indexed by name
        block.extend(b"/a.B/Watch");
        // :authority www.example.com, Huffman-coded, added to the table.
        block.extend([
            0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ]);
        block.push(0x00);
        string(b"te", &mut block);
        string(b"trailers", &mut block);
        let mut decoder = loona_hpack::Decoder::new();
        let head = read_request(&mut decoder, &block).unwrap();
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.path, "/a.B/Watch");
        assert_eq!(head.headers["te"], "trailers");
        // The next block names the authority from the table.
        let again = read_request(&mut decoder, &[0x83, 0x86, 0x84, 0xbe]).unwrap();
        assert_eq!(again.path, "/");
    }

    #[test]
    fn bad_requests_are_refused_and_the_table_kept() {
        let mut decoder = loona_hpack::Decoder::new();
        let mut no_path = vec![0x83];
        no_path.push(0x00);
        string(b"a", &mut no_path);
        string(b"b", &mut no_path);
        assert_eq!(
            read_request(&mut decoder, &no_path).err(),
            Some(Refused::Malformed)
        );
        let mut late_pseudo = vec![0x00];
        string(b"a", &mut late_pseudo);
        string(b"b", &mut late_pseudo);
        late_pseudo.extend([0x83, 0x84]);
        assert_eq!(
            read_request(&mut decoder, &late_pseudo).err(),
            Some(Refused::Malformed)
        );
        let mut upper = vec![0x83, 0x84, 0x00];
        string(b"Te", &mut upper);
        string(b"trailers", &mut upper);
        assert_eq!(
            read_request(&mut decoder, &upper).err(),
            Some(Refused::Malformed)
        );
        let mut big = vec![0x83, 0x84, 0x00];
        string(b"x", &mut big);
        string(&vec![b'a'; MAX_HEADER_LIST], &mut big);
        assert_eq!(
            read_request(&mut decoder, &big).err(),
            Some(Refused::TooLarge)
        );
        assert_eq!(
            read_request(&mut decoder, &[0xff, 0xff, 0xff]).err(),
            Some(Refused::Compression)
        );
    }

    /// A block of `:method POST`, `:scheme http`, `:path /`, then
    /// `fields` as literals.
    fn block_with(pseudo: &[u8], fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = pseudo.to_vec();
        for (n, v) in fields {
            block.push(0x00);
            string(n.as_bytes(), &mut block);
            string(v.as_bytes(), &mut block);
        }
        block
    }

    /// One row per rule of RFC 9113 §8.2 and §8.3.
    #[test]
    fn requests_are_malformed_as_the_rfc_says() {
        const REQUEST: &[u8] = &[0x83, 0x86, 0x84];
        type Row<'a> = (&'a str, &'a [u8], &'a [(&'a str, &'a str)], bool);
        let rows: [Row; 10] = [
            ("a whole request", REQUEST, &[("te", "trailers")], true),
            (
                "8.2.2 te other than trailers",
                REQUEST,
                &[("te", "gzip")],
                false,
            ),
            (
                "8.2.2 connection",
                REQUEST,
                &[("connection", "close")],
                false,
            ),
            (
                "8.2.2 transfer-encoding",
                REQUEST,
                &[("transfer-encoding", "chunked")],
                false,
            ),
            ("8.3.1 :scheme missing", &[0x83, 0x84], &[], false),
            ("8.3.1 :scheme twice", &[0x83, 0x86, 0x86, 0x84], &[], false),
            ("8.3.1 :method twice", &[0x83, 0x83, 0x86, 0x84], &[], false),
            (
                "8.3 an unknown pseudo-field",
                REQUEST,
                &[(":protocol", "x")],
                false,
            ),
            (
                "8.1.1 content-length not a number",
                REQUEST,
                &[("content-length", "1x")],
                false,
            ),
            (
                "8.1.1 content-length twice, differing",
                REQUEST,
                &[("content-length", "1"), ("content-length", "2")],
                false,
            ),
        ];
        for (rule, pseudo, fields, ok) in rows {
            let mut decoder = loona_hpack::Decoder::new();
            let read = read_request(&mut decoder, &block_with(pseudo, fields));
            assert_eq!(read.is_ok(), ok, "{rule}");
        }
        let mut decoder = loona_hpack::Decoder::new();
        let head = read_request(
            &mut decoder,
            &block_with(REQUEST, &[("content-length", "12")]),
        );
        assert_eq!(head.unwrap().content_length, Some(12));
        assert_eq!(
            read_trailers(&mut decoder, &block_with(&[0x83], &[])),
            Err(Refused::Malformed),
            "8.1 a pseudo-field in trailers"
        );
        assert_eq!(
            read_trailers(&mut decoder, &block_with(&[], &[("x", "y")])),
            Ok(())
        );
    }

    #[test]
    fn integers_take_more_bytes_past_their_prefix() {
        let mut v = Vec::new();
        integer(10, 5, 0, &mut v);
        assert_eq!(v, [10]);
        v.clear();
        integer(1337, 5, 0, &mut v);
        assert_eq!(v, [31, 154, 10]);
    }
}
