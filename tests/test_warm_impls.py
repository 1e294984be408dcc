"""`--warm-impl NAME`: built-in names, production's own warm, and `package.module:function`
paths resolve to the warm callable a run qualifies, under the name the receipt records; every
bad name is one clear UsageError."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from harness.errors import UsageError
from harness.models import vllm_adapter
from harness.models.warm_impls import resolve_warm_impl
from harness.warm.warmup import warm, warm_before_kimi

FAKE = "dcpqual_fake_warm_impls"


def _full_warm(*, registry: Any, context: Any, group: Any, static_forward_context: Any) -> None:
    """A warm with exactly the keyword parameters the suites pass."""


def _any_keywords(**kwargs: Any) -> None:
    """A warm that takes whatever it is given."""


def _registry_only(*, registry: Any) -> None:
    """A warm that lacks three of the keywords the suites pass."""


class _Impls:
    """A namespace in a module: `module:_Impls.warm` is a dotted attribute path."""

    warm = staticmethod(_full_warm)


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module holding the fake warms, named `FAKE`."""
    module = types.ModuleType(FAKE)
    module.__dict__.update(
        full_warm=_full_warm, any_keywords=_any_keywords, registry_only=_registry_only, Impls=_Impls
    )
    monkeypatch.setitem(sys.modules, FAKE, module)
    return module


def test_builtin_names_resolve_to_the_builtin_warms_under_their_own_names() -> None:
    for name, fn in [("vendored", warm), ("before-kimi", warm_before_kimi)]:
        impl = resolve_warm_impl(name)
        assert (impl.name, impl.fn) == (name, fn)


def test_a_dotted_path_resolves_to_that_callable_under_the_path_given() -> None:
    impl = resolve_warm_impl("harness.warm.warmup:warm")
    assert (impl.name, impl.fn) == ("harness.warm.warmup:warm", warm)


def test_the_attribute_part_may_walk_through_a_namespace(fake_module: types.ModuleType) -> None:
    impl = resolve_warm_impl(f"{FAKE}:Impls.warm")
    assert (impl.name, impl.fn) == (f"{FAKE}:Impls.warm", _full_warm)


def test_a_callable_taking_any_keywords_is_accepted(fake_module: types.ModuleType) -> None:
    assert resolve_warm_impl(f"{FAKE}:any_keywords").fn is _any_keywords


def test_a_callable_lacking_keywords_is_refused_naming_each(
    fake_module: types.ModuleType,
) -> None:
    with pytest.raises(UsageError) as raised:
        resolve_warm_impl(f"{FAKE}:registry_only")
    assert str(raised.value) == (
        f"--warm-impl '{FAKE}:registry_only': callable lacks keyword parameter(s) "
        "context, group, static_forward_context"
    )


def test_the_module_is_everything_before_the_first_colon() -> None:
    with pytest.raises(UsageError) as raised:
        resolve_warm_impl("harness.warm.warmup:warm:again")
    assert str(raised.value) == (
        "--warm-impl 'harness.warm.warmup:warm:again': 'harness.warm.warmup' has no 'warm:again'"
    )


def test_an_unknown_name_lists_every_accepted_form() -> None:
    with pytest.raises(UsageError) as raised:
        resolve_warm_impl("nonsense")
    assert str(raised.value) == (
        "unknown --warm-impl 'nonsense'; expected vendored, before-kimi, vllm or "
        "'package.module:function'"
    )


@pytest.mark.parametrize(
    "name, message",
    [
        ("no.such.module:warm", "cannot import 'no.such.module'"),
        ("harness.warm.warmup:nope", "has no 'nope'"),
        ("harness.warm.warmup:logger", "not callable"),
        ("harness.warm.warmup:exercise", "lacks keyword parameter"),
        (":warm", "expected 'package.module:function'"),
        ("harness.warm.warmup:", "expected 'package.module:function'"),
    ],
)
def test_bad_warm_impls_are_usage_errors(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_warm_impl(name)


def test_vllm_is_production_s_warm_where_the_fork_resolves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[bool] = []
    monkeypatch.setattr(vllm_adapter, "resolve_fork", lambda: resolved.append(True))
    impl = resolve_warm_impl("vllm")
    assert (impl.name, impl.fn, resolved) == ("vllm", vllm_adapter.warm_vllm, [True])


def test_vllm_is_refused_in_one_line_where_the_fork_is_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fork's warm module made unimportable, whether or not this environment has a vLLM."""
    monkeypatch.setitem(sys.modules, vllm_adapter.WARMUP_MODULE, None)
    with pytest.raises(UsageError, match="needs the B12X vLLM fork") as raised:
        resolve_warm_impl("vllm")
    assert "\n" not in str(raised.value)
