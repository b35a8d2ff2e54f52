//! Cost of reading a change: an etcd key/value into an object (labels and
//! selectable fields read from the JSON, the wire form encoded once).
//!
//! `cargo bench --bench decode`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use watchproxy::object::Resource;

/// A pod as a kubelet-managed workload stores it: many small fields.
const POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-7d4b9c6f5-x2x7q","generateName":"web-7d4b9c6f5-","namespace":"default","uid":"5f0c1a2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b","resourceVersion":"123456","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"app":"web","pod-template-hash":"7d4b9c6f5","tier":"frontend"},"annotations":{"kubernetes.io/config.seen":"2026-01-01T00:00:00Z"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-7d4b9c6f5","uid":"1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d","controller":true,"blockOwnerDeletion":true}]},"spec":{"volumes":[{"name":"kube-api-access","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}],"defaultMode":420}}],"containers":[{"name":"web","image":"registry.example/web:1.2.3","ports":[{"containerPort":8080,"protocol":"TCP"}],"env":[{"name":"MODE","value":"production"},{"name":"POD_IP","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"status.podIP"}}}],"resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},"volumeMounts":[{"name":"kube-api-access","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"readinessProbe":{"httpGet":{"path":"/healthz","port":8080,"scheme":"HTTP"},"periodSeconds":10,"timeoutSeconds":1,"successThreshold":1,"failureThreshold":3},"terminationMessagePath":"/dev/termination-log","imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","nodeName":"node-17","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300},{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0},"status":{"phase":"Running","conditions":[{"type":"Initialized","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"},{"type":"Ready","status":"True","lastTransitionTime":"2026-01-01T00:00:05Z"},{"type":"ContainersReady","status":"True","lastTransitionTime":"2026-01-01T00:00:05Z"},{"type":"PodScheduled","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}],"hostIP":"10.0.0.17","podIP":"10.244.17.23","podIPs":[{"ip":"10.244.17.23"}],"startTime":"2026-01-01T00:00:00Z","containerStatuses":[{"name":"web","state":{"running":{"startedAt":"2026-01-01T00:00:03Z"}},"lastState":{},"ready":true,"restartCount":0,"image":"registry.example/web:1.2.3","imageID":"registry.example/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","containerID":"containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","started":true}],"qosClass":"Burstable"}}"#;

fn pods() -> Resource {
    let fields = ["spec.nodeName", "status.phase"];
    Resource::namespaced_json("pods", "/registry/pods", &fields, &["spec.nodeName"])
}

fn decode(c: &mut Criterion) {
    let r = pods();
    let key = b"/registry/pods/default/web-7d4b9c6f5-x2x7q";
    // The load generator's objects: few fields and one long string.
    let padded = format!(
        r#"{{"kind":"Pod","metadata":{{"name":"pod-1","namespace":"bench","labels":{{"app":"bench"}},"annotations":{{"sent":"1"}}}},"spec":{{"nodeName":"node-1","containers":[{{"name":"c","image":"registry.example/app:1"}}]}},"status":{{"phase":"Running"}},"pad":"{}"}}"#,
        "x".repeat(764)
    );
    let mut g = c.benchmark_group("decode");
    for (name, value) in [("pod", POD), ("padded", padded.as_str())] {
        g.bench_function(format!("{name} ({} bytes)", value.len()), |b| {
            b.iter(|| r.decode(key, black_box(value.as_bytes()), 7).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
