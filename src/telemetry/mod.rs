//! Logs and OTLP traces here; Prometheus metrics in `metrics.rs` (the
//! HTTP/2 server's in `http2.rs`), served by `exposition.rs`.

mod delivery;
mod exposition;
mod http2;
mod labels;
mod metrics;
mod process;
mod resource;
mod security;

use tracing_subscriber::EnvFilter;

pub use delivery::{DeliveryLatency, ServePathLabel, WatchApi, WriteClock};
pub use exposition::{prometheus_text, spawn_metrics_server};
pub use http2::{Bound, Direction, Http2Metrics};
pub use metrics::{EndReason, EtcdRequest, Metrics, ReflectorState, TlsOutcome};
pub use resource::ResourceMetrics;
pub use security::{CredentialFile, ReloadResult, SecurityMetrics};

/// Installs the global tracing subscriber; `RUST_LOG` filters (default
/// `info`), and `json` selects one JSON object per line.
pub fn init_logging(json: bool) {
    let _ = init(json);
}

/// Flushes traces still buffered when dropped.
pub struct TracingGuard(Option<opentelemetry_sdk::trace::SdkTracerProvider>);

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("flushing traces: {e}");
            }
        }
    }
}

/// Logs as [`init_logging`], and, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, exports spans over
/// OTLP/gRPC, configured by the standard `OTEL_*` variables
/// (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`, ...).
/// Incoming W3C `traceparent` metadata is continued either way.
pub fn init(json: bool) -> anyhow::Result<TracingGuard> {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: a file or a log collector would keep
    // the escape codes.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = if json {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let otlp = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|e| !e.is_empty()));
    let provider = if otlp {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("watchproxy")
            .build();
        Some(
            opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build(),
        )
    } else {
        None
    };
    let traces = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("watchproxy")));
    // A second initialisation (tests start several servers) keeps the first.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(traces)
        .try_init();
    Ok(TracingGuard(provider))
}

/// Reads W3C trace context from gRPC metadata.
struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl opentelemetry::propagation::Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Makes `span` a child of the trace the caller sent, if any.
pub fn continue_trace(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(metadata)));
    let _ = span.set_parent(parent);
}
