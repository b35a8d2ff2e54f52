#!/usr/bin/env python3
"""An informer on the official Python `kubernetes` client, pointed at
watchproxy's Kubernetes API through a kubeconfig: it lists pods in pages,
watches from the list's resourceVersion with bookmarks, resumes from the
last version it saw when a watch breaks, and lists again on 410 Gone.
Nothing in it knows watchproxy; it is what an informer does against an
apiserver.

    pip install kubernetes
    watchproxy kubeconfig --config config.yaml > kubeconfig
    python3 examples/kubernetes/informer.py kubeconfig pods --selector app=web

Log lines go to stderr as JSON. With --until NAME it prints its copy as
JSON ({"objects": {"ns/name": resourceVersion}, "lists": n, "resumes": n})
and exits once an object of that name appears.
"""

import argparse
import json
import sys
import time

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def log(event, **fields):
    print(json.dumps({"event": event, **fields}), file=sys.stderr, flush=True)


class Informer:
    def __init__(self, api, selector, page):
        self.api, self.selector, self.page = api, selector, page
        self.objects, self.version = {}, None
        self.lists = self.resumes = 0

    def list(self):
        """Lists every page at one version; the copy becomes what it holds."""
        objects, token = {}, None
        while True:
            kwargs = {"label_selector": self.selector, "limit": self.page}
            if token:
                kwargs["_continue"] = token
            page = self.api.list_pod_for_all_namespaces(**kwargs)
            for pod in page.items:
                objects[pod.metadata.namespace + "/" + pod.metadata.name] = pod.metadata.resource_version
            token = page.metadata._continue
            if not token:
                break
        self.objects, self.version = objects, page.metadata.resource_version
        self.lists += 1
        log("listed", objects=len(objects), resource_version=self.version)

    def watch(self, until):
        """Follows changes from the copy's version until `until` appears;
        False when the watch ended and should be started again."""
        w = watch.Watch()
        for event in w.stream(self.api.list_pod_for_all_namespaces, label_selector=self.selector,
                              resource_version=self.version, allow_watch_bookmarks=True,
                              timeout_seconds=300):
            pod, kind = event["object"], event["type"]
            if kind == "BOOKMARK":
                self.version = pod["metadata"]["resourceVersion"] if isinstance(pod, dict) else pod.metadata.resource_version
                continue
            key = pod.metadata.namespace + "/" + pod.metadata.name
            if kind == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = pod.metadata.resource_version
            self.version = pod.metadata.resource_version
            log(kind.lower(), name=key, resource_version=self.version)
            if pod.metadata.name == until and kind != "DELETED":
                return True
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kubeconfig")
    p.add_argument("resource", choices=["pods"])
    p.add_argument("--selector", default="")
    p.add_argument("--until", help="exit once an object of this name is seen")
    p.add_argument("--page", type=int, default=2, help="objects per list page")
    args = p.parse_args()
    config.load_kube_config(config_file=args.kubeconfig)
    informer = Informer(client.CoreV1Api(), args.selector, args.page)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if informer.version is None:
                informer.list()
            if informer.watch(args.until):
                break
            log("watch ended", resource_version=informer.version)
        except ApiException as e:
            if e.status == 410:
                log("too old", status=e.status, reason=e.reason)
                informer.version = None
            elif e.status in (429, 503, 504):
                log("list unavailable" if informer.version is None else "watch unavailable",
                    status=e.status, retry_after=e.headers.get("Retry-After") if e.headers else None)
                time.sleep(0.2)
            else:
                raise
        except (urllib3.exceptions.HTTPError, OSError) as e:
            log("resuming", resource_version=informer.version, error=type(e).__name__)
            if informer.version is not None:
                informer.resumes += 1
            time.sleep(0.2)
    else:
        sys.exit("gave up after two minutes")
    print(json.dumps({"objects": informer.objects, "lists": informer.lists, "resumes": informer.resumes}))


if __name__ == "__main__":
    main()
