"""Import paths that moved: the old module answers with the new one's names, and a
``DeprecationWarning`` that names where to import them from now.

A module that moved keeps its old file, holding only::

    __getattr__ = moved(__name__, {"read_topic": "lakelog.spark"})

A target ``"module:NewName"`` is a name that was renamed as it moved. The targets are
imported when a name is first asked for. An old path may name a
module above its own floor: it is a user's import kept working, not a dependency of
the package, and ``tests/test_public_paths.py`` checks each one resolves."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping


def moved(old: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``old``: each name in ``names`` is looked up in the
    module it maps to, with a ``DeprecationWarning``; any other name is an
    ``AttributeError``, as in a module that never had it."""

    def __getattr__(name: str) -> object:
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        new, _, renamed = target.partition(":")
        now = renamed or name
        warnings.warn(f"{old}.{name} moved: import it from {new} "
                      f"(`from {new} import {now}`); {old}.{name} will go in a later "
                      "release", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), now)

    return __getattr__
