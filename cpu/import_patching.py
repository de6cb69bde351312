"""Patch a module the moment it has executed: the import hook behind the
stand-ins' ``sitecustomize`` files (testing only).

SGLang binds many names at import time (``from x import f``), so a
stand-in that swaps ``x.f`` must do it before any other module imports
``x``. ``sitecustomize`` runs at every interpreter start, a scheduler's
too; it installs a meta-path finder that delegates the import of each
target module to the real finders and runs the patch right after the
module body, so every process sees one consistent module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable, Mapping


class PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds the modules named in ``patches`` through the other finders and
    wraps their loaders; ``marker`` names the hook, for idempotent installs."""

    def __init__(self, patches: Mapping[str, Callable], marker: str):
        self.patches = dict(patches)
        self.marker = marker

    def find_spec(self, fullname, path=None, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Wraps the real loader; everything but ``exec_module`` is delegated."""

    def __init__(self, inner, patch: Callable):
        self._inner = inner
        self._patch = patch

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...
        return getattr(self._inner, name)

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._patch(module)


def install(patches: Mapping[str, Callable], marker: str) -> bool:
    """Put a ``PatchingFinder`` first on ``sys.meta_path`` (once per marker).
    Returns False when a target module is already imported: too late to patch
    it consistently."""
    if any(getattr(f, "marker", None) == marker for f in sys.meta_path):
        return True
    if any(name in sys.modules for name in patches):
        return False
    sys.meta_path.insert(0, PatchingFinder(patches, marker))
    return True


def chain_next_sitecustomize(here: str) -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` after the one in ``here``:
    Python runs only the first it finds."""
    here = os.path.realpath(here)
    rest = [p for p in sys.path if os.path.realpath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
