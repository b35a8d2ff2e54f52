//! What a request accepts (`Accept`) and the responses written to it:
//! JSON documents, lists and statuses with the apiserver's headers.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

use crate::api::error::KubeStatus;

/// A response body: whole, or a watch's lines as they come.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

pub const JSON: &str = "application/json";
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// How objects are shown, as the request's `Accept` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Whole objects, in JSON.
    Objects,
    /// `as=PartialObjectMetadata` (`…List`): only each object's metadata.
    Metadata,
}

/// The shape of the first media range of `accept` this service writes;
/// none when it writes none (protobuf alone, `as=Table` alone). A missing
/// header or `*/*` takes whole objects.
pub fn negotiate(accept: Option<&str>) -> Option<Shape> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(Shape::Objects);
    };
    accept.split(',').find_map(|range| {
        let mut params = range.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        if !matches!(media.as_str(), JSON | "application/*" | "*/*") {
            return None;
        }
        let shown_as = params
            .find_map(|p| p.strip_prefix("as="))
            .unwrap_or_default();
        match shown_as {
            "" => Some(Shape::Objects),
            "PartialObjectMetadata" | "PartialObjectMetadataList" => Some(Shape::Metadata),
            _ => None,
        }
    })
}

pub fn whole(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

/// A JSON document with 200 OK.
pub fn json(bytes: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(whole(bytes));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
    response
}

/// A failure as the apiserver writes it: the Status with its code, and
/// `Retry-After` when the client should wait.
pub fn status(status: &KubeStatus) -> Response<Body> {
    let mut response = json(status.to_json());
    *response.status_mut() =
        StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(seconds) = status.retry_after_seconds() {
        response.headers_mut().insert(RETRY_AFTER, seconds.into());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_range_it_writes_decides() {
        assert_eq!(negotiate(None), Some(Shape::Objects));
        assert_eq!(negotiate(Some("*/*")), Some(Shape::Objects));
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            )),
            Some(Shape::Objects),
            "kubectl's ask: a table, else a list"
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
            )),
            Some(Shape::Metadata)
        );
        assert_eq!(
            negotiate(Some(
                "application/vnd.kubernetes.protobuf, application/json"
            )),
            Some(Shape::Objects)
        );
        assert_eq!(negotiate(Some(PROTOBUF)), None);
        assert_eq!(
            negotiate(Some("application/json;as=Table;v=v1;g=meta.k8s.io")),
            None
        );
    }
}
