"""A tiny name -> factory registry, used for every swappable part of the environment.

Sandbox backends, reward functions, task sources and scripted policies are all chosen by
name from a `Registry` so that a config string selects the implementation (no if-chains),
and a new implementation is added with one decorator.
"""
from __future__ import annotations

from typing import Callable, Dict, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects (usually classes or factory functions)."""

    def __init__(self, kind: str):
        self.kind = kind  # used in error messages only ("reward function", "policy", ...)
        self._items: Dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self._items)}") from None

    def names(self) -> list:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
