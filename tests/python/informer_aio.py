"""The asyncio informer's readers, as a user of `watchproxy.aio` drives
them: `python3 informer_aio.py <watchproxy host:port> <etcd URL>`. Writes
go to etcd with etcdctl; prints one JSON object of what it saw, or fails
with an assertion."""

import asyncio
import json
import subprocess
import sys
import time

from watchproxy.aio import Client, Informer

target, etcd = sys.argv[1], sys.argv[2]


async def put(ns, name, app, gen=0):
    value = json.dumps({"metadata": {"name": name, "namespace": ns, "labels": {"app": app, "gen": str(gen)}},
                        "spec": {"nodeName": "node-0"}})
    await asyncio.to_thread(subprocess.run, ["etcdctl", "--endpoints", etcd, "put", f"/registry/pods/{ns}/{name}",
                                             value], check=True, stdout=subprocess.DEVNULL,
                            env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"})


async def wait(what, done, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.02)


class Reader:
    """An iterator's own view of the store, from what it was told."""

    def __init__(self, events, delay=0.0):
        self.events, self.delay = events, delay
        self.view, self.calls = {}, []

    async def run(self):
        async for event in self.events:
            await asyncio.sleep(self.delay)
            self.calls.append((event.type, event.obj.name if event.obj else event.resource_version, event.initial))
            if event.type in ("ADDED", "MODIFIED"):
                self.view[(event.obj.namespace, event.obj.name)] = event.obj.resource_version
            elif event.type == "DELETED":
                self.view.pop((event.obj.namespace, event.obj.name), None)


def store_view(informer):
    return {(o.namespace, o.name): o.resource_version for o in informer.store.list()}


async def main():
    async with Client(target) as client:
        informer = Informer(client, "pods")
        behind = []
        fast = Reader(informer.events())
        slow = Reader(informer.events(queue_size=4, on_fall_behind=behind.append), delay=0.1)
        informer.start()
        assert await informer.wait_synced(timeout=20)
        readers = [asyncio.create_task(r.run()) for r in (fast, slow)]
        await wait("the fast reader has the first list", lambda: fast.view == store_view(informer))
        first = sorted(c[1] for c in fast.calls if c[0] == "ADDED")
        assert all(c[2] for c in fast.calls if c[0] == "ADDED"), "the first list's adds are initial"
        assert fast.calls[-1][0] == "RELISTED"

        # A burst the slow reader cannot keep up with: the store and the
        # fast reader are not held up by it.
        burst = 60
        for i in range(burst):
            await put("ns-a", f"p{i % 10}", "web", gen=i + 1)
        await put("ns-a", "marker", "web")
        await wait("the fast reader has the marker", lambda: ("ns-a", "marker") in fast.view)
        slow_then = len(slow.calls)
        await wait("the fast reader is the store", lambda: fast.view == store_view(informer))
        assert behind and slow.events.fell_behind >= 1, "the slow reader fell behind"
        await wait("the slow reader caught up", lambda: slow.view == store_view(informer), timeout=30)

        # A reader made after sync gets every object once, as initial adds.
        late = Reader(informer.events())
        readers.append(asyncio.create_task(late.run()))
        await wait("the late reader has every object", lambda: late.view == store_view(informer))
        late_adds = [c[1] for c in late.calls if c[0] == "ADDED"]
        assert len(late_adds) == len(set(late_adds)), f"each object once: {late_adds}"
        assert all(c[2] for c in late.calls)

        # A reader removed ends; the others go on, and end when it stops.
        informer.remove_events(fast.events)
        await asyncio.wait_for(readers[0], 5)
        await put("ns-c", "after", "web")
        await wait("the late reader sees a change after", lambda: ("ns-c", "after") in late.view)
        await informer.stop()
        await asyncio.wait_for(asyncio.gather(*readers[1:]), 5)
        print(json.dumps({
            "first_list": first,
            "changes": len(first) + burst + 1,
            "slow_calls_when_fast_done": slow_then,
            "slow_fell_behind": slow.events.fell_behind,
            "slow_calls": len(slow.calls),
            "late_adds": len(late_adds),
            "store": len(informer.store),
        }))


asyncio.run(main())
