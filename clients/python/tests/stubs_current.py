"""Exits non-zero when the checked-in stubs (watchproxy/v1) were not
generated from the proto given as the first argument's root."""

import os
import sys
import tempfile

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from watchproxy.v1 import watchproxy_pb2


def without_json_names(messages):
    # The python generator leaves out the JSON names protoc derives.
    for m in messages:
        for f in m.field:
            f.ClearField("json_name")
        without_json_names(m.nested_type)


root = sys.argv[1]
out = os.path.join(tempfile.mkdtemp(), "descriptor.pb")
if protoc.main(["protoc", f"-I{root}", f"--descriptor_set_out={out}",
                os.path.join(root, "watchproxy", "v1", "watchproxy.proto")]) != 0:
    sys.exit("protoc failed")
fresh = descriptor_pb2.FileDescriptorSet()
with open(out, "rb") as f:
    fresh.ParseFromString(f.read())
checked_in = descriptor_pb2.FileDescriptorProto.FromString(watchproxy_pb2.DESCRIPTOR.serialized_pb)
without_json_names(fresh.file[0].message_type)
without_json_names(checked_in.message_type)
if fresh.file[0] != checked_in:
    sys.exit("clients/python/watchproxy/v1 is not generated from proto/: run clients/python/generate.sh")
