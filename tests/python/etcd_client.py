"""Reads and watches an etcd endpoint with aetcd, etcd's asyncio client for
Python, and prints what it saw as JSON lines, so a test can compare etcd
with watchproxy's etcd API field for field.

usage: etcd_client.py HOST PORT PREFIX START_REVISION EVENTS
"""

import asyncio
import json
import sys

import aetcd


def pair(kv):
    if kv is None:
        return None
    return {
        "key": kv.key.decode(),
        "value": kv.value.decode(),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
    }


async def main(host, port, prefix, start, events):
    async with aetcd.Client(host=host, port=int(port)) as client:
        listed = await client.get_prefix(prefix.encode())
        print(json.dumps({"get_prefix": [pair(kv) for kv in listed], "count": listed.count}))
        one = await client.get(listed[0].key) if listed.count else None
        print(json.dumps({"get": pair(one)}))
        seen = 0
        watch = await client.watch_prefix(prefix.encode(), start_revision=int(start), prev_kv=True)
        async for event in watch:
            print(json.dumps({"kind": event.kind, "kv": pair(event.kv), "prev_kv": pair(event.prev_kv)}))
            seen += 1
            if seen == int(events):
                break
        await watch.cancel()


asyncio.run(main(*sys.argv[1:]))
