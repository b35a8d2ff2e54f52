//! Kubernetes' read API served from the caches: discovery, GET, LIST and
//! WATCH at the apiserver's paths, against a real etcd, as Kubernetes'
//! clients read them (over HTTP/1.1 and HTTP/2) and compared with what
//! etcd holds.

#[path = "../common/mod.rs"]
mod common;

mod clients;
mod http;
mod identity;
mod reads;
mod watches;

use std::net::SocketAddr;
use std::time::Duration;

use common::{pods_yaml, Etcd, Proxy};
use watchproxy::config::Config;

/// The pods configuration with Kubernetes' API on, and `more` YAML after.
pub fn kubernetes_config(etcd: &Etcd, more: &str) -> Config {
    let yaml = pods_yaml(&etcd.client_url, 64)
        + "kubernetes_api: {enabled: true, listen: 127.0.0.1:0}\n"
        + more;
    Config::from_yaml(&yaml).unwrap()
}

/// A watchproxy serving Kubernetes' API whose pods cache is ready, and
/// that API's address.
pub async fn kubernetes_proxy(config: Config) -> (Proxy, SocketAddr) {
    kubernetes_proxy_as(config, &[]).await
}

/// [`kubernetes_proxy`], ready for a caller who sends `headers`.
pub async fn kubernetes_proxy_as(config: Config, headers: &[(&str, &str)]) -> (Proxy, SocketAddr) {
    let proxy = Proxy::start_config(config).await;
    let addr = proxy.kubernetes_addr.expect("kubernetes_api is enabled");
    for _ in 0..100 {
        let (status, _) = http::get(addr, "/api/v1/pods", headers).await;
        if status == 200 {
            return (proxy, addr);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Kubernetes' API did not list pods within 10 s");
}
