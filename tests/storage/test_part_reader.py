"""The PartContentReader port: the default reads the store's parts; a replacement is
loaded from a dotted path and called with the store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storage.parts import PartContentReader, StorePartReader, load_part_reader
from storage.sqlite import SqliteStore
from strategies.records import SessionKey

KEY = SessionKey("ns-1", "agent", "s")


class HostFileStore:
    def __init__(self, store: object) -> None:
        self.store = store

    async def read_parts(self, key, digests):
        return {d: (b"from the host", "text/plain") for d in digests}


NOT_A_READER = object()


async def test_the_default_reader_reads_the_part_store_in_one_call(tmp_path: Path) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/parts.db")
    await store.open()
    try:
        data = b"\x89PNG bytes"
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        await store.put_parts(KEY, [(digest, data, "image/png")])
        reader = load_part_reader(None, store)

        assert isinstance(reader, StorePartReader)
        assert await reader.read_parts(KEY, [digest, "sha256:missing"]) == {
            digest: (data, "image/png")}
        assert await reader.read_parts(KEY, []) == {}
        assert await reader.read_parts(SessionKey("ns-2", "agent", "s"), [digest]) == {}
    finally:
        await store.close()


async def test_a_replacement_is_built_from_its_dotted_path_with_the_store() -> None:
    store = object()
    reader = load_part_reader("test_part_reader:HostFileStore", store)

    assert isinstance(reader, PartContentReader) and reader.store is store
    assert await reader.read_parts(KEY, ["sha256:x"]) == {"sha256:x": (b"from the host",
                                                                  "text/plain")}


def test_a_path_to_something_that_reads_no_parts_is_refused() -> None:
    with pytest.raises(TypeError, match="not a PartContentReader"):
        load_part_reader("test_part_reader.NOT_A_READER", object())
