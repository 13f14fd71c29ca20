"""Named functions selected from config: rewards, advantage estimators, KL estimators, loss
aggregations, group filters. A method adds its own entry with the registry's decorator; nothing in the
core changes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ragrl.errors import RagrlError

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """``register(name)`` decorates a function; ``get(name)`` looks it up, and an unknown name is a
    ``RagrlError`` listing the registered ones. Reads like a read-only mapping of name → function."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            old = self._fns.get(name)
            if old is not None and old is not fn:
                raise RagrlError(f"{self.kind} {name!r} is already registered (by {old.__module__})")
            self._fns[name] = fn
            return fn

        return decorate

    def get(self, name: str, *, key: str | None = None) -> F:
        """The entry registered as ``name``; ``key`` (a config key) prefixes the error."""
        try:
            return self._fns[name]
        except KeyError:
            where = f"{key}: " if key else ""
            known = ", ".join(self.names())
            raise RagrlError(f"{where}unknown {self.kind} {name!r}; registered: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __getitem__(self, name: str) -> F:
        return self._fns[name]

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)
