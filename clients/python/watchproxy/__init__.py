"""A client for watchproxy: List, Get and Watch with decoded error
details, and an informer that mirrors a resource into an indexed store.

    from watchproxy import Client, Informer
    client = Client("127.0.0.1:50051")
    inf = Informer(client, "pods", indexers={"node": lambda o: [o.json["spec"]["nodeName"]]})
    inf.start(); inf.wait_synced(timeout=30)
    inf.store.by_index("node", "node-7")
"""

from watchproxy.client import TLS, Client, Obj, Shard, Watch
from watchproxy.errors import DOMAIN, StatusError
from watchproxy.factory import InformerFactory, wait_for_sync
from watchproxy.handlers import EventHandler, Registration
from watchproxy.informer import Informer
from watchproxy.store import Store
from watchproxy.lister import Lister, label_selector

__all__ = ["Client", "EventHandler", "Informer", "InformerFactory", "Lister", "Obj", "Registration", "Shard",
           "Store", "StatusError", "TLS", "Watch", "DOMAIN", "label_selector", "wait_for_sync"]
