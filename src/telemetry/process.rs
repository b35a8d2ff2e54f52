//! The standard `process_*` metrics (CPU, resident and virtual memory,
//! file descriptors, threads, start time), read from /proc at each scrape:
//! what operators compare with `max_bytes` and the container's limits.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

#[derive(Debug, Default)]
pub struct ProcessCollector;

#[cfg(target_os = "linux")]
impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        use procfs::process::{LimitValue, Process};
        use procfs::WithCurrentSystemInfo;

        let me = match Process::myself() {
            Ok(me) => me,
            Err(error) => {
                tracing::warn!(%error, "reading the process' own /proc entry");
                return Ok(());
            }
        };
        let stat = match me.stat() {
            Ok(stat) => stat,
            Err(error) => {
                tracing::warn!(%error, "reading /proc/self/stat");
                return Ok(());
            }
        };
        let ticks = procfs::ticks_per_second() as f64;
        let mut counter = |name, help, unit: Option<&Unit>, value: f64| {
            let e = encoder.encode_descriptor(name, help, unit, MetricType::Counter)?;
            ConstCounter::new(value).encode(e)
        };
        counter(
            "cpu",
            "Total user and system CPU time spent in seconds",
            Some(&Unit::Seconds),
            (stat.utime + stat.stime) as f64 / ticks,
        )?;
        let mut gauges: Vec<(&str, &str, Option<Unit>, f64)> = vec![
            (
                "resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                stat.rss_bytes().get() as f64,
            ),
            (
                "virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                stat.vsize as f64,
            ),
            (
                "threads",
                "Number of OS threads in the process",
                None,
                stat.num_threads as f64,
            ),
        ];
        if let Ok(boot) = procfs::boot_time_secs() {
            gauges.push((
                "start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(Unit::Seconds),
                boot as f64 + stat.starttime as f64 / ticks,
            ));
        }
        if let Ok(fds) = me.fd_count() {
            gauges.push((
                "open_fds",
                "Number of open file descriptors",
                None,
                fds as f64,
            ));
        }
        if let Ok(limits) = me.limits() {
            if let LimitValue::Value(max) = limits.max_open_files.soft_limit {
                gauges.push((
                    "max_fds",
                    "Maximum number of open file descriptors",
                    None,
                    max as f64,
                ));
            }
        }
        for (name, help, unit, value) in gauges {
            let e = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
            ConstGauge::new(value).encode(e)?;
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
impl Collector for ProcessCollector {
    fn encode(&self, _encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        Ok(())
    }
}
