"""PartContentReader: where the bytes of stored media parts are read back (the host's file
store).

Media parts are stored once per session, content-addressed (``sha256:<hex>``), outside
the message records; a stored message refers to its parts by digest. The proxy reads the
bytes of the parts that travel as content blocks (current-turn messages only) through this
port, always with the session they belong to: a part is readable only under the session
(and so the API key's namespace) that stored it. The
default, ``StorePartReader``, reads the proxy's own part store (``Store.get_parts``). A
host with its own file store sets ``Settings.part_reader`` (``MEMORY_PROXY_PART_READER``)
to the dotted path of a class or factory that is called with the proxy's ``Store`` and
returns a reader.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from storage.base import Store
from strategies.records import SessionKey


@runtime_checkable
class PartContentReader(Protocol):
    """Reads media parts by content digest."""

    async def read_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        """Bytes and media type of each digest it has for the session ``key``; missing
        digests are left out (the part renders as a placeholder). Never answer with a part
        of another session's namespace. Raise ``storage.base.StoreUnavailable`` when the
        backing store cannot be reached."""


class StorePartReader:
    """The default reader: the proxy's own part store, one round trip for all digests."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def read_parts(
        self, key: SessionKey, digests: Sequence[str]
    ) -> dict[str, tuple[bytes, str]]:
        if not digests:
            return {}
        return await self.store.get_parts(key, list(digests))


def load_part_reader(path: str | None, store: Store) -> PartContentReader:
    """The reader named by ``"package.module:Name"`` (or ``package.module.Name``), called
    with ``store`` when it is a class or factory; the default reader when ``path`` is empty."""
    if not path:
        return StorePartReader(store)
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    target = getattr(importlib.import_module(module_name), attr)
    # a class, or a factory function; an object that already reads parts is used as is
    is_factory = isinstance(target, type) or not hasattr(target, "read_parts")
    reader = target(store) if is_factory and callable(target) else target
    if isinstance(reader, type) or not isinstance(reader, PartContentReader):
        raise TypeError(f"{path} is not a PartContentReader (it needs async read_parts)")
    return reader
