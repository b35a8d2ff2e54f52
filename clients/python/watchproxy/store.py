"""An informer's local copy: objects by namespace and name, with indexes
a user defines, safe to read from any thread while the informer keeps it
up to date."""

from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

from watchproxy.client import Obj

log = logging.getLogger("watchproxy")

Key = Tuple[str, str]
IndexFn = Callable[[Obj], Iterable[str]]


class Store:
    """The informer's copy: safe to read from any thread while it runs."""

    def __init__(self, indexers: Optional[Dict[str, IndexFn]] = None):
        self._lock = threading.RLock()
        self._objects: Dict[Key, Obj] = {}
        self._indexers = dict(indexers or {})
        self._indices: Dict[str, Dict[str, Set[Key]]] = {name: {} for name in self._indexers}

    def get(self, namespace: str, name: str) -> Optional[Obj]:
        with self._lock:
            return self._objects.get((namespace, name))

    def list(self) -> List[Obj]:
        with self._lock:
            return list(self._objects.values())

    def by_index(self, index: str, value: str) -> List[Obj]:
        with self._lock:
            keys = self._indices[index].get(value, ())
            return [self._objects[k] for k in keys]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def _add_indexers(self, indexers: Dict[str, IndexFn]) -> None:
        with self._lock:
            for name, index in indexers.items():
                if name in self._indexers:
                    continue
                self._indexers[name] = index
                self._indices[name] = {}
                for key, obj in self._objects.items():
                    for value in index(obj):
                        self._indices[name].setdefault(value, set()).add(key)

    def _file(self, key: Key, obj: Obj, add: bool) -> None:
        for name, index in self._indexers.items():
            values = self._indices[name]
            try:
                filed = list(index(obj))
            except Exception:  # an indexer that cannot read this object files it nowhere
                log.exception("indexer %r failed on %s/%s", name, obj.namespace, obj.name)
                continue
            for value in filed:
                if add:
                    values.setdefault(value, set()).add(key)
                elif value in values:
                    values[value].discard(key)
                    if not values[value]:
                        del values[value]

    def _put(self, obj: Obj) -> Optional[Obj]:
        key = (obj.namespace, obj.name)
        old = self._objects.get(key)
        if old is not None:
            self._file(key, old, False)
        self._objects[key] = obj
        self._file(key, obj, True)
        return old

    def _remove(self, key: Key) -> Optional[Obj]:
        old = self._objects.pop(key, None)
        if old is not None:
            self._file(key, old, False)
        return old

    def _apply(self, obj: Obj, deleted: bool):
        """One watch event: ("add", obj) | ("update", old, new) | ("delete", obj) | None."""
        with self._lock:
            if deleted:
                return ("delete", obj) if self._remove((obj.namespace, obj.name)) is not None else None
            old = self._put(obj)
            return ("add", obj) if old is None else ("update", old, obj)

    def _replace(self, items: List[Obj]):
        """A list's items replace the copy; the changes that made the old
        copy the new one (an object at the same version is no change)."""
        with self._lock:
            gone = set(self._objects)
            changes = []
            for obj in items:
                key = (obj.namespace, obj.name)
                gone.discard(key)
                have = self._objects.get(key)
                if have is not None and have.resource_version == obj.resource_version and have.value == obj.value:
                    continue
                old = self._put(obj)
                changes.append(("add", obj) if old is None else ("update", old, obj))
            for key in gone:
                changes.append(("delete", self._remove(key)))
            return changes
