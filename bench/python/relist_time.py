"""The Python informer's catch-up: how long its first list takes, and how
long the list after its version expired takes (pages, store, handlers).
Prints one JSON line when synced and one after the next list."""

import json
import sys
import time

from watchproxy import Client, Informer

target = sys.argv[1]
inf = Informer(Client(target), "pods", indexers={"node": lambda o: [o.json["spec"]["nodeName"]]})
handled = [0]


def count(*_):
    handled[0] += 1


inf.add_handler(on_add=count, on_update=count, on_delete=count)
inf.start()
inf.wait_synced(timeout=120)
print(json.dumps({"phase": "synced", "seconds": inf.last_list_seconds, "objects": len(inf.store),
                  "handled": handled[0]}), flush=True)
handled[0] = 0
deadline = time.monotonic() + 180
while inf.lists < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"phase": "relisted", "seconds": inf.last_list_seconds, "objects": len(inf.store),
                  "handled": handled[0], "lists": inf.lists}), flush=True)
inf.stop()
