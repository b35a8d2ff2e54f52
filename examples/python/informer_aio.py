#!/usr/bin/env python3
"""Mirrors a watchproxy resource with the asyncio Informer
(`watchproxy.aio`) and prints what it holds: informer.py's options and
output, with `async for` over the informer's events.

    pip install ./clients/python
    python3 examples/python/informer_aio.py 127.0.0.1:50051 pods --selector app=web
"""

import argparse
import asyncio
import json
import logging
import os
import sys

try:
    from watchproxy import TLS
    from watchproxy.aio import Client, Informer
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    from watchproxy import TLS
    from watchproxy.aio import Client, Informer


class JsonLines(logging.Formatter):
    def format(self, record):
        return json.dumps({"level": record.levelname, "event": record.getMessage()})


async def mirror(args) -> None:
    tls = TLS(ca=args.ca, cert=args.cert, key=args.key) if args.ca else None
    async with Client(args.server, tls=tls, token_file=args.token_file) as client:
        informer = Informer(client, args.resource, label_selector=args.selector,
                            field_selector=args.field_selector)
        events = informer.events()
        informer.start()
        await informer.wait_synced()
        async for event in events:
            if args.until and event.type == "ADDED" and event.obj.name == args.until:
                break
        await informer.stop()
        objects = {o.key: o.resource_version for o in informer.store.list()}
        print(json.dumps({"objects": objects, "lists": informer.lists, "resumes": informer.resumes}))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server")
    p.add_argument("resource")
    p.add_argument("--selector", default="")
    p.add_argument("--field-selector", default="")
    p.add_argument("--until", help="exit once an object of this name is seen")
    p.add_argument("--token-file", help="a file holding a bearer token; read again when it changes")
    p.add_argument("--ca", help="TLS: the CA file to trust")
    p.add_argument("--cert", help="TLS: a client certificate file, read again when the server ends a watch for it")
    p.add_argument("--key", help="TLS: the client certificate's key file")
    args = p.parse_args()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    asyncio.run(mirror(args))


if __name__ == "__main__":
    main()
