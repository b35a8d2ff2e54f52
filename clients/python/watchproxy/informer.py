"""An informer, as Kubernetes' client-go has it: list a resource, watch
from the list's version, keep an indexed local copy, call handlers with
what changed. A broken watch resumes from the last version it has every
event of, so a restart or a move between replicas costs no list; it lists
again only when the server says its version is gone, and the handlers then
see just the difference."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional

from watchproxy.client import Client, Obj, Shard, Watch
from watchproxy.errors import StatusError
from watchproxy.handlers import Registration
from watchproxy.lister import Lister
from watchproxy.store import IndexFn, Store
from watchproxy.v1 import watchproxy_pb2 as pb

log = logging.getLogger("watchproxy")

class _Cursor:
    """`complete` is the last version with all its events here: one
    version can carry several events (a transaction), so the latest one
    seen is complete only once a later version or a bookmark arrives."""

    def __init__(self, version: int):
        self.complete = self.seen = version

    def event(self, version: int) -> None:
        if version > self.seen:
            self.complete, self.seen = self.seen, version

    def bookmark(self, version: int) -> None:
        self.seen = max(self.seen, version)
        self.complete = self.seen


class _Backoff:
    """Doubling waits up to a ceiling, jittered in the upper half of each
    step so clients a replica dropped together do not return together,
    never shorter than the server's advice."""

    def __init__(self, first: float = 0.2, ceiling: float = 30.0):
        self.first, self.ceiling, self.step = first, ceiling, first

    def next(self, advised: Optional[float] = None) -> float:
        step, self.step = self.step, min(self.step * 2, self.ceiling)
        return max(random.uniform(step / 2, step), advised or 0.0)

    def reset(self) -> None:
        self.step = self.first


def after_failure(client, resource: str, what: str, err: StatusError, backoff: _Backoff) -> Optional[float]:
    """The wait before retrying `what` after `err`, with the client's
    credential renewed when the server ended it; None when no retry can
    mend it (logged either way)."""
    if err.is_credential_end and err.reason != "ACCESS_CHANGED":
        if not client.renewable:
            log.error("%s %s failed (%s %s) and the credential is fixed; informer stopped: %s",
                      resource, what, err.code.name, err.reason, err.message)
            return None
        client.renew_credentials()
    elif err.is_permanent:
        log.error("%s %s failed (%s %s); informer stopped: %s", resource, what, err.code.name,
                  err.reason, err.message)
        return None
    wait = backoff.next(err.retry_delay)
    verb = "unavailable" if err.code.name == "UNAVAILABLE" else "failed"
    # A replica going away or a connection reaching its age is a planned move.
    planned = err.reason in ("SHUTTING_DOWN", "CONNECTION_AGED") or err.is_credential_end
    log.log(logging.INFO if planned else logging.WARNING, "%s %s %s (%s %s); retrying in %.2fs: %s",
            resource, what, verb, err.code.name, err.reason, wait, err.message)
    return wait


class Following:
    """What both informers (this module's and `watchproxy.aio`'s) hold:
    what they follow, their store, where they are and what they did."""

    def __init__(self, client: Client, resource: str, namespace: str = "", label_selector: str = "",
                 field_selector: str = "", indexers: Optional[Dict[str, IndexFn]] = None, page_size: int = 500,
                 fields: Iterable[str] = (), metadata_only: bool = False, shard: Optional[Shard] = None):
        self.client, self.resource = client, resource
        # `fields`/`metadata_only`: the paths of each value to keep;
        # `shard`: only the objects of one shard (see `Shard`).
        self._query = dict(namespace=namespace, label_selector=label_selector, field_selector=field_selector,
                           fields=tuple(fields), metadata_only=metadata_only, shard=shard)
        self._page_size = page_size
        self.store = Store(indexers)
        self._version = ""
        self._backoff = _Backoff()
        # The error that stopped it, when no retry could mend it.
        self.error: Optional[StatusError] = None
        self.lists = self.resumes = 0
        # Seconds the last list took, its pages, the store's update and the
        # readers' taking of the difference included.
        self.last_list_seconds = 0.0

    def lister(self) -> Lister:
        return Lister(self.store)

    def add_indexers(self, indexers: Dict[str, IndexFn]) -> None:
        """More indexes on the store, filled from what it holds."""
        self.store._add_indexers(indexers)

    @property
    def resource_version(self) -> str:
        """The version of the last change or bookmark the store took."""
        return self._version

class Informer(Following):
    """Mirrors `resource` (optionally one namespace and selectors) into
    `store`, calling the handlers on its own thread in the order the store
    took the changes."""

    def __init__(self, client: Client, resource: str, namespace: str = "", label_selector: str = "",
                 field_selector: str = "", indexers: Optional[Dict[str, IndexFn]] = None, page_size: int = 500,
                 fields: Iterable[str] = (), metadata_only: bool = False, shard: Optional[Shard] = None):
        super().__init__(client, resource, namespace=namespace, label_selector=label_selector,
                         field_selector=field_selector, indexers=indexers, page_size=page_size, fields=fields,
                         metadata_only=metadata_only, shard=shard)
        self._handlers: List[dict] = []
        # add_event_handler's registrations; a change is taken by the store
        # and queued to them under `_dispatch`, so one added meanwhile gets
        # each object once: in its first adds or as a change after them.
        self._dispatch = threading.RLock()
        self._registrations: List[Registration] = []
        # The first list is in the store (set under `_dispatch`).
        self._listed = False
        self._stopping = threading.Event()
        self._synced = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watch: Optional[Watch] = None

    def add_handler(self, on_add: Optional[Callable[[Obj], None]] = None,
                    on_update: Optional[Callable[[Obj, Obj], None]] = None,
                    on_delete: Optional[Callable[[Obj], None]] = None,
                    on_relist: Optional[Callable[[str, bool], None]] = None) -> None:
        """`on_relist(resource_version, resync)` follows the changes of a
        list (or of a resync the server sent) that brought the store to
        `resource_version`."""
        self._handlers.append(dict(add=on_add, update=on_update, delete=on_delete, relist=on_relist))

    def add_event_handler(self, handler, queue_size: int = 1024,
                          on_fall_behind: Optional[Callable[[Registration], None]] = None) -> Registration:
        """client-go's AddEventHandler: `handler` (an `EventHandler`, or any
        object with some of `on_add(obj, is_in_initial_list)`,
        `on_update(old, new)`, `on_delete(obj)`) is called on a thread of
        its own, from a queue of `queue_size` changes. Added after the
        informer synced, it first gets every object the store holds as an
        add. A handler that lets its queue fill never holds the watch up: it
        falls behind (`on_fall_behind(registration)` is told, on the
        informer's thread: keep it quick) and, once it has worked through
        its queue, gets the difference between what it was told and the
        store."""
        with self._dispatch:
            initial = self.store.list() if self._listed else []
            registration = Registration(self.resource, handler, queue_size, self.store, self._dispatch,
                                        on_fall_behind, initial)
            self._registrations.append(registration)
        return registration

    def remove_event_handler(self, registration: Registration) -> None:
        """No more calls to that handler once the one under way returns."""
        with self._dispatch:
            if registration in self._registrations:
                self._registrations.remove(registration)
        registration._close()


    @property
    def started(self) -> bool:
        return self._thread is not None

    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """True once the first list is in the store; raises the error that
        stopped the informer before it synced."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._synced.wait(0.05):
            if self.error is not None:
                raise self.error
            if deadline is not None and time.monotonic() >= deadline:
                return False
        return True

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.resource}", daemon=True)
        self._thread.start()

    def stop(self, timeout: Optional[float] = 10) -> None:
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._dispatch:
            registrations, self._registrations = self._registrations, []
        for registration in registrations:
            registration._close(timeout)

    def _notify(self, kind: str, *args) -> None:
        for h in self._handlers:
            fn = h[kind]
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # a failing handler must not stop the informer
                log.exception("%s handler failed", kind)

    def _changed(self, change) -> None:
        if change is not None:
            self._notify(change[0], *change[1:])

    def _pause(self, what: str, err: StatusError) -> bool:
        """Waits before a retry; False when none can help."""
        wait = after_failure(self.client, self.resource, what, err, self._backoff)
        if wait is None:
            self.error = err
            return False
        return not self._stopping.wait(wait)

    def _queue(self, change, initial: bool = False) -> None:
        """Queues a change the store took to every registration; under
        `_dispatch`."""
        if change is None:
            return
        if change[0] == "add":
            change = ("add", change[1], initial)
        for registration in self._registrations:
            registration._offer(change)

    def _relist(self) -> int:
        started = time.monotonic()
        items, version = self.client.list_all(self.resource, page_size=self._page_size, **self._query)
        with self._dispatch:
            changes = self.store._replace(items)
            for change in changes:
                self._queue(change, initial=not self._listed)
            self._listed = True
        log.info("%s listed %d objects at %s (%d changes)", self.resource, len(items), version, len(changes))
        for change in changes:
            self._changed(change)
        self._notify("relist", version, False)
        self._version = version
        self.last_list_seconds = time.monotonic() - started
        self.lists += 1
        self._synced.set()
        self._backoff.reset()
        return int(version)

    def _follow(self, cursor: _Cursor) -> None:
        watch = self.client.watch(self.resource, resource_version=str(cursor.complete), **self._query)
        self._watch = watch
        if self._stopping.is_set():
            watch.cancel()
        for ev in watch:
            self._backoff.reset()
            rv = ev.object.resource_version
            if ev.type == pb.EVENT_TYPE_BOOKMARK:
                cursor.bookmark(int(rv))
                if ev.resync:
                    self._notify("relist", rv, True)
            elif ev.type in (pb.EVENT_TYPE_ADDED, pb.EVENT_TYPE_MODIFIED, pb.EVENT_TYPE_DELETED):
                # A resync's events resume from where its lost history
                # starts; their objects keep their own versions.
                cursor.event(int(ev.resume_resource_version or rv))
                with self._dispatch:
                    change = self.store._apply(Obj(ev.object), ev.type == pb.EVENT_TYPE_DELETED)
                    self._queue(change)
                self._changed(change)
            else:
                log.warning("%s: skipped an event of unknown type %d", self.resource, ev.type)
                continue
            self._version = str(cursor.seen)

    def _run(self) -> None:
        resume: Optional[int] = None
        while not self._stopping.is_set():
            if resume is None:
                try:
                    resume = self._relist()
                except StatusError as e:
                    if not self._pause("list", e):
                        return
                    continue
            cursor = _Cursor(resume)
            try:
                self._follow(cursor)
                resume = cursor.complete
                if self._stopping.wait(self._backoff.next()):
                    return
            except StatusError as e:
                if self._stopping.is_set():
                    return
                if e.is_gone:
                    log.warning("%s too old (%s %s); listing again", self.resource, e.code.name, e.reason)
                    resume = None
                    continue
                if not self._pause("watch", e):
                    return
                named = int(e.resume_resource_version or 0)
                resume = max(cursor.complete, named)
                self.resumes += 1
                log.info("%s resuming from %d after %s %s", self.resource, resume, e.code.name, e.reason)
