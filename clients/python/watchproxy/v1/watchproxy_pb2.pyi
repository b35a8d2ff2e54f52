from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResourceVersionMatch(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_VERSION_MATCH_UNSPECIFIED: _ClassVar[ResourceVersionMatch]
    RESOURCE_VERSION_MATCH_NOT_OLDER_THAN: _ClassVar[ResourceVersionMatch]
    RESOURCE_VERSION_MATCH_EXACT: _ClassVar[ResourceVersionMatch]

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_ADDED: _ClassVar[EventType]
    EVENT_TYPE_MODIFIED: _ClassVar[EventType]
    EVENT_TYPE_DELETED: _ClassVar[EventType]
    EVENT_TYPE_BOOKMARK: _ClassVar[EventType]
RESOURCE_VERSION_MATCH_UNSPECIFIED: ResourceVersionMatch
RESOURCE_VERSION_MATCH_NOT_OLDER_THAN: ResourceVersionMatch
RESOURCE_VERSION_MATCH_EXACT: ResourceVersionMatch
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_ADDED: EventType
EVENT_TYPE_MODIFIED: EventType
EVENT_TYPE_DELETED: EventType
EVENT_TYPE_BOOKMARK: EventType

class Object(_message.Message):
    __slots__ = ("key", "namespace", "name", "resource_version", "labels", "value")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    namespace: str
    name: str
    resource_version: str
    labels: _containers.ScalarMap[str, str]
    value: bytes
    def __init__(self, key: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., value: _Optional[bytes] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("resource", "namespace", "label_selector", "field_selector", "resource_version", "resource_version_match", "limit", "continue_token", "fields", "metadata_only", "shard")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_MATCH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    label_selector: str
    field_selector: str
    resource_version: str
    resource_version_match: ResourceVersionMatch
    limit: int
    continue_token: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    metadata_only: bool
    shard: ShardSelector
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., resource_version: _Optional[str] = ..., resource_version_match: _Optional[_Union[ResourceVersionMatch, str]] = ..., limit: _Optional[int] = ..., continue_token: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: _Optional[bool] = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ...) -> None: ...

class ShardSelector(_message.Message):
    __slots__ = ("field", "ranges")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    field: str
    ranges: _containers.RepeatedCompositeFieldContainer[HashRange]
    def __init__(self, field: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[HashRange, _Mapping]]] = ...) -> None: ...

class HashRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("items", "resource_version", "continue_token", "remaining_item_count", "shard", "changed_resource_version", "state_digest")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REMAINING_ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    CHANGED_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Object]
    resource_version: str
    continue_token: str
    remaining_item_count: int
    shard: ShardSelector
    changed_resource_version: str
    state_digest: str
    def __init__(self, items: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., resource_version: _Optional[str] = ..., continue_token: _Optional[str] = ..., remaining_item_count: _Optional[int] = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ..., changed_resource_version: _Optional[str] = ..., state_digest: _Optional[str] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ("resource", "namespace", "bookmark_watches")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    BOOKMARK_WATCHES_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    bookmark_watches: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., bookmark_watches: _Optional[bool] = ...) -> None: ...

class ProgressResponse(_message.Message):
    __slots__ = ("resource_version", "watch_resource_version", "changed_resource_version", "state_digest")
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    WATCH_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    resource_version: str
    watch_resource_version: str
    changed_resource_version: str
    state_digest: str
    def __init__(self, resource_version: _Optional[str] = ..., watch_resource_version: _Optional[str] = ..., changed_resource_version: _Optional[str] = ..., state_digest: _Optional[str] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "resource_version", "fields", "metadata_only")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    resource_version: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    metadata_only: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: _Optional[bool] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("resource", "namespace", "name", "label_selector", "field_selector", "resource_version", "allow_bookmarks", "send_initial_events", "timeout_seconds", "fields", "metadata_only", "shard", "batch_initial_events")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALLOW_BOOKMARKS_FIELD_NUMBER: _ClassVar[int]
    SEND_INITIAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    BATCH_INITIAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    resource: str
    namespace: str
    name: str
    label_selector: str
    field_selector: str
    resource_version: str
    allow_bookmarks: bool
    send_initial_events: bool
    timeout_seconds: int
    fields: _containers.RepeatedScalarFieldContainer[str]
    metadata_only: bool
    shard: ShardSelector
    batch_initial_events: bool
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., resource_version: _Optional[str] = ..., allow_bookmarks: _Optional[bool] = ..., send_initial_events: _Optional[bool] = ..., timeout_seconds: _Optional[int] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: _Optional[bool] = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ..., batch_initial_events: _Optional[bool] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("type", "object", "initial_events_end", "resync", "objects", "resume_resource_version")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    INITIAL_EVENTS_END_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    RESUME_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    type: EventType
    object: Object
    initial_events_end: bool
    resync: bool
    objects: _containers.RepeatedCompositeFieldContainer[Object]
    resume_resource_version: str
    def __init__(self, type: _Optional[_Union[EventType, str]] = ..., object: _Optional[_Union[Object, _Mapping]] = ..., initial_events_end: _Optional[bool] = ..., resync: _Optional[bool] = ..., objects: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., resume_resource_version: _Optional[str] = ...) -> None: ...
