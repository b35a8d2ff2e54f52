#!/usr/bin/env python3
"""Mirrors a watchproxy resource with the Python client's Informer and
prints what it holds.

    pip install ./clients/python
    python3 examples/python/informer.py 127.0.0.1:50051 pods --selector app=web

Log lines go to stderr as JSON. With --until NAME it prints its copy as
JSON ({"objects": {key: resource_version}, "lists": n, "resumes": n}) and
exits once an object of that name appears.
"""

import argparse
import json
import logging
import os
import sys
import threading

try:
    from watchproxy import TLS, Client, Informer
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
    from watchproxy import TLS, Client, Informer


class JsonLines(logging.Formatter):
    def format(self, record):
        return json.dumps({"level": record.levelname, "event": record.getMessage()})


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

    tls = TLS(ca=args.ca, cert=args.cert, key=args.key) if args.ca else None
    inf = Informer(Client(args.server, tls=tls, token_file=args.token_file), args.resource,
                   label_selector=args.selector, field_selector=args.field_selector)
    arrived = threading.Event()
    inf.add_handler(on_add=lambda obj: obj.name == args.until and arrived.set())
    inf.start()
    inf.wait_synced()
    if args.until:
        arrived.wait()
    else:
        threading.Event().wait()
    inf.stop()
    objects = {o.key: o.resource_version for o in inf.store.list()}
    print(json.dumps({"objects": objects, "lists": inf.lists, "resumes": inf.resumes}))


if __name__ == "__main__":
    main()
