"""Stores: the Store port and its backends, chosen by URL scheme."""

from storage.base import Store, StoreUnavailable
from storage.registry import open_store

__all__ = ["Store", "StoreUnavailable", "open_store"]
