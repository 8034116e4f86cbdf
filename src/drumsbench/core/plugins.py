"""One registry pattern for everything pluggable: substrates, environment kinds, fork methods, policies.

A ``Registry`` maps names to objects given as ``"module:attr"`` strings (built-ins) or found in an
entry-point group (plugins: ``[project.entry-points."drumsbench.<group>"] NAME = "pkg.mod:attr"``).
Nothing is imported until a name is asked for, so a missing optional dependency matters only when
that name is chosen, and no module registers anything by being imported. ``get`` checks the
loaded object with ``check``; ``load`` raises a one-line ``UsageError`` naming the known names.

Tests may put a class in for a name (``registry[name] = cls``); ``del`` takes it out again.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping
from importlib.metadata import entry_points
from typing import Generic, TypeVar, cast

from drumsbench.core.errors import UsageError

T = TypeVar("T")


def load_spec(spec: str) -> object:
    """The object a ``"module:attr"`` string names."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(MutableMapping[str, T], Generic[T]):
    """Names -> lazily loaded objects of one kind (see the module docstring)."""

    def __init__(self, what: str, flag: str, builtins: dict[str, str], group: str,
                 check: Callable[[object], bool], expected: str) -> None:
        self.what, self.flag, self.group, self.check, self.expected = what, flag, group, check, expected
        self._specs: dict[str, str] = dict(builtins)
        self._loaded: dict[str, T] = {}

    def _plugins(self) -> dict[str, str]:
        return {ep.name: ep.value for ep in entry_points(group=self.group) if ep.name not in self._specs}

    def names(self) -> list[str]:
        return [*self._specs, *self._plugins()]

    def get_spec(self, name: str) -> str | None:
        return self._specs.get(name) or self._plugins().get(name)

    def __getitem__(self, name: str) -> T:
        if name in self._loaded:
            return self._loaded[name]
        spec = self.get_spec(name)
        if spec is None:
            raise KeyError(name)
        obj = load_spec(spec)
        if not self.check(obj):
            raise UsageError(f"{self.flag}: {self.what} {name!r} ({spec}) is not {self.expected}")
        self._loaded[name] = cast(T, obj)  # checked just above
        return self._loaded[name]

    def load(self, name: str) -> T:
        """The object called ``name``; a one-line ``UsageError`` naming the known ones otherwise."""
        try:
            return self[name]
        except KeyError:
            raise UsageError(f"{self.flag}: unknown {self.what} {name!r}; choose one of: "
                             f"{', '.join(self.names())}") from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._loaded or self.get_spec(name) is not None)

    def __setitem__(self, name: str, obj: T) -> None:
        self._loaded[name] = obj
        self._specs.setdefault(name, f"<set at run time: {obj!r}>")

    def __delitem__(self, name: str) -> None:
        self._loaded.pop(name, None)
        del self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
