#!/usr/bin/env python3
"""An informer for watchproxy in Python: list, then watch from the list's
resource version with a selector, keeping a local copy of the objects.

After a disconnect it resumes from the last resource version it has every
event of (or the one the server names in
`watchproxy-resume-resource-version`); on
OUT_OF_RANGE ("too old resource version") it lists again. The client stubs
are generated from proto/ with grpcio-tools at start.

    pip install grpcio grpcio-tools grpcio-status
    python3 examples/python/informer.py 127.0.0.1:50051 pods --selector app=web

With --until NAME it prints its copy as JSON and exits once an object of
that name appears.
"""

import argparse
import importlib
import json
import os
import sys
import tempfile
import time

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")


def load_stubs():
    out = tempfile.mkdtemp(prefix="watchproxy-py-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    code = protoc.main([
        "protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
        os.path.join(PROTO_ROOT, "watchproxy", "v1", "watchproxy.proto"),
    ])
    if code != 0:
        sys.exit("generating the client from the proto failed")
    sys.path.insert(0, out)
    return (importlib.import_module("watchproxy.v1.watchproxy_pb2"),
            importlib.import_module("watchproxy.v1.watchproxy_pb2_grpc"))


def log(**fields):
    print(json.dumps(fields), file=sys.stderr, flush=True)


def reason(err):
    """The ErrorInfo reason of a watchproxy status (google.rpc.Status
    details, decoded by grpcio-status), or None."""
    try:
        from grpc_status import rpc_status
        from google.rpc import error_details_pb2
    except ImportError:
        return None
    status = rpc_status.from_call(err)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    return None


class Informer:
    def __init__(self, stub, pb, resource, selector, field_selector):
        self.stub, self.pb = stub, pb
        self.resource, self.selector, self.field_selector = resource, selector, field_selector
        self.objects = {}  # key -> resource version
        # The last version all of whose events are here: where a watch
        # resumes. One revision can carry several events (a transaction), so
        # the last event's version is complete only once a later revision
        # or a bookmark arrives.
        self.version = None
        self.seen = None
        self.lists = self.resumes = 0

    def relist(self):
        """Pages of one consistent list replace the local copy."""
        objects, token = {}, ""
        while True:
            try:
                resp = self.stub.List(self.pb.ListRequest(
                    resource=self.resource, label_selector=self.selector,
                    field_selector=self.field_selector, limit=500, continue_token=token))
            except grpc.RpcError as e:
                # Not ready yet, or a replica going away: the status says
                # when to retry (RetryInfo); a short pause does here.
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                log(event="list unavailable; retrying", reason=reason(e), details=e.details())
                time.sleep(0.5)
                objects, token = {}, ""
                continue
            objects.update({o.key: o.resource_version for o in resp.items})
            token = resp.continue_token
            if not token:
                break
        self.objects, self.version = objects, resp.resource_version
        self.seen = self.version
        self.lists += 1
        log(event="listed", objects=len(objects), resource_version=self.version)

    def run(self, until=None):
        self.relist()
        while True:
            try:
                stream = self.stub.Watch(self.pb.WatchRequest(
                    resource=self.resource, label_selector=self.selector,
                    field_selector=self.field_selector, resource_version=self.version,
                    allow_bookmarks=True))
                for ev in stream:
                    t = self.pb.EventType.Name(ev.type)
                    rv = ev.object.resource_version
                    if t == "EVENT_TYPE_BOOKMARK":
                        self.version = self.seen = rv
                    elif int(rv) > int(self.seen):
                        self.version, self.seen = self.seen, rv
                    if t in ("EVENT_TYPE_ADDED", "EVENT_TYPE_MODIFIED"):
                        self.objects[ev.object.key] = ev.object.resource_version
                    elif t == "EVENT_TYPE_DELETED":
                        self.objects.pop(ev.object.key, None)
                    if until and t != "EVENT_TYPE_BOOKMARK" and ev.object.name == until:
                        return
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.OUT_OF_RANGE:
                    log(event="too old; listing again", reason=reason(e), details=e.details())
                    self.relist()
                    continue
                if code == grpc.StatusCode.UNAVAILABLE:
                    named = dict(e.trailing_metadata() or ()).get("watchproxy-resume-resource-version")
                    if named:
                        self.version = named
                    self.resumes += 1
                    log(event="resuming", code=code.name, reason=reason(e), resource_version=self.version)
                    time.sleep(0.2)
                    continue
                raise


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server")
    p.add_argument("resource")
    p.add_argument("--selector", default="")
    p.add_argument("--field-selector", default="")
    p.add_argument("--until", help="exit once an object of this name is seen")
    args = p.parse_args()
    pb, pb_grpc = load_stubs()
    channel = grpc.insecure_channel(args.server)
    informer = Informer(pb_grpc.WatchProxyStub(channel), pb, args.resource, args.selector, args.field_selector)
    informer.run(until=args.until)
    print(json.dumps({"objects": informer.objects, "lists": informer.lists, "resumes": informer.resumes}))


if __name__ == "__main__":
    main()
