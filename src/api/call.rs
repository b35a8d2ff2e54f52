//! One call as the service records it: a span that continues the caller's
//! trace, and its duration and status code by resource and method; and
//! the gRPC settings every face's methods share.

use tokio::time::Instant;
use tonic::codec::{self, CompressionEncoding, EnabledCompressionEncodings};
use tonic::metadata::MetadataMap;
use tonic::server::Grpc;
use tonic::{Response, Status};
use tracing::Instrument;

use super::compression::Codec;
use super::error::ApiError;
use super::Api;

/// What a call is about, for its span and its metrics.
pub struct CallInfo<'a> {
    pub method: &'static str,
    pub resource: &'a str,
    pub label_selector: &'a str,
    pub field_selector: &'a str,
}

impl Api {
    /// [`Api::answer_with`], a failure becoming the status every call gets.
    pub(super) async fn answer<T>(
        &self,
        metadata: &MetadataMap,
        info: CallInfo<'_>,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<Response<T>, Status> {
        (self.answer_with(metadata, info, call, Status::from).await).map(Response::new)
    }

    /// Answers a call in its span, timed and recorded by resource, method
    /// and the gRPC code of its outcome; its error becomes the face's own
    /// (`to_error`) here.
    pub async fn answer_with<T, E>(
        &self,
        metadata: &MetadataMap,
        info: CallInfo<'_>,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
        to_error: impl FnOnce(ApiError) -> E,
    ) -> Result<T, E> {
        let span = tracing::info_span!(
            "call",
            otel.name = info.method,
            rpc.method = info.method,
            resource = %info.resource,
            label_selector = %info.label_selector,
            field_selector = %info.field_selector,
            code = tracing::field::Empty,
        );
        crate::telemetry::continue_trace(&span, metadata);
        let started = Instant::now();
        let answer = call.instrument(span.clone()).await;
        let code = answer
            .as_ref()
            .map_or_else(ApiError::code, |_| tonic::Code::Ok);
        let resource = if self.resources.contains_key(info.resource) {
            info.resource
        } else {
            "unknown"
        };
        self.metrics
            .call(resource, info.method, code, started.elapsed().as_secs_f64());
        span.record("code", format!("{code:?}"));
        answer.map_err(to_error)
    }
}

/// The codecs List and Get answers may be compressed in.
pub const ALL: [Codec; 2] = [Codec::Zstd, Codec::Gzip];

/// gRPC settings shared by every route: requests may come compressed
/// (admission has inflated gzip and zstd within its bound); answers are
/// compressed in one of `send` when the client asks for it.
pub fn grpc<C: codec::Codec>(codec: C, max: usize, max_request: usize, send: &[Codec]) -> Grpc<C> {
    let mut accepted = EnabledCompressionEncodings::default();
    accepted.enable(CompressionEncoding::Gzip);
    accepted.enable(CompressionEncoding::Zstd);
    let mut enabled = EnabledCompressionEncodings::default();
    for c in send {
        enabled.enable(match c {
            Codec::Zstd => CompressionEncoding::Zstd,
            Codec::Gzip => CompressionEncoding::Gzip,
        });
    }
    let send = enabled;
    Grpc::new(codec)
        .apply_compression_config(accepted, send)
        .apply_max_message_size_config(Some(max_request), Some(max))
}
