"""Stores: the Store port and its backends, chosen by URL scheme."""

from storage.base import Store, StoreUnavailable
from storage.parts import PartContentReader, StorePartReader, load_part_reader
from storage.registry import open_store

__all__ = [
    "PartContentReader",
    "Store",
    "StorePartReader",
    "StoreUnavailable",
    "load_part_reader",
    "open_store",
]
