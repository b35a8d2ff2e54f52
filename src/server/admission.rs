//! What a call must pass before its handler runs, on both serve paths: a
//! caller identified from its headers alone (an unidentified one is
//! refused before a byte of its body is read), a request body that arrives
//! whole in time and within its own limit, compressed or not, and, for
//! List and Get, a slot taken only once the request is whole. Nothing a
//! client sends before then costs more than `limits.max_request_bytes` a
//! stream. A call whose client streams (etcd's Watch) is only identified:
//! its handler reads its messages one at a time, each within the limit.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tonic::body::Body;
use tonic::Status;
use tower::{Service, ServiceExt};

use super::routes::Routes;
use crate::api::compression::Codec;
use crate::api::error::ApiError;
use crate::api::Api;

/// A request's gRPC message prefix: a compressed flag and a length.
const PREFIX: usize = 5;

/// The bounds a call's request is held to.
#[derive(Clone)]
pub struct Bounds {
    /// The largest request message, decompressed.
    pub max_request_bytes: usize,
    /// How long a request's body may take to arrive whole.
    pub body_timeout: Duration,
}

/// Admits calls to `inner`; with `slots`, each holds one from the moment
/// its request is whole until its answer is ready.
#[derive(Clone)]
pub struct Admission<S> {
    inner: S,
    /// Who identifies the callers; None for calls that name no caller in
    /// their headers (etcd's Authenticate names it in its body, a health
    /// check none).
    identify: Option<Api>,
    /// None for a call whose client streams: its messages are read by its
    /// handler, one at a time, each within the message limit.
    bounds: Option<Bounds>,
    slots: Option<Arc<Semaphore>>,
}

impl<S> Admission<S> {
    pub fn new(inner: S, api: Api, bounds: Bounds, slots: Option<Arc<Semaphore>>) -> Self {
        Self {
            inner,
            identify: Some(api),
            bounds: Some(bounds),
            slots,
        }
    }

    /// Admits calls whose headers name no caller: bounded as every call,
    /// identified by their handler if at all.
    pub fn unidentified(inner: S, bounds: Bounds, slots: Option<Arc<Semaphore>>) -> Self {
        Self {
            inner,
            identify: None,
            bounds: Some(bounds),
            slots,
        }
    }

    /// Admits calls whose client streams messages for as long as the call
    /// lasts: identified before a byte of the body is read, which is then
    /// handed on as it comes.
    pub fn streaming(inner: S, api: Api) -> Self {
        Self {
            inner,
            identify: Some(api),
            bounds: None,
            slots: None,
        }
    }
}

impl<S: Routes> Service<http::Request<Body>> for Admission<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let (inner, identify) = (self.inner.clone(), self.identify.clone());
        let (bounds, slots) = (self.bounds.clone(), self.slots.clone());
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            if let Some(api) = identify {
                let caller = match api.identify(&parts.headers, &parts.extensions) {
                    Ok(caller) => caller,
                    Err(e) => return Ok(Status::from(e).into_http()),
                };
                // The connection's span, on the service's own server.
                tracing::Span::current().record("identity", caller.identity.caller.user.as_str());
                parts.extensions.insert(caller);
            }
            let Some(bounds) = bounds else {
                let req = http::Request::from_parts(parts, body);
                return inner.oneshot(req).await;
            };
            let admitted = async {
                let encoding = parts.headers.get("grpc-encoding").cloned();
                let inflating = encoding.as_ref().and_then(|e| Codec::named(e.as_bytes()));
                if inflating.is_some() {
                    // Handed on inflated.
                    parts.headers.remove("grpc-encoding");
                }
                let read = read_body(body, inflating, bounds.max_request_bytes);
                let body = tokio::time::timeout(bounds.body_timeout, read)
                    .await
                    .map_err(|_| ApiError::RequestTooSlow {
                        after: bounds.body_timeout,
                    })??;
                let slot =
                    match &slots {
                        None => None,
                        Some(s) => Some(s.clone().try_acquire_owned().map_err(|_| {
                            ApiError::Overloaded {
                                reason: "no slot left".into(),
                            }
                        })?),
                    };
                Ok::<_, ApiError>((body, slot))
            };
            let (body, slot) = match admitted.await {
                Ok(admitted) => admitted,
                Err(e) => return Ok(Status::from(e).into_http()),
            };
            let req = http::Request::from_parts(parts, Body::new(http_body_util::Full::new(body)));
            let answer = inner.oneshot(req).await;
            drop(slot);
            answer
        })
    }
}

/// Reads a request's body whole, at most `max` bytes of message plus its
/// prefix. A message compressed in `inflating` is handed on inflated, and
/// refused as soon as it would pass `max`, rather than inflated whole and
/// decoded.
async fn read_body(
    mut body: Body,
    inflating: Option<Codec>,
    max: usize,
) -> Result<Bytes, ApiError> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::RequestAborted(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        check_partial(&buf, max)?;
    }
    let Some(inflating) = inflating.filter(|_| buf.len() >= PREFIX && buf[0] != 0) else {
        // Nothing, or a plain message: the codec reads it as it is.
        return Ok(buf.freeze());
    };
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    let packed = buf
        .get(PREFIX..PREFIX + len)
        .ok_or_else(|| ApiError::MalformedRequest("the request ended before its message".into()))?;
    let message = inflating
        .decompress(packed, max)
        .map_err(|e| ApiError::MalformedRequest(format!("decompressing the request: {e}")))?
        .ok_or(ApiError::RequestTooLarge { len: max + 1, max })?;
    let mut out = BytesMut::with_capacity(PREFIX + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(&message);
    Ok(out.freeze())
}

/// What a request's body holds so far, checked against the bound as it
/// arrives: a message declared larger than `max`, or bytes past one
/// message, are refused before the rest is read. The service's own server
/// checks a Watch's request with it as its DATA frames arrive.
pub(crate) fn check_partial(buf: &[u8], max: usize) -> Result<(), ApiError> {
    if buf.len() >= PREFIX {
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > max {
            return Err(ApiError::RequestTooLarge { len, max });
        }
    }
    if buf.len() > PREFIX + max {
        return Err(ApiError::MalformedRequest(
            "the request holds more than one message".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(b).unwrap();
        gz.finish().unwrap()
    }

    #[tokio::test]
    async fn a_message_is_inflated_within_its_bound_and_refused_past_it() {
        let packed = gzip(&[7; 1000]);
        let inflated = Codec::Gzip.decompress(&packed, 1000).unwrap();
        assert_eq!(inflated.unwrap(), [7; 1000]);
        let mut framed = vec![1];
        framed.extend_from_slice(&(packed.len() as u32).to_be_bytes());
        framed.extend_from_slice(&packed);
        let body = Body::new(http_body_util::Full::new(Bytes::from(framed)));
        let refused = read_body(body, Some(Codec::Gzip), 999).await.unwrap_err();
        assert!(matches!(
            refused,
            ApiError::RequestTooLarge { max: 999, .. }
        ));
        let zstd = zstd::encode_all(&[1u8; 64][..], 1).unwrap();
        assert_eq!(Codec::Zstd.decompress(&zstd, 64).unwrap().unwrap(), [1; 64]);
        assert!(Codec::named(b"br").is_none());
    }

    #[tokio::test]
    async fn a_body_is_refused_once_its_prefix_names_more_than_the_bound() {
        let mut framed = vec![0, 0, 1, 0, 0];
        framed.extend([0; 16]);
        let body = Body::new(http_body_util::Full::new(Bytes::from(framed)));
        let refused = read_body(body, None, 1000).await.unwrap_err();
        assert!(matches!(
            refused,
            ApiError::RequestTooLarge { len: 65536, .. }
        ));
    }
}
