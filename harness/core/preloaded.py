"""What the forkserver's preload did that a cold rank does itself later, handed to each forked
rank: the warnings its imports raised, re-issued where a cold rank's import would have raised
them, and the modules it imported before the rank would have.

Warnings: a cold rank imports torch, pytest and the harness while pytest loads its `-p` plugins,
under the ini filters, and vLLM inside the real-tree build, under the test's; the forkserver
imported them once under the interpreter's defaults. So the preload records every warning
(`simplefilter("always")`, as WarningMessages), under the group where a cold rank imports its
module, and the rank re-issues a group with `warnings.warn_explicit` (the warning's own module
and registry) where it gets there: the heap plugin's import (`STARTUP`, the first `-p` plugin)
and the real-tree build's `import vllm` (`REAL_TREES`); the rank's filters then decide
(`filterwarnings = error` fails it as it fails a cold rank). A forked rank that loads no heap
plugin (not a pytest rank) has its startup group re-issued before its module runs.

Modules: until the rank reaches a group, that group's modules are loaded only because the
forkserver imported them (`early`): a detector that watches for a module's first import cannot
see it there (torch._dynamo, which vLLM imports, in the stand-in windows of a run that also
builds real trees).

Standard library only: the forkserver imports it before torch, every rank with its heap plugin.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

STARTUP = "startup"
REAL_TREES = "real trees"

_pending: dict[str, list[warnings.WarningMessage]] = {}
_early: dict[str, frozenset[str]] = {}


@contextlib.contextmanager
def recording() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised inside, of any category, recorded and not shown; the filters are
    restored after (what an import changes of them is the forkserver's, a rank sets its own)."""
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        yield log


def hand_over(
    warned: dict[str, list[warnings.WarningMessage]],
    modules: dict[str, frozenset[str]] | None = None,
) -> None:
    """In the forked rank: what it will re-issue, and the modules each group's imports loaded,
    by group."""
    _pending.clear()
    _pending.update({group: list(messages) for group, messages in warned.items() if messages})
    _early.clear()
    _early.update(modules or {})


def early(module: str) -> bool:
    """Whether `module` is loaded here only because the forkserver preloaded it: this rank has not
    yet reached the point where a cold rank imports it (always False in a cold rank)."""
    return any(module in names for names in _early.values())


def pending(group: str) -> bool:
    return bool(_pending.get(group))


def reissue(group: str) -> None:
    """Warn, under the caller's filters, what the preload recorded for `group`; once per
    process, as the import it stands for happens once (an `error` filter raises the first).
    From here on the group's modules are the rank's own."""
    _early.pop(group, None)
    messages = _pending.pop(group, [])
    if not messages:
        return
    modules = _modules_by_file()
    for message in messages:
        # A filter may name the warning's module (`...:DeprecationWarning:torch.jit._script`):
        # the module that warned, as `warnings.warn` derives it, with its registry.
        module = modules.get(os.path.normcase(message.filename))
        if module is None:
            warnings.warn_explicit(
                message.message, message.category, message.filename, message.lineno
            )
            continue
        warnings.warn_explicit(
            message.message,
            message.category,
            message.filename,
            message.lineno,
            module=module.__name__,
            registry=module.__dict__.setdefault("__warningregistry__", {}),
            module_globals=module.__dict__,
        )


def _modules_by_file() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and isinstance(getattr(module, "__name__", None), str):
            found.setdefault(os.path.normcase(path), module)
    return found
