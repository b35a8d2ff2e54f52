"""A watchproxy status, decoded: the stable reason of its ErrorInfo, the
versions in its metadata, the server's retry advice and the fields a bad
request named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DOMAIN = "watchproxy.v1"
_RESUME_KEY = "watchproxy-resume-resource-version"

# Codes no retry of the same request mends: the request, the resource or
# the caller's rights must change first.
PERMANENT = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.FAILED_PRECONDITION,
})

# A watch the server ended because its credential expired or was revoked,
# or because the rules changed: a fresh credential (or the rules as they
# are now) resumes it from the version the status names.
CREDENTIAL_ENDS = frozenset({"CREDENTIAL_EXPIRED", "CREDENTIAL_REVOKED", "ACCESS_CHANGED"})


@dataclass
class StatusError(Exception):
    code: grpc.StatusCode
    message: str
    # The ErrorInfo reason, e.g. "TOO_OLD_RESOURCE_VERSION"; None for a
    # failure that never reached watchproxy (a refused connection).
    reason: Optional[str] = None
    metadata: Dict[str, str] = field(default_factory=dict)
    # Seconds to wait before the same call again (RetryInfo).
    retry_delay: Optional[float] = None
    # (field, description) of each BadRequest violation.
    violations: List[Tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        reason = f" ({self.reason})" if self.reason else ""
        return f"{self.code.name}{reason}: {self.message}"

    @property
    def current_resource_version(self) -> Optional[str]:
        return self.metadata.get("current_resource_version")

    @property
    def oldest_resource_version(self) -> Optional[str]:
        return self.metadata.get("oldest_resource_version")

    @property
    def resume_resource_version(self) -> Optional[str]:
        """Where a watch the server ended resumes without loss."""
        return self.metadata.get("resume_resource_version")

    @property
    def is_gone(self) -> bool:
        """The version asked for is gone: list again."""
        return self.code == grpc.StatusCode.OUT_OF_RANGE

    @property
    def is_permanent(self) -> bool:
        return self.code in PERMANENT and not self.is_credential_end

    @property
    def is_credential_end(self) -> bool:
        """A credential that expired or was revoked, or rules that changed
        under an open watch: with a credential that can be renewed, renew
        it and resume from `resume_resource_version` (a watch) or retry."""
        return self.reason in CREDENTIAL_ENDS

    def to_dict(self) -> dict:
        return {
            "code": self.code.name, "message": self.message, "reason": self.reason,
            "metadata": self.metadata, "retry_delay": self.retry_delay,
            "violations": [list(v) for v in self.violations],
        }

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> "StatusError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        message = (err.details() if hasattr(err, "details") else None) or str(err)
        error = cls(code=code, message=message)
        status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
        for detail in status.details if status else ():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if info.domain == DOMAIN:
                    error.reason = info.reason
                    error.metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                error.retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                error.violations = [(v.field, v.description) for v in bad.field_violations]
        if "resume_resource_version" not in error.metadata and hasattr(err, "trailing_metadata"):
            named = dict(err.trailing_metadata() or ()).get(_RESUME_KEY)
            if named:
                error.metadata["resume_resource_version"] = named
        return error
