"""Which warm implementation a run qualifies (`dcpqual run --warm-impl NAME`).

`vendored` (default) and `before-kimi` are built in; `vllm` runs the B12X fork's own
`kernel_warmup` on vLLM's real trees (`harness.models.vllm_adapter`; refused where the fork is
absent); `package.module:function` names any callable with the signature of
`harness.warm.warmup.warm` (keyword-only registry, context, group, static_forward_context), the
seam through which a GPU node points the suites at the production implementation in its image.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from harness.core.choices import VLLM_WARM_IMPL
from harness.errors import UsageError
from harness.warm.warmup import WarmReport, warm, warm_before_kimi

WarmFn = Callable[..., WarmReport]

BUILTIN_IMPLS: dict[str, WarmFn] = {"vendored": warm, "before-kimi": warm_before_kimi}
VLLM_IMPL = VLLM_WARM_IMPL
REQUIRED_KEYWORDS = ("registry", "context", "group", "static_forward_context")


@dataclass(frozen=True)
class WarmImpl:
    name: str
    fn: WarmFn


def _load_dotted(spec: str) -> WarmFn:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"--warm-impl {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--warm-impl {spec!r}: cannot import {module_name!r}: {exc}") from None
    fn: object = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise UsageError(f"--warm-impl {spec!r}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise UsageError(f"--warm-impl {spec!r}: {attr!r} is not callable")
    params = inspect.signature(fn).parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [k for k in REQUIRED_KEYWORDS if k not in params and not has_var_kw]
    if missing:
        raise UsageError(
            f"--warm-impl {spec!r}: callable lacks keyword parameter(s) {', '.join(missing)}"
        )
    return fn


def resolve_warm_impl(name: str) -> WarmImpl:
    """Built-in name or dotted path -> the warm callable; bad names are a UsageError."""
    if name == VLLM_IMPL:
        from harness.models.vllm_adapter import resolve_fork, warm_vllm

        resolve_fork()  # fail closed, one line, where the fork is absent
        return WarmImpl(name=name, fn=warm_vllm)
    if name in BUILTIN_IMPLS:
        return WarmImpl(name=name, fn=BUILTIN_IMPLS[name])
    if ":" in name:
        return WarmImpl(name=name, fn=_load_dotted(name))
    raise UsageError(
        f"unknown --warm-impl {name!r}; expected {', '.join(BUILTIN_IMPLS)}, {VLLM_IMPL} or "
        "'package.module:function'"
    )
