#!/usr/bin/env node
// An informer of @kubernetes/client-node (makeInformer: list, then watch
// from the list's resourceVersion, list again on 410), pointed at
// watchproxy's Kubernetes API by a kubeconfig. Nothing in it knows
// watchproxy: it is the library's informer as its README shows it, which
// the program starts again after an error, as the README's example does.
//
//     npm ci --prefix examples/kubernetes
//     watchproxy kubeconfig --config config.yaml > kubeconfig
//     node examples/kubernetes/informer.mjs kubeconfig pods --selector app=web
//
// It logs one JSON object per line on stderr; with --until NAME it prints
// its copy as JSON ({"objects": {"ns/name": resourceVersion}, "lists": n})
// and exits once an object of that name is seen.
import * as k8s from '@kubernetes/client-node';

function log(fields) {
  process.stderr.write(JSON.stringify(fields) + '\n');
}

const argv = process.argv.slice(2);
const [kubeconfig, resource] = argv;
const option = (name) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : undefined;
};
const selector = option('--selector') || undefined;
const until = option('--until');
if (resource !== 'pods') {
  log({ event: 'only pods are informed of here' });
  process.exit(2);
}

const kc = new k8s.KubeConfig();
kc.loadFromFile(kubeconfig);
const api = kc.makeApiClient(k8s.CoreV1Api);
let lists = 0;
const list = async () => {
  const listed = await api.listPodForAllNamespaces({ labelSelector: selector });
  lists += 1;
  log({ event: 'listed', objects: listed.items.length, resource_version: listed.metadata.resourceVersion });
  return listed;
};
const informer = k8s.makeInformer(kc, '/api/v1/pods', list, selector);
const key = (pod) => `${pod.metadata.namespace}/${pod.metadata.name}`;
const done = (pod) => {
  if (until && pod.metadata.name === until) {
    const objects = {};
    for (const p of informer.list()) objects[key(p)] = p.metadata.resourceVersion;
    process.stdout.write(JSON.stringify({ objects, lists }) + '\n');
    process.exit(0);
  }
};
informer.on(k8s.ADD, (pod) => { log({ event: 'added', name: key(pod), resource_version: pod.metadata.resourceVersion }); done(pod); });
informer.on(k8s.UPDATE, (pod) => { log({ event: 'modified', name: key(pod), resource_version: pod.metadata.resourceVersion }); done(pod); });
informer.on(k8s.DELETE, (pod) => log({ event: 'deleted', name: key(pod) }));
informer.on(k8s.ERROR, (err) => {
  const status = err && (err.code || err.statusCode || (err.body && err.body.code));
  log({ event: 'error', status, message: String(err && err.message) });
  setTimeout(() => informer.start().catch((e) => log({ event: 'start failed', message: String(e) })), 200);
});
setTimeout(() => { log({ event: 'gave up after two minutes' }); process.exit(1); }, 120000).unref();
informer.start().catch((e) => {
  log({ event: 'error', message: String(e) });
  setTimeout(() => informer.start(), 200);
});
