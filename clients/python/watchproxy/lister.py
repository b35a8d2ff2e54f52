"""Listers, as client-go has them: reads of an informer's store by
namespace, label selector, name and index, without a call to the server."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Union

from watchproxy.client import Obj

if TYPE_CHECKING:
    from watchproxy.store import Store

Selector = Union[str, Dict[str, str], None]

_TERM = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?)\s*(?:,|$)"
)


def label_selector(selector: Selector) -> Callable[[Dict[str, str]], bool]:
    """A Kubernetes label selector (`app=web,tier!=db,env in (a,b),!canary`)
    or a dict of required labels, as a test of an object's labels; raises
    ValueError naming the part it cannot read."""
    if not selector:
        return lambda labels: True
    if isinstance(selector, dict):
        wanted = dict(selector)
        return lambda labels: all(labels.get(k) == v for k, v in wanted.items())
    tests: List[Callable[[Dict[str, str]], bool]] = []
    at = 0
    while at < len(selector):
        m = _TERM.match(selector, at)
        if m is None or m.end() == at:
            raise ValueError(f"label selector {selector!r}: cannot read from position {at}: {selector[at:]!r}")
        at = m.end()
        if m.group("absent"):
            key = m.group("absent")
            tests.append(lambda labels, k=key: k not in labels)
        elif m.group("op"):
            key, value = m.group("key"), m.group("value")
            if m.group("op") == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m.group("set"):
            key = m.group("key")
            values = {v.strip() for v in m.group("values").split(",") if v.strip()}
            if m.group("set") == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            key = m.group("key")
            tests.append(lambda labels, k=key: k in labels)
    return lambda labels: all(t(labels) for t in tests)


class Lister:
    """Reads of an informer's store: what it holds now."""

    def __init__(self, store: "Store"):
        self._store = store

    def list(self, namespace: Optional[str] = None, selector: Selector = None) -> List[Obj]:
        """The objects of `namespace` (every one when None) whose labels
        `selector` matches, in no particular order."""
        matches = label_selector(selector)
        return [o for o in self._store.list()
                if (namespace is None or o.namespace == namespace) and matches(o.labels)]

    def get(self, namespace: str, name: str) -> Optional[Obj]:
        return self._store.get(namespace, name)

    def by_index(self, index: str, value: str) -> List[Obj]:
        """The objects the informer's indexer `index` filed under `value`."""
        return self._store.by_index(index, value)
