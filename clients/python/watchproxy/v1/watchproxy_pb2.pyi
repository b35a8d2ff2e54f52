from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
EVENT_TYPE_ADDED: EventType
EVENT_TYPE_BOOKMARK: EventType
EVENT_TYPE_DELETED: EventType
EVENT_TYPE_MODIFIED: EventType
EVENT_TYPE_UNSPECIFIED: EventType
RESOURCE_VERSION_MATCH_EXACT: ResourceVersionMatch
RESOURCE_VERSION_MATCH_NOT_OLDER_THAN: ResourceVersionMatch
RESOURCE_VERSION_MATCH_UNSPECIFIED: ResourceVersionMatch

class GetRequest(_message.Message):
    __slots__ = ["fields", "metadata_only", "name", "namespace", "resource", "resource_version"]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedScalarFieldContainer[str]
    metadata_only: bool
    name: str
    namespace: str
    resource: str
    resource_version: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: bool = ...) -> None: ...

class HashRange(_message.Message):
    __slots__ = ["end", "start"]
    END_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    end: int
    start: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ["continue_token", "field_selector", "fields", "label_selector", "limit", "metadata_only", "namespace", "resource", "resource_version", "resource_version_match", "shard"]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_MATCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    continue_token: str
    field_selector: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    label_selector: str
    limit: int
    metadata_only: bool
    namespace: str
    resource: str
    resource_version: str
    resource_version_match: ResourceVersionMatch
    shard: ShardSelector
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., resource_version: _Optional[str] = ..., resource_version_match: _Optional[_Union[ResourceVersionMatch, str]] = ..., limit: _Optional[int] = ..., continue_token: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: bool = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ["changed_resource_version", "continue_token", "items", "remaining_item_count", "resource_version", "shard", "state_digest"]
    CHANGED_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_ITEM_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    changed_resource_version: str
    continue_token: str
    items: _containers.RepeatedCompositeFieldContainer[Object]
    remaining_item_count: int
    resource_version: str
    shard: ShardSelector
    state_digest: str
    def __init__(self, items: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., resource_version: _Optional[str] = ..., continue_token: _Optional[str] = ..., remaining_item_count: _Optional[int] = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ..., changed_resource_version: _Optional[str] = ..., state_digest: _Optional[str] = ...) -> None: ...

class Object(_message.Message):
    __slots__ = ["key", "labels", "name", "namespace", "resource_version", "value"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    labels: _containers.ScalarMap[str, str]
    name: str
    namespace: str
    resource_version: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., resource_version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., value: _Optional[bytes] = ...) -> None: ...

class ProgressRequest(_message.Message):
    __slots__ = ["bookmark_watches", "namespace", "resource"]
    BOOKMARK_WATCHES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    bookmark_watches: bool
    namespace: str
    resource: str
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., bookmark_watches: bool = ...) -> None: ...

class ProgressResponse(_message.Message):
    __slots__ = ["changed_resource_version", "resource_version", "state_digest", "watch_resource_version"]
    CHANGED_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    WATCH_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    changed_resource_version: str
    resource_version: str
    state_digest: str
    watch_resource_version: str
    def __init__(self, resource_version: _Optional[str] = ..., watch_resource_version: _Optional[str] = ..., changed_resource_version: _Optional[str] = ..., state_digest: _Optional[str] = ...) -> None: ...

class ShardSelector(_message.Message):
    __slots__ = ["field", "ranges"]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    field: str
    ranges: _containers.RepeatedCompositeFieldContainer[HashRange]
    def __init__(self, field: _Optional[str] = ..., ranges: _Optional[_Iterable[_Union[HashRange, _Mapping]]] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ["initial_events_end", "object", "objects", "resume_resource_version", "resync", "type"]
    INITIAL_EVENTS_END_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    RESUME_RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    initial_events_end: bool
    object: Object
    objects: _containers.RepeatedCompositeFieldContainer[Object]
    resume_resource_version: str
    resync: bool
    type: EventType
    def __init__(self, type: _Optional[_Union[EventType, str]] = ..., object: _Optional[_Union[Object, _Mapping]] = ..., initial_events_end: bool = ..., resync: bool = ..., objects: _Optional[_Iterable[_Union[Object, _Mapping]]] = ..., resume_resource_version: _Optional[str] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ["allow_bookmarks", "batch_initial_events", "field_selector", "fields", "label_selector", "metadata_only", "name", "namespace", "resource", "resource_version", "send_initial_events", "shard", "timeout_seconds"]
    ALLOW_BOOKMARKS_FIELD_NUMBER: _ClassVar[int]
    BATCH_INITIAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    FIELD_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    LABEL_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    METADATA_ONLY_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    SEND_INITIAL_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    allow_bookmarks: bool
    batch_initial_events: bool
    field_selector: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    label_selector: str
    metadata_only: bool
    name: str
    namespace: str
    resource: str
    resource_version: str
    send_initial_events: bool
    shard: ShardSelector
    timeout_seconds: int
    def __init__(self, resource: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., label_selector: _Optional[str] = ..., field_selector: _Optional[str] = ..., resource_version: _Optional[str] = ..., allow_bookmarks: bool = ..., send_initial_events: bool = ..., timeout_seconds: _Optional[int] = ..., fields: _Optional[_Iterable[str]] = ..., metadata_only: bool = ..., shard: _Optional[_Union[ShardSelector, _Mapping]] = ..., batch_initial_events: bool = ...) -> None: ...

class ResourceVersionMatch(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
