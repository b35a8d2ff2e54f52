"""client-go's shared informers: one informer per (resource, selection)
for every user of it in a process, started and synced together."""

from __future__ import annotations

import threading
import time
from typing import Dict, Iterable, Optional, Tuple

from watchproxy.client import Client, Shard
from watchproxy.informer import Informer


def wait_for_sync(*informers: Informer, timeout: Optional[float] = None) -> bool:
    """True once every informer's first list is in its store, False when
    `timeout` passes first; raises the error that stopped one before."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for informer in informers:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not informer.wait_synced(left):
            return False
    return True


class InformerFactory:
    """Gives every caller asking for the same resource and selection the
    same informer, so a process holds one watch for it."""

    def __init__(self, client: Client, page_size: int = 500):
        self.client = client
        self._page_size = page_size
        self._lock = threading.Lock()
        self._informers: Dict[Tuple, Informer] = {}
        self._started = False

    def informer(self, resource: str, namespace: str = "", label_selector: str = "", field_selector: str = "",
                 fields: Iterable[str] = (), metadata_only: bool = False, shard: Optional[Shard] = None,
                 indexers=None) -> Informer:
        """The informer of this resource and selection, made on first ask
        (and started at once when the factory is). `indexers` are added to
        a shared informer only before it starts."""
        fields = tuple(fields)
        shard_key = None if shard is None else (shard[0], tuple(tuple(r) for r in shard[1]))
        key = (resource, namespace, label_selector, field_selector, fields, metadata_only, shard_key)
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                informer = Informer(self.client, resource, namespace=namespace, label_selector=label_selector,
                                    field_selector=field_selector, indexers=indexers, page_size=self._page_size,
                                    fields=fields, metadata_only=metadata_only, shard=shard)
                self._informers[key] = informer
                if self._started:
                    informer.start()
            elif indexers:
                informer.add_indexers(indexers)
            return informer

    def start(self) -> None:
        """Starts every informer made so far, and those made later at once."""
        with self._lock:
            self._started = True
            for informer in self._informers.values():
                if not informer.started:
                    informer.start()

    def wait_for_sync(self, timeout: Optional[float] = None) -> bool:
        with self._lock:
            informers = list(self._informers.values())
        return wait_for_sync(*informers, timeout=timeout)

    def stop(self, timeout: Optional[float] = 10) -> None:
        with self._lock:
            informers = list(self._informers.values())
        for informer in informers:
            informer.stop(timeout)
