//! Where the configuration came from, so that it can be read again: the
//! file, and what the command line puts in place of its values.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{Config, ConfigError, ServePath};

#[derive(Debug, Clone, PartialEq)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub overrides: Overrides,
}

/// Values given on the command line, which win over the file's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub etcd_endpoints: Option<Vec<String>>,
    pub serve_path: Option<ServePath>,
}

impl ConfigSource {
    /// The file as it is now, with the overrides, checked whole.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut config = Config::from_file(&self.path)?;
        let o = &self.overrides;
        config.listen = o.listen.unwrap_or(config.listen);
        config.metrics_listen = o.metrics_listen.or(config.metrics_listen);
        if let Some(e) = &o.etcd_endpoints {
            config.etcd.endpoints = e.clone();
        }
        config.watch.serve_path = o.serve_path.unwrap_or(config.watch.serve_path);
        config.validate()?;
        config.source = Some(self.clone());
        Ok(config)
    }
}
