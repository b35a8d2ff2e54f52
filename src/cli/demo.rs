//! `demo-load`: Kubernetes-shaped demo pods written into etcd, for the
//! demo and for trying the service by hand.

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::say;

/// `demo-load`.
#[derive(Args)]
pub struct DemoLoad {
    /// etcd's client URLs (comma-separated).
    #[arg(long, default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// The key prefix the pods are written under.
    #[arg(long, default_value = "/registry/pods")]
    prefix: String,
    /// How many pods.
    #[arg(long, default_value_t = 3000)]
    count: usize,
    /// Over how many nodes (spec.nodeName node-0, node-1, …).
    #[arg(long, default_value_t = 50)]
    nodes: usize,
    /// Over how many namespaces (ns-0, ns-1, …).
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// How the pods are stored: `json`, or `kubernetes` (protobuf in the
    /// storage envelope, as the apiserver stores them; serve them with
    /// `format: kubernetes`).
    #[arg(long, value_enum, default_value = "json")]
    format: DemoFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DemoFormat {
    Json,
    Kubernetes,
}

pub async fn demo_load(args: DemoLoad) -> anyhow::Result<()> {
    let DemoLoad {
        etcd_endpoints: endpoints,
        prefix,
        count,
        nodes,
        namespaces,
        format,
    } = args;
    let (nodes, namespaces) = (nodes.max(1), namespaces.max(1));
    let mut client = etcd_client::Client::connect(&endpoints, None)
        .await
        .context("connecting to etcd")?;
    let apps = ["web", "api", "worker", "cache", "batch"];
    let prefix = prefix.trim_end_matches('/');
    for chunk in (0..count).collect::<Vec<_>>().chunks(100) {
        let ops: Vec<etcd_client::TxnOp> = chunk
            .iter()
            .map(|&i| {
                let (ns, app, node) = (format!("ns-{}", i % namespaces), apps[i % apps.len()], format!("node-{}", i % nodes));
                let name = format!("{app}-{i}");
                let pod = serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns, "uid": format!("{i:08x}-0000-4000-8000-{i:012x}"), "labels": {"app": app, "tier": if i % 3 == 0 { "frontend" } else { "backend" }}},
                    "spec": {"nodeName": node, "containers": [{"name": app, "image": format!("registry.example/{app}:1.{}", i % 7)}]},
                    "status": {"phase": if i % 10 == 0 { "Pending" } else { "Running" }},
                });
                let value = match format {
                    DemoFormat::Json => pod.to_string().into_bytes(),
                    DemoFormat::Kubernetes => watchproxy::object::pod_as_stored(&pod),
                };
                etcd_client::TxnOp::put(format!("{prefix}/{ns}/{name}"), value, None)
            })
            .collect();
        client
            .txn(etcd_client::Txn::new().and_then(ops))
            .await
            .context("writing demo pods")?;
    }
    say(format_args!(
        "wrote {count} pods under {prefix}/ over {nodes} nodes and {namespaces} namespaces"
    ));
    Ok(())
}
