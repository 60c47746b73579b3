"""Objects accumulators share until they need one of their own: most of a fleet's
accumulators hold the same empties, engine sets and key tuples, and a fleet holds thousands."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from exporter.core.snapshot import SeriesKey

K = TypeVar("K")
V = TypeVar("V")


def writable(mapping: Mapping[K, V]) -> dict[K, V]:
    """`mapping` itself where it is a dict of its own, else a dict of its items."""
    return mapping if isinstance(mapping, dict) else dict(mapping)


class NoItems(Mapping[Any, Any]):
    """The empty mapping accumulators share until they hold something: read-only, so a write
    not made through a dict of their own fails loudly."""

    __slots__ = ()

    def __getitem__(self, key: object) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __reduce__(self) -> str:
        return "NO_ITEMS"  # pickled by name: unpickled as the shared one


NO_ITEMS: Mapping[Any, Any] = NoItems()


@functools.lru_cache(maxsize=1024)
def shared_keys(keys: tuple[SeriesKey, ...]) -> tuple[SeriesKey, ...]:
    """One tuple for equal tuples of series keys (targets serving one model)."""
    return keys


@functools.lru_cache(maxsize=1024)
def shared_engines(names: frozenset[str]) -> frozenset[str]:
    """One frozenset for equal sets of engine names."""
    return names
