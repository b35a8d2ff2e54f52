//! What a run reports: one target's figures, its line of the table, and
//! the median of several rounds.

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub target: String,
    pub writes: u64,
    pub write_seconds: f64,
    /// The write rate reached (an overloaded etcd slows the writer down).
    pub writes_per_s: f64,
    pub deliveries_per_s: f64,
    pub useful_per_s: f64,
    /// Bytes of a watch event, on average (watchproxy targets).
    pub bytes_per_delivery: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_max: f64,
    pub missed: u64,
    /// Watches that ended before the run stopped them, by why.
    pub ended_early: std::collections::BTreeMap<String, u64>,
    pub server_cpu_s: f64,
    pub etcd_cpu_s: f64,
    pub front_cpu_s: f64,
    /// This process's own CPU over the writes: the clients' share of the
    /// cores the targets run on.
    pub loadgen_cpu_s: f64,
    pub etcd_peak_rss_mib: f64,
    pub front_peak_rss_mib: f64,
    /// With every watcher still open, after the drain: what the watchers
    /// hold, without the peak of opening them all at once.
    pub front_rss_end_mib: f64,
    /// The watches etcd held (`etcd_debugging_mvcc_watcher_total`), once
    /// every watcher was open.
    pub etcd_watches: f64,
}

/// One target's line of the table.
pub fn row(r: &Report) -> String {
    format!("{:<19} {:>8.0} {:>12.0} {:>11.0} {:>8.0} {:>9.2} {:>9.2} {:>9.1} {:>8} {:>10.2} {:>9.2} {:>9.2} {:>10.0} {:>10.0} {:>13.0}", r.target, r.writes_per_s, r.deliveries_per_s, r.useful_per_s, r.bytes_per_delivery, r.latency_ms_p50, r.latency_ms_p99, r.latency_ms_max, r.missed, r.server_cpu_s, r.etcd_cpu_s, r.front_cpu_s, r.etcd_peak_rss_mib, r.front_peak_rss_mib, r.front_rss_end_mib)
}

/// One target's rounds as one report: the median of each rate, latency
/// and CPU figure, each taken on its own (so the CPU parts need not add up
/// to the median total); the worst round's missed events and memory; every
/// round's early ends.
pub fn median(rounds: &[Report]) -> Report {
    let mid = |f: fn(&Report) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let worst = |f: fn(&Report) -> f64| rounds.iter().map(f).fold(0.0, f64::max);
    let mut ended_early = std::collections::BTreeMap::new();
    for r in rounds {
        for (why, n) in &r.ended_early {
            *ended_early.entry(why.clone()).or_insert(0) += n;
        }
    }
    Report {
        target: rounds[0].target.clone(),
        writes: rounds[0].writes,
        write_seconds: mid(|r| r.write_seconds),
        writes_per_s: mid(|r| r.writes_per_s),
        deliveries_per_s: mid(|r| r.deliveries_per_s),
        useful_per_s: mid(|r| r.useful_per_s),
        bytes_per_delivery: mid(|r| r.bytes_per_delivery),
        latency_ms_p50: mid(|r| r.latency_ms_p50),
        latency_ms_p99: mid(|r| r.latency_ms_p99),
        latency_ms_max: mid(|r| r.latency_ms_max),
        missed: rounds.iter().map(|r| r.missed).max().unwrap_or(0),
        ended_early,
        server_cpu_s: mid(|r| r.server_cpu_s),
        etcd_cpu_s: mid(|r| r.etcd_cpu_s),
        front_cpu_s: mid(|r| r.front_cpu_s),
        loadgen_cpu_s: mid(|r| r.loadgen_cpu_s),
        etcd_peak_rss_mib: worst(|r| r.etcd_peak_rss_mib),
        front_peak_rss_mib: worst(|r| r.front_peak_rss_mib),
        front_rss_end_mib: worst(|r| r.front_rss_end_mib),
        etcd_watches: worst(|r| r.etcd_watches),
    }
}
