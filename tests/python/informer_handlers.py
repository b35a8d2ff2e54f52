"""The Python informer's handlers, listers and shared informers, as a user
of the package drives them: `python3 informer_handlers.py <watchproxy
host:port> <etcd URL>`. Writes go to etcd with etcdctl; prints one JSON
object of what it saw, or fails with an assertion."""

import json
import subprocess
import sys
import threading
import time

from watchproxy import Client, EventHandler, InformerFactory, wait_for_sync

target, etcd = sys.argv[1], sys.argv[2]


def put(ns, name, app, node, gen=0):
    value = json.dumps({"metadata": {"name": name, "namespace": ns, "labels": {"app": app, "gen": str(gen)}},
                        "spec": {"nodeName": node}})
    subprocess.run(["etcdctl", "--endpoints", etcd, "put", f"/registry/pods/{ns}/{name}", value],
                   check=True, stdout=subprocess.DEVNULL, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})


def delete(ns, name):
    subprocess.run(["etcdctl", "--endpoints", etcd, "del", f"/registry/pods/{ns}/{name}"],
                   check=True, stdout=subprocess.DEVNULL, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})


def wait(what, done, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


class Recorder:
    """A handler's own view: what it was told, as a store."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.view = {}
        self.calls = []
        self.lock = threading.Lock()

    def on_add(self, obj, initial):
        time.sleep(self.delay)
        with self.lock:
            self.calls.append(("add", obj.name, initial))
            self.view[(obj.namespace, obj.name)] = obj.resource_version

    def on_update(self, old, new):
        time.sleep(self.delay)
        with self.lock:
            self.calls.append(("update", new.name))
            self.view[(new.namespace, new.name)] = new.resource_version

    def on_delete(self, obj):
        time.sleep(self.delay)
        with self.lock:
            self.calls.append(("delete", obj.name))
            self.view.pop((obj.namespace, obj.name), None)

    def names(self, kind):
        with self.lock:
            return [c[1] for c in self.calls if c[0] == kind]


client = Client(target)
factory = InformerFactory(client)
informer = factory.informer("pods", indexers={"node": lambda o: [o.json["spec"]["nodeName"]]})
assert factory.informer("pods") is informer, "one informer per resource and selection"
web = factory.informer("pods", label_selector="app=web")
assert web is not informer

fast, slow = Recorder(), Recorder(delay=0.1)
behind = []
fast_reg = informer.add_event_handler(fast)
slow_reg = informer.add_event_handler(slow, queue_size=4, on_fall_behind=behind.append)
web_adds = []
web.add_event_handler(EventHandler(on_add=lambda o, initial: initial and web_adds.append(o.name)))
factory.start()
assert factory.wait_for_sync(timeout=20)
assert wait_for_sync(informer, web, timeout=1)

def store_view(inf):
    return {(o.namespace, o.name): o.resource_version for o in inf.store.list()}

wait("the fast handler has the first list", lambda: fast.view == store_view(informer))
first = sorted(fast.names("add"))
assert all(c[2] for c in fast.calls), "the first list's adds are marked initial"

# A burst the slow handler cannot keep up with: the watch, the store and
# the fast handler are not held up by it.
burst = 60
started = time.monotonic()
for i in range(burst):
    put("ns-a", f"p{i % 10}", "web" if i % 2 == 0 else "db", f"node-{i % 3}", gen=i + 1)
delete("ns-b", "q0")
put("ns-a", "marker", "web", "node-0")
wait("the store has the marker", lambda: informer.store.get("ns-a", "marker") is not None)
wait("the fast handler has the marker", lambda: ("ns-a", "marker") in fast.view)
fast_done = time.monotonic() - started
slow_then = len(slow.calls)
wait("the fast handler is the store", lambda: fast.view == store_view(informer))
assert behind and behind[0] is slow_reg and slow_reg.fell_behind >= 1, "the slow handler fell behind"
wait("the slow handler caught up with the store", lambda: slow.view == store_view(informer), timeout=30)
assert "q0" in fast.names("delete")

# A handler added after sync gets every object once, as initial adds.
late = Recorder()
late_reg = informer.add_event_handler(late)
wait("the late handler has every object", lambda: late.view == store_view(informer))
late_adds = late.names("add")
assert sorted(late_adds) == sorted(set(late_adds)), f"each object once: {late_adds}"
assert all(c[0] == "add" and c[2] for c in late.calls)

# Removed: no more calls; the others go on.
informer.remove_event_handler(fast_reg)
before = len(fast.calls)
put("ns-c", "after", "web", "node-1")
wait("the late handler sees a change after the removal", lambda: ("ns-c", "after") in late.view)
time.sleep(0.2)
assert len(fast.calls) == before, "a removed handler is not called"

lister = informer.lister()
on_node_0 = sorted(o.name for o in lister.by_index("node", "node-0"))
result = {
    "first_list": first,
    "burst": burst,
    "fast_seconds": round(fast_done, 3),
    "slow_calls_when_fast_done": slow_then,
    "slow_fell_behind": slow_reg.fell_behind,
    "slow_calls": len(slow.calls),
    "late_adds": len(late_adds),
    "store": len(informer.store),
    "web_adds": sorted(web_adds),
    "lister_ns_a_web": sorted(o.name for o in lister.list(namespace="ns-a", selector="app=web")),
    "lister_every_db": sorted(o.name for o in lister.list(selector={"app": "db"})),
    "lister_get": lister.get("ns-c", "after").name,
    "lister_missing": lister.get("ns-c", "nope") is None,
    "on_node_0": on_node_0,
}
factory.stop()
print(json.dumps(result))
