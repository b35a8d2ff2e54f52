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

use tracing_subscriber::filter::Targets;
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
    let (targets, filter) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
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
        .with(targets)
        .with(filter)
        .with(fmt)
        .with(traces)
        .try_init();
    Ok(TracingGuard(provider))
}

/// What a `RUST_LOG` spec (default `info`; one that does not parse is
/// `info`) lets through: targets and levels alone are a static filter,
/// checked once per call site; `EnvFilter`, needed only for span and field
/// directives, also takes a lock shared by every thread whenever a span is
/// entered or left, as each connection's task does at every poll.
fn log_filter(spec: Option<&str>) -> (Option<Targets>, Option<EnvFilter>) {
    let spec = spec.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    if !spec.contains(['[', '{']) {
        if let Ok(targets) = spec.parse::<Targets>() {
            return (Some(targets), None);
        }
    }
    let filter = EnvFilter::try_new(spec).unwrap_or_else(|_| EnvFilter::new("info"));
    (None, Some(filter))
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

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::level_filters::LevelFilter;

    #[test]
    fn targets_and_levels_are_a_static_filter_and_span_directives_keep_env_filter() {
        let level = |(targets, filter): (Option<Targets>, Option<EnvFilter>)| {
            assert!(targets.is_some() != filter.is_some(), "one filter");
            targets.map(|t| t.default_level())
        };
        assert_eq!(level(log_filter(None)), Some(Some(LevelFilter::INFO)));
        assert_eq!(level(log_filter(Some(" "))), Some(Some(LevelFilter::INFO)));
        assert_eq!(
            level(log_filter(Some("warn,watchproxy=debug"))),
            Some(Some(LevelFilter::WARN))
        );
        assert_eq!(level(log_filter(Some("[connection]=debug"))), None);
        assert_eq!(level(log_filter(Some("h2[{stream}]=trace"))), None);
        let (_, filter) = log_filter(Some("watchproxy=bogus=1"));
        assert_eq!(
            filter.unwrap().to_string(),
            "info",
            "what does not parse is info"
        );
    }
}
