"""The client and the informer for asyncio, on grpc.aio: the calls are
coroutines, and an informer is iterated.

    from watchproxy.aio import Client, Informer
    client = Client("127.0.0.1:50051")
    informer = Informer(client, "pods", label_selector="app=web")
    informer.start()
    await informer.wait_synced(timeout=30)
    async for event in informer:        # ADDED, MODIFIED, DELETED, RELISTED
        print(event.type, event.obj)

The informer follows as the blocking one does (resumes a broken watch
from its version, lists again only when the server says it is gone, waits
as the server advises, renews a credential the server ended) with its
store, lister and indexes. Each iterator reads from a bounded queue of its
own, so a slow reader never holds up the watch or the other readers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

import grpc

from watchproxy.client import Obj, _Connection, list_request, watch_request
from watchproxy.errors import StatusError
from watchproxy.handlers import difference, remember
from watchproxy.informer import Following, _Cursor, after_failure
from watchproxy.v1 import watchproxy_pb2 as pb

log = logging.getLogger("watchproxy")

__all__ = ["Client", "Event", "Informer", "Subscription", "Watch"]


class Watch:
    """An open watch: `async for` its events; `cancel()` ends it. A failure
    is raised as StatusError."""

    def __init__(self, call):
        self._call = call

    async def __aiter__(self) -> AsyncIterator["pb.WatchEvent"]:
        try:
            async for event in self._call:
                yield event
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()


class Client(_Connection):
    """The asyncio client: the same arguments as `watchproxy.Client`
    (targets, `tls`, `token`, `token_file`), made inside a running loop."""

    _secure_channel = staticmethod(grpc.aio.secure_channel)
    _insecure_channel = staticmethod(grpc.aio.insecure_channel)

    def __init__(self, *args, **kwargs):
        # Channels replaced by `renew_credentials`, closing.
        self._retired: Set["asyncio.Task"] = set()
        super().__init__(*args, **kwargs)

    def _retire(self, channel) -> None:
        # Closed once its calls are done; `close()` waits for it.
        task = asyncio.get_running_loop().create_task(channel.close(grace=None))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def close(self) -> None:
        await self.channel.close()
        if self._retired:
            await asyncio.gather(*self._retired, return_exceptions=True)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def list(self, resource: str, timeout: Optional[float] = None, **query) -> "pb.ListResponse":
        """One page of a List; the arguments of `watchproxy.Client.list`."""
        try:
            return await self.stub.List(list_request(resource, **query), metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    async def list_all(self, resource: str, page_size: int = 500, **query) -> Tuple[List[Obj], str]:
        """Every page of one List at one version: the objects and that version."""
        items: List[Obj] = []
        token = ""
        while True:
            page = await self.list(resource, limit=page_size, continue_token=token, **query)
            items.extend(Obj(o) for o in page.items)
            token = page.continue_token
            if not token:
                return items, page.resource_version

    async def get(self, resource: str, namespace: str, name: str, resource_version: str = "",
                  fields: Sequence[str] = (), metadata_only: bool = False, timeout: Optional[float] = None) -> Obj:
        req = pb.GetRequest(resource=resource, namespace=namespace, name=name, resource_version=resource_version,
                            fields=fields, metadata_only=metadata_only)
        try:
            return Obj(await self.stub.Get(req, metadata=self._metadata, timeout=timeout))
        except grpc.RpcError as e:
            raise StatusError.from_rpc_error(e) from None

    def watch(self, resource: str, **query) -> Watch:
        """A watch; the arguments of `watchproxy.Client.watch`."""
        return Watch(self.stub.Watch(watch_request(resource, **query), metadata=self._metadata))


@dataclass(frozen=True)
class Event:
    """A change the store took. `type` is ADDED, MODIFIED (`old` is the
    state before), DELETED (the last state), or RELISTED: the store now
    equals a list at `resource_version` (`resync`: the server sent the
    difference on the watch), the changes since the last watch event being
    the difference."""

    type: str
    obj: Optional[Obj] = None
    old: Optional[Obj] = None
    resource_version: str = ""
    resync: bool = False
    # ADDED of the first list, or of the objects a late subscriber starts from.
    initial: bool = False


def _event(change) -> Event:
    if change[0] == "add":
        return Event("ADDED", change[1], initial=change[2])
    if change[0] == "update":
        return Event("MODIFIED", change[2], old=change[1])
    return Event("DELETED", change[1])


class Subscription:
    """One reader of an informer's events, from `informer.events()`. Its
    queue is bounded and the informer never waits on it: a reader that lets
    it fill falls behind (`fell_behind` counts it; `on_fall_behind(self)`
    is told), the changes it would have been given are dropped, and once it
    has read what was queued it is given the difference between what it
    was told and the store, so it ends with every object as the store
    holds it."""

    def __init__(self, informer: "Informer", queue_size: int, on_fall_behind, initial: List[Obj]):
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self._informer = informer
        self._size = queue_size
        self._on_fall_behind = on_fall_behind
        # Changes: ("add", obj, initial) | ("update", old, new) | ("delete", obj) | ("relisted", rv, resync).
        self._initial: Deque[tuple] = deque(("add", o, True) for o in initial)
        self._queue: Deque[tuple] = deque()
        self._behind = self._closed = False
        self._wakeup = asyncio.Event()
        # What it was told: each key's object, for the difference.
        self._seen: Dict[Tuple[str, str], Obj] = {}
        self.fell_behind = 0

    @property
    def is_behind(self) -> bool:
        return self._behind

    def _offer(self, change: tuple) -> None:
        if self._closed or self._behind:
            return
        if len(self._queue) >= self._size:
            self._behind = True
            self.fell_behind += 1
            log.warning("an event reader of %s fell behind: its queue of %d is full; it gets the difference "
                        "once it catches up", self._informer.resource, self._size)
            if self._on_fall_behind is not None:
                try:
                    self._on_fall_behind(self)
                except Exception:
                    log.exception("on_fall_behind failed")
        else:
            self._queue.append(change)
        self._wakeup.set()

    def _close(self) -> None:
        self._closed = True
        self._wakeup.set()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Event:
        while True:
            if self._initial:
                change = self._initial.popleft()
            elif self._queue:
                change = self._queue.popleft()
            elif self._behind and not self._closed:
                # The store as it is now; changes after it are queued again.
                self._behind = False
                now = {(o.namespace, o.name): o for o in self._informer.store.list()}
                self._queue.extend(difference(self._seen, now))
                continue
            elif self._closed:
                if self._informer.error is not None:
                    raise self._informer.error
                raise StopAsyncIteration
            else:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if change[0] == "relisted":
                return Event("RELISTED", resource_version=change[1], resync=change[2])
            remember(self._seen, change)
            return _event(change)


class Informer(Following):
    """Mirrors `resource` into `store` on a task of the running loop; the
    arguments are those of `watchproxy.Informer`."""

    def __init__(self, client: Client, resource: str, **selection):
        super().__init__(client, resource, **selection)
        self._subscriptions: List[Subscription] = []
        self._synced = asyncio.Event()
        self._done = asyncio.Event()
        self._task: Optional["asyncio.Task"] = None
        self._watch: Optional[Watch] = None

    def events(self, queue_size: int = 1024,
               on_fall_behind: Optional[Callable[[Subscription], None]] = None) -> Subscription:
        """An iterator of every change from now on; made after the first
        list, it first gives the store's objects as ADDED (`initial`).
        Iteration ends when the informer stops, raising the error that
        stopped it, if one did. A reader slower than the changes falls
        behind and then gets the difference (see `Subscription`)."""
        subscription = Subscription(self, queue_size, on_fall_behind,
                                    self.store.list() if self._synced.is_set() else [])
        if self._done.is_set():
            subscription._close()
        self._subscriptions.append(subscription)
        return subscription

    def remove_events(self, subscription: Subscription) -> None:
        """Ends that iterator; the informer gives it nothing more."""
        if subscription in self._subscriptions:
            self._subscriptions.remove(subscription)
        subscription._close()

    def __aiter__(self) -> Subscription:
        return self.events()

    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """True once the first list is in the store (False at `timeout`);
        raises the error that stopped the informer before it synced."""
        synced = asyncio.ensure_future(self._synced.wait())
        done = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({synced, done}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            synced.cancel()
            done.cancel()
        if self._synced.is_set():
            return True
        if self.error is not None:
            raise self.error
        return False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"informer-{self.resource}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._end()

    def _end(self) -> None:
        if not self._done.is_set():
            self._done.set()
            for subscription in self._subscriptions:
                subscription._close()

    def _offer(self, change: tuple) -> None:
        for subscription in self._subscriptions:
            subscription._offer(change)

    async def _pause(self, what: str, err: StatusError) -> bool:
        wait = after_failure(self.client, self.resource, what, err, self._backoff)
        if wait is None:
            self.error = err
            return False
        await asyncio.sleep(wait)
        return True

    async def _relist(self) -> int:
        started = time.monotonic()
        items, version = await self.client.list_all(self.resource, page_size=self._page_size, **self._query)
        first = not self._synced.is_set()
        # Taken and offered with no await between: a reader made meanwhile
        # gets each object once, in its first adds or as a change.
        changes = self.store._replace(items)
        self._version = version
        self.lists += 1
        self._synced.set()
        log.info("%s listed %d objects at %s (%d changes)", self.resource, len(items), version, len(changes))
        for change in changes:
            self._offer(("add", change[1], first) if change[0] == "add" else change)
        self._offer(("relisted", version, False))
        self.last_list_seconds = time.monotonic() - started
        self._backoff.reset()
        return int(version)

    async def _follow(self, cursor: _Cursor) -> None:
        watch = self.client.watch(self.resource, resource_version=str(cursor.complete), **self._query)
        self._watch = watch
        async for ev in watch:
            self._backoff.reset()
            rv = ev.object.resource_version
            if ev.type == pb.EVENT_TYPE_BOOKMARK:
                cursor.bookmark(int(rv))
                self._version = str(cursor.seen)
                if ev.resync:
                    self._offer(("relisted", rv, True))
            elif ev.type in (pb.EVENT_TYPE_ADDED, pb.EVENT_TYPE_MODIFIED, pb.EVENT_TYPE_DELETED):
                # A resync's events resume from where its lost history
                # starts; their objects keep their own versions.
                cursor.event(int(ev.resume_resource_version or rv))
                self._version = str(cursor.seen)
                change = self.store._apply(Obj(ev.object), ev.type == pb.EVENT_TYPE_DELETED)
                if change is not None:
                    self._offer(("add", change[1], False) if change[0] == "add" else change)
            else:
                log.warning("%s: skipped an event of unknown type %d", self.resource, ev.type)

    async def _run(self) -> None:
        try:
            await self._loop()
        finally:
            watch = self._watch
            if watch is not None:
                watch.cancel()
            self._end()

    async def _loop(self) -> None:
        resume: Optional[int] = None
        while True:
            if resume is None:
                try:
                    resume = await self._relist()
                except StatusError as e:
                    if not await self._pause("list", e):
                        return
                    continue
            cursor = _Cursor(resume)
            try:
                await self._follow(cursor)
                resume = cursor.complete
                await asyncio.sleep(self._backoff.next())
            except StatusError as e:
                if e.is_gone:
                    log.warning("%s too old (%s %s); listing again", self.resource, e.code.name, e.reason)
                    resume = None
                    continue
                if not await self._pause("watch", e):
                    return
                resume = max(cursor.complete, int(e.resume_resource_version or 0))
                self.resumes += 1
                log.info("%s resuming from %d after %s %s", self.resource, resume, e.code.name, e.reason)
