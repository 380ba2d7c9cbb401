"""Find raypipe's optional C extensions, also from a Ray job's ``--working-dir`` copy of the package.

A working-dir copy carries no build products (``*.so`` is git-ignored) and comes first on ``sys.path``,
so a plain import fails there even on a node where raypipe is installed with its extensions built. The
fallback loads the installed distribution's build of the same module (an editable install builds in its
source tree). None when neither exists: callers then run their pure-Python/torch path.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
from typing import Any

__all__ = ["load_native"]


def load_native(module: str) -> Any | None:
    """The extension module ``module`` (e.g. ``"raypipe.kernels._jpegregion"``), or None if not built."""
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    try:
        dist = importlib.metadata.distribution("raypipe")
    except importlib.metadata.PackageNotFoundError:
        return None
    roots = [str(dist.locate_file(""))]
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    if url.startswith("file://"):
        roots.insert(0, url[len("file://") :])
    rel = module.split(".")
    for root in roots:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(root, *rel[:-1], rel[-1] + suffix)
            if not os.path.isfile(path):
                continue
            spec = importlib.util.spec_from_file_location(module, path)
            loaded = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(loaded)
            except ImportError:
                continue
            return loaded
    return None
