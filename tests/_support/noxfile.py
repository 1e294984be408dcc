"""The repository's noxfile, loaded once per test process (nox refuses a session registered
twice, so every test that reads it shares this one module)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

NOXFILE = Path(__file__).resolve().parents[2] / "noxfile.py"


@functools.cache
def load_noxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dcpqual_noxfile", NOXFILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
