//! The `/metrics` endpoint: OpenMetrics for scrapers that ask for it, the
//! classic Prometheus text format otherwise.

use super::Metrics;

/// Serves `/metrics` until `shutdown`: OpenMetrics to scrapers that ask
/// for it (Prometheus does), the classic Prometheus text format (0.0.4)
/// otherwise, which is what `promtool check metrics` and most tools read.
pub fn spawn_metrics_server(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    use axum::http::header::{ACCEPT, CONTENT_TYPE};
    use axum::http::HeaderMap;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: HeaderMap| {
            let body = metrics.encode();
            let openmetrics = headers
                .get(ACCEPT)
                .and_then(|a| a.to_str().ok())
                .is_some_and(|a| a.contains("application/openmetrics-text"));
            async move {
                if openmetrics {
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        body,
                    )
                } else {
                    (
                        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                        prometheus_text(&body),
                    )
                }
            }
        }),
    );
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned());
        if let Err(e) = served.await {
            tracing::error!(error = %e, "metrics server failed");
        }
    })
}

/// OpenMetrics text as the classic Prometheus text format: counters are
/// described under their `_total` sample name, an info family is a gauge
/// named `_info` (as Prometheus' own clients write build information), and
/// the `# UNIT` and `# EOF` lines, which that format lacks, are dropped.
pub fn prometheus_text(openmetrics: &str) -> String {
    let typed = |kind: &'static str| {
        let suffix = format!(" {kind}");
        openmetrics
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(move |l| l.strip_suffix(suffix.as_str()))
            .collect::<std::collections::HashSet<&str>>()
    };
    let (counters, infos) = (typed("counter"), typed("info"));
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            if counters.contains(name) {
                return Some(format!("{p}{name}_total {tail}"));
            }
            let tail = if *p == "# TYPE " { "gauge" } else { tail };
            infos
                .contains(name)
                .then(|| format!("{p}{name}_info {tail}"))
        });
        out.push_str(described.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_by_their_samples() {
        let om = "# HELP a_b Things.\n# TYPE a_b counter\na_b_total{r=\"x\"} 1\n# HELP g G.\n# TYPE g gauge\n# UNIT g seconds\ng 2\n# EOF\n";
        let text = prometheus_text(om);
        assert_eq!(text, "# HELP a_b_total Things.\n# TYPE a_b_total counter\na_b_total{r=\"x\"} 1\n# HELP g G.\n# TYPE g gauge\ng 2\n");
        let om = "# HELP b Build.\n# TYPE b info\nb_info{v=\"1\"} 1\n# EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP b_info Build.\n# TYPE b_info gauge\nb_info{v=\"1\"} 1\n"
        );
    }
}
