"""Event handlers as client-go's `AddEventHandler` has them: added and
removed at any time, each called on a thread of its own from a bounded
queue, so a slow handler never holds up the watch or the other handlers.

A handler whose queue fills falls behind: the changes it would have been
queued are not kept, `on_fall_behind` is told, and once it has worked
through its queue it is given the difference between what it was last
told and the store, so it ends up with every object as the store holds
it (the changes in between are lost to it, as a relist's are)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Callable, Deque, Dict, List, Optional, Tuple

from watchproxy.client import Obj

if TYPE_CHECKING:
    from watchproxy.store import Store

log = logging.getLogger("watchproxy")

Key = Tuple[str, str]


class EventHandler:
    """client-go's `ResourceEventHandlerFuncs`: any of the three calls.
    A handler may be any object with some of `on_add(obj,
    is_in_initial_list)`, `on_update(old, new)` and `on_delete(obj)`."""

    def __init__(self, on_add: Optional[Callable[[Obj, bool], None]] = None,
                 on_update: Optional[Callable[[Obj, Obj], None]] = None,
                 on_delete: Optional[Callable[[Obj], None]] = None):
        self._add, self._update, self._delete = on_add, on_update, on_delete

    def on_add(self, obj: Obj, is_in_initial_list: bool) -> None:
        if self._add is not None:
            self._add(obj, is_in_initial_list)

    def on_update(self, old: Obj, new: Obj) -> None:
        if self._update is not None:
            self._update(old, new)

    def on_delete(self, obj: Obj) -> None:
        if self._delete is not None:
            self._delete(obj)


# A queued change: ("add", obj, initial) | ("update", old, new) | ("delete", obj).
Change = tuple


def remember(seen: Dict[Key, Obj], change: Change) -> None:
    """Keeps `seen`, what a reader was told, as `change` leaves it."""
    if change[0] == "add":
        seen[(change[1].namespace, change[1].name)] = change[1]
    elif change[0] == "update":
        seen[(change[2].namespace, change[2].name)] = change[2]
    elif change[0] == "delete":
        seen.pop((change[1].namespace, change[1].name), None)


def difference(seen: Dict[Key, Obj], now: Dict[Key, Obj]) -> List[Change]:
    """The changes that make what a reader was told the store as it is
    `now`: what a reader that fell behind is given."""
    changes: List[Change] = [("delete", old) for key, old in seen.items() if key not in now]
    for key, obj in now.items():
        old = seen.get(key)
        if old is None:
            changes.append(("add", obj, False))
        elif old.resource_version != obj.resource_version or old.value != obj.value:
            changes.append(("update", old, obj))
    return changes


class Registration:
    """One handler added to an informer: what `remove_event_handler` takes.
    `fell_behind` counts the times its queue filled; `delivered` the calls
    it was given."""

    def __init__(self, name: str, handler, queue_size: int, store: "Store", dispatch: threading.RLock,
                 on_fall_behind: Optional[Callable[["Registration"], None]], initial: List[Obj]):
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        self.handler = handler
        self.fell_behind = 0
        self.delivered = 0
        self._size = queue_size
        self._store, self._dispatch = store, dispatch
        self._on_fall_behind = on_fall_behind
        self._queue: Deque[Change] = deque()
        self._behind = False
        self._closed = False
        self._ready = threading.Condition()
        # What the handler was told: each key's object, to give it the
        # difference with the store after it fell behind.
        self._seen: Dict[Key, Obj] = {}
        self._initial = initial
        self._thread = threading.Thread(target=self._run, name=f"handler-{name}", daemon=True)
        self._thread.start()

    @property
    def is_behind(self) -> bool:
        return self._behind

    def _offer(self, change: Change) -> None:
        """Queues one change; called with the informer's dispatch lock held,
        so never waits."""
        fell = False
        with self._ready:
            if self._closed or self._behind:
                return
            if len(self._queue) >= self._size:
                self._behind, fell = True, True
                self.fell_behind += 1
            else:
                self._queue.append(change)
            self._ready.notify()
        if fell:
            log.warning("a %s handler fell behind: its queue of %d is full; it gets the difference once it "
                        "catches up", type(self.handler).__name__, self._size)
            if self._on_fall_behind is not None:
                try:
                    self._on_fall_behind(self)
                except Exception:
                    log.exception("on_fall_behind failed")

    def _close(self, timeout: Optional[float] = 10) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _next(self) -> Optional[Change]:
        """The next change; a catch-up when the queue is worked through
        and the handler fell behind; None once closed."""
        with self._ready:
            while not self._queue and not self._behind and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            if self._queue:
                return self._queue.popleft()
        # Behind, with the queue worked through: the store as it is now;
        # changes after it are queued again, in order.
        with self._dispatch:
            now = {(o.namespace, o.name): o for o in self._store.list()}
            with self._ready:
                self._behind = False
        return ("catch-up", now)

    def _call(self, change: Change) -> None:
        kind = change[0]
        remember(self._seen, change)
        try:
            if kind == "add":
                fn = getattr(self.handler, "on_add", None)
                if fn is not None:
                    fn(change[1], change[2])
            elif kind == "update":
                fn = getattr(self.handler, "on_update", None)
                if fn is not None:
                    fn(change[1], change[2])
            elif kind == "delete":
                fn = getattr(self.handler, "on_delete", None)
                if fn is not None:
                    fn(change[1])
            self.delivered += 1
        except Exception:  # a failing handler must not stop its deliveries
            log.exception("%s handler failed on %s", kind, change[1])

    def _catch_up(self, now: Dict[Key, Obj]) -> None:
        for change in difference(self._seen, now):
            self._call(change)

    def _run(self) -> None:
        for obj in self._initial:
            self._call(("add", obj, True))
        self._initial = []
        while True:
            change = self._next()
            if change is None:
                return
            if change[0] == "catch-up":
                self._catch_up(change[1])
            else:
                self._call(change)
