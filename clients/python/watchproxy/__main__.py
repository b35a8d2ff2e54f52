"""watchproxy from the command line: list, get, watch, or mirror a
resource with an informer. Objects and events are printed as JSON lines;
a failure as one JSON line on stderr with its decoded details (exit 2).

    python -m watchproxy 127.0.0.1:50051 list pods --selector app=web
    python -m watchproxy 127.0.0.1:50051 mirror pods --field-selector spec.nodeName=node-7
    python -m watchproxy 127.0.0.1:50051 mirror pods --shard metadata.uid:0-9223372036854775808
"""

import argparse
import json
import logging
import sys
import time

from watchproxy import TLS, Client, Informer, Shard, StatusError
from watchproxy.v1 import watchproxy_pb2 as pb


def _obj(o) -> dict:
    return {"namespace": o.namespace, "name": o.name, "resource_version": o.resource_version,
            "labels": dict(o.labels), "value": o.value.decode("utf-8", "replace")}


def _print(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m watchproxy", description=__doc__.splitlines()[0])
    p.add_argument("target", help="host:port, or a gRPC target such as dns:///name:port")
    p.add_argument("--ca", help="TLS: the CA file to trust")
    p.add_argument("--cert", help="TLS: a client certificate file")
    p.add_argument("--key", help="TLS: the client certificate's key file")
    p.add_argument("--token-file", help="a file holding a bearer token")
    cmds = p.add_subparsers(dest="command", required=True)
    for name in ("list", "watch", "mirror"):
        c = cmds.add_parser(name)
        c.add_argument("resource")
        c.add_argument("--namespace", default="")
        c.add_argument("--selector", default="", help="label selector")
        c.add_argument("--field-selector", default="")
        c.add_argument("--shard", type=_shard_arg, default=None,
                       help="FIELD:START-END[,START-END...]: only the objects whose FIELD's 64-bit FNV-1a hash "
                            "is in one of the ranges (END 0 for 2**64)")
        if name != "mirror":
            c.add_argument("--resource-version", default="")
    cmds.choices["list"].add_argument("--match", choices=["", "not-older-than", "exact"], default="")
    cmds.choices["list"].add_argument("--limit", type=int, default=0)
    cmds.choices["watch"].add_argument("--timeout-seconds", type=int, default=0)
    get = cmds.add_parser("get")
    for a in ("resource", "namespace", "name"):
        get.add_argument(a)
    get.add_argument("--resource-version", default="")
    for c in cmds.choices.values():
        c.add_argument("--fields", default="", help="comma-separated dotted paths of each value to keep")
        c.add_argument("--metadata-only", action="store_true", help="keep only the metadata of each value")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")

    tls = TLS(ca=args.ca, cert=args.cert, key=args.key) if (args.ca or args.cert) else None
    # Read again when it changes, so a watch ended for its token resumes.
    client = Client(args.target, tls=tls, token_file=args.token_file)
    cut = dict(fields=[f for f in args.fields.split(",") if f], metadata_only=args.metadata_only)
    try:
        if args.command == "get":
            _print(**_obj(client.get(args.resource, args.namespace, args.name, args.resource_version, **cut)))
        elif args.command == "list":
            resp = client.list(args.resource, namespace=args.namespace, label_selector=args.selector,
                               field_selector=args.field_selector, resource_version=args.resource_version,
                               match=args.match, limit=args.limit, shard=args.shard, **cut)
            for o in resp.items:
                _print(**_obj(o))
            _print(resource_version=resp.resource_version, continue_token=resp.continue_token)
        elif args.command == "watch":
            watch = client.watch(args.resource, resource_version=args.resource_version, namespace=args.namespace,
                                 label_selector=args.selector, field_selector=args.field_selector,
                                 timeout_seconds=args.timeout_seconds, shard=args.shard, **cut)
            for ev in watch:
                _print(type=pb.EventType.Name(ev.type), resync=ev.resync, **_obj(ev.object))
        else:
            inf = Informer(client, args.resource, namespace=args.namespace, label_selector=args.selector,
                           field_selector=args.field_selector, shard=args.shard, **cut)
            inf.add_handler(on_add=lambda o: _print(type="ADDED", **_obj(o)),
                            on_update=lambda old, new: _print(type="MODIFIED", **_obj(new)),
                            on_delete=lambda o: _print(type="DELETED", **_obj(o)),
                            on_relist=lambda rv, resync: _print(type="RELISTED", resource_version=rv, resync=resync))
            inf.start()
            try:
                while inf.error is None:
                    time.sleep(0.5)
                raise inf.error
            finally:
                inf.stop()
    except StatusError as e:
        print(json.dumps(e.to_dict()), file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _shard_arg(text: str) -> Shard:
    field, sep, ranges = text.partition(":")
    if not sep or not field:
        raise argparse.ArgumentTypeError("expected FIELD:START-END[,START-END...]")
    try:
        pairs = [tuple(int(n) for n in r.split("-", 1)) for r in ranges.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("ranges are START-END, in decimal") from None
    if any(len(p) != 2 for p in pairs):
        raise argparse.ArgumentTypeError("ranges are START-END, in decimal")
    return field, pairs


if __name__ == "__main__":
    sys.exit(main())
