//! What Linux's /proc says of a running process: the CPU and memory the
//! load programs report.

/// A process, by its id.
#[derive(Clone, Copy, Debug)]
pub struct ProcFigures(pub u32);

impl ProcFigures {
    /// This process.
    pub fn own() -> Self {
        Self(std::process::id())
    }

    /// user + system CPU seconds so far (100 ticks a second).
    pub fn cpu_seconds(self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        let after_comm = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) / 100.0
    }

    /// The most memory it has held, in MiB.
    pub fn peak_rss_mib(self) -> f64 {
        self.status_mib("VmHWM:")
    }

    /// The memory it holds now, in MiB.
    pub fn rss_mib(self) -> f64 {
        self.status_mib("VmRSS:")
    }

    fn status_mib(self, field: &str) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

/// A child process, killed and reaped when dropped: a run that fails
/// midway leaves nothing running.
pub struct Spawned(pub std::process::Child);

impl Spawned {
    /// Starts `command` with its output dropped and its log in `log`, at
    /// the `RUST_LOG` level in the environment variable `level` (`warn`
    /// when unset).
    pub fn logged(
        command: &mut std::process::Command,
        level: &str,
        log: &std::path::Path,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let child = command
            .env(
                "RUST_LOG",
                std::env::var(level).unwrap_or_else(|_| "warn".into()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        Ok(Self(child))
    }

    pub fn figures(&self) -> ProcFigures {
        ProcFigures(self.0.id())
    }

    /// Fails if the process has exited, e.g. because its port was taken.
    pub fn check_running(&mut self, what: &str) -> anyhow::Result<()> {
        match self.0.try_wait()? {
            Some(status) => anyhow::bail!("{what} exited with {status}"),
            None => Ok(()),
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_used_cpu_and_holds_memory() {
        let me = ProcFigures::own();
        let spin: u64 = (0..5_000_000u64).fold(0, |a, b| a.wrapping_add(b * b));
        assert!(spin > 0);
        assert!(me.rss_mib() > 0.0 && me.peak_rss_mib() >= me.rss_mib());
        assert!(me.cpu_seconds() >= 0.0);
    }
}
