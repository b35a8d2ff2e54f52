"""A client over the generated stubs: one target or several replicas
(round robin, moving off a replica that goes away), TLS, and a bearer
token sent with every call."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

from watchproxy.errors import StatusError
from watchproxy.v1 import watchproxy_pb2 as pb
from watchproxy.v1 import watchproxy_pb2_grpc as pb_grpc

# A shard: a field (`metadata.uid`, `metadata.name`, `metadata.namespace` or
# a selectable field) and `[start, end)` ranges of its 64-bit FNV-1a hash
# (`end` 0 for 2**64), as Kubernetes' sharded List and Watch.
Shard = Tuple[str, Sequence[Tuple[int, int]]]


def _shard(shard: Optional[Shard]) -> Optional["pb.ShardSelector"]:
    if shard is None:
        return None
    field, ranges = shard
    return pb.ShardSelector(field=field, ranges=[pb.HashRange(start=s, end=e) for s, e in ranges])

MATCH = {
    "": pb.RESOURCE_VERSION_MATCH_UNSPECIFIED,
    "not-older-than": pb.RESOURCE_VERSION_MATCH_NOT_OLDER_THAN,
    "exact": pb.RESOURCE_VERSION_MATCH_EXACT,
}


class Obj:
    """An object as watchproxy serves it; `json` is the value parsed (None
    when the value is not JSON), parsed on first use."""

    __slots__ = ("key", "namespace", "name", "resource_version", "labels", "value", "_json")

    def __init__(self, o: "pb.Object"):
        self.key: str = o.key
        self.namespace: str = o.namespace
        self.name: str = o.name
        self.resource_version: str = o.resource_version
        self.labels: Dict[str, str] = dict(o.labels)
        self.value: bytes = o.value
        self._json = None

    @property
    def json(self):
        if self._json is None:
            try:
                self._json = json.loads(self.value)
            except ValueError:
                return None
        return self._json

    def __repr__(self) -> str:
        return f"Obj({self.namespace}/{self.name}@{self.resource_version})"


@dataclass
class TLS:
    """TLS to the server: `ca` to trust (system roots when None), and a
    client certificate and key where the server asks for one. Each is PEM
    bytes or a file path."""

    ca: Union[bytes, str, None] = None
    cert: Union[bytes, str, None] = None
    key: Union[bytes, str, None] = None
    # The name the server's certificate must carry, when not the target's.
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        def pem(v):
            if isinstance(v, str):
                with open(v, "rb") as f:
                    return f.read()
            return v
        return grpc.ssl_channel_credentials(pem(self.ca), pem(self.key), pem(self.cert))


class Watch:
    """An open watch: iterate for events; `cancel()` ends it from another
    thread. A failure is raised as StatusError."""

    def __init__(self, call):
        self._call = call

    def __iter__(self) -> Iterator["pb.WatchEvent"]:
        try:
            yield from self._call
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()


class _Connection:
    """What the blocking and the asyncio clients share: the target and its
    options, TLS, and the token sent with every call."""

    _secure_channel = staticmethod(grpc.secure_channel)
    _insecure_channel = staticmethod(grpc.insecure_channel)

    def __init__(self, target: str, tls: Union[TLS, bool, None] = None,
                 token: Union[str, Callable[[], str], None] = None, token_file: Optional[str] = None,
                 options: Sequence[Tuple[str, object]] = ()):
        """`token`: a bearer token, or a function giving the current one;
        `token_file`: a file holding it, read again when it changes (a
        projected service-account token). Certificate files in `tls` are
        read again by `renew_credentials()`, which informers call when the
        server ends a watch for its credential."""
        self._target, self._tls = target, tls
        self._token = token
        self._token_file = token_file
        self._token_seen: Tuple[Tuple[int, int, int], str] = ((-1, -1, -1), "")
        opts = [("grpc.lb_policy_name", "round_robin"),
                ("grpc.max_receive_message_length", -1),
                ("grpc.keepalive_time_ms", 30000), *options]
        if "," in target and not any(k == "grpc.default_authority" for k, _ in options):
            # grpcio would send the whole address list as :authority, which
            # HTTP/2 servers refuse; the first address stands for them all.
            opts.append(("grpc.default_authority", target.split(":", 1)[1].split(",")[0].lstrip("/")))
        if tls:
            server_name = tls.server_name if isinstance(tls, TLS) else None
            if server_name:
                opts.append(("grpc.ssl_target_name_override", server_name))
        self._options = opts
        self._connect()

    def _connect(self) -> None:
        if self._tls:
            creds = (self._tls if isinstance(self._tls, TLS) else TLS()).credentials()
            self.channel = self._secure_channel(self._target, creds, options=self._options)
        else:
            self.channel = self._insecure_channel(self._target, options=self._options)
        self.stub = pb_grpc.WatchProxyStub(self.channel)

    def renew_credentials(self) -> None:
        """Reads certificate files again on a new connection (the token is
        read for every call anyway)."""
        if isinstance(self._tls, TLS) and any(isinstance(v, str) for v in (self._tls.cert, self._tls.key)):
            # In-flight calls on the old connection finish or fail there.
            old = self.channel
            self._connect()
            self._retire(old)

    def _retire(self, channel) -> None:
        channel.close()

    @property
    def renewable(self) -> bool:
        """Whether a fresh credential can come: a token function or file,
        or certificate files."""
        tls_files = isinstance(self._tls, TLS) and any(isinstance(v, str) for v in (self._tls.cert, self._tls.key))
        return bool(self._token_file) or callable(self._token) or tls_files

    @property
    def _metadata(self) -> Tuple[Tuple[str, str], ...]:
        token = self._current_token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _current_token(self) -> Optional[str]:
        if self._token_file:
            st = os.stat(self._token_file)
            version = (st.st_ino, st.st_mtime_ns, st.st_size)
            if version != self._token_seen[0]:
                with open(self._token_file) as f:
                    self._token_seen = (version, f.read().strip())
            return self._token_seen[1]
        if callable(self._token):
            return self._token()
        return self._token


def list_request(resource: str, namespace: str = "", label_selector: str = "", field_selector: str = "",
                 resource_version: str = "", match: str = "", limit: int = 0, continue_token: str = "",
                 fields: Sequence[str] = (), metadata_only: bool = False,
                 shard: Optional[Shard] = None) -> "pb.ListRequest":
    return pb.ListRequest(resource=resource, namespace=namespace, label_selector=label_selector,
                          field_selector=field_selector, resource_version=resource_version,
                          resource_version_match=MATCH[match], limit=limit, continue_token=continue_token,
                          fields=fields, metadata_only=metadata_only, shard=_shard(shard))


def watch_request(resource: str, resource_version: str = "", namespace: str = "", name: str = "",
                  label_selector: str = "", field_selector: str = "", allow_bookmarks: bool = True,
                  send_initial_events: bool = False, timeout_seconds: int = 0, fields: Sequence[str] = (),
                  metadata_only: bool = False, shard: Optional[Shard] = None) -> "pb.WatchRequest":
    return pb.WatchRequest(resource=resource, namespace=namespace, name=name, label_selector=label_selector,
                           field_selector=field_selector, resource_version=resource_version,
                           allow_bookmarks=allow_bookmarks, send_initial_events=send_initial_events,
                           timeout_seconds=timeout_seconds, fields=fields, metadata_only=metadata_only,
                           shard=_shard(shard))


class Client(_Connection):
    """`target` is "host:port", or any gRPC target: "dns:///name:port" (a
    headless Service: every replica) or "ipv4:10.0.0.1:50051,10.0.0.2:50051".
    Calls are balanced round robin over what the target names."""

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def list(self, resource: str, namespace: str = "", label_selector: str = "", field_selector: str = "",
             resource_version: str = "", match: str = "", limit: int = 0, continue_token: str = "",
             fields: Sequence[str] = (), metadata_only: bool = False, shard: Optional[Shard] = None,
             timeout: Optional[float] = None) -> "pb.ListResponse":
        """One page of a List (`match`: "", "not-older-than" or "exact";
        `fields`/`metadata_only`: the paths of each value to keep; `shard`:
        see `Shard`)."""
        req = list_request(resource, namespace, label_selector, field_selector, resource_version, match, limit,
                           continue_token, fields, metadata_only, shard)
        try:
            return self.stub.List(req, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    def list_all(self, resource: str, page_size: int = 500, **query) -> Tuple[List[Obj], str]:
        """Every page of one List at one version: the objects and that version."""
        items: List[Obj] = []
        token = ""
        while True:
            page = self.list(resource, limit=page_size, continue_token=token, **query)
            items.extend(Obj(o) for o in page.items)
            token = page.continue_token
            if not token:
                return items, page.resource_version

    def get(self, resource: str, namespace: str, name: str, resource_version: str = "",
            fields: Sequence[str] = (), metadata_only: bool = False, timeout: Optional[float] = None) -> Obj:
        req = pb.GetRequest(resource=resource, namespace=namespace, name=name, resource_version=resource_version,
                            fields=fields, metadata_only=metadata_only)
        try:
            return Obj(self.stub.Get(req, metadata=self._metadata, timeout=timeout))
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    def watch(self, resource: str, resource_version: str = "", namespace: str = "", name: str = "",
              label_selector: str = "", field_selector: str = "", allow_bookmarks: bool = True,
              send_initial_events: bool = False, timeout_seconds: int = 0, fields: Sequence[str] = (),
              metadata_only: bool = False, shard: Optional[Shard] = None) -> Watch:
        req = watch_request(resource, resource_version, namespace, name, label_selector, field_selector,
                            allow_bookmarks, send_initial_events, timeout_seconds, fields, metadata_only, shard)
        return Watch(self.stub.Watch(req, metadata=self._metadata))
