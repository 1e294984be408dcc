"""The contrast tree (`harness.models.builders.build_contrasts`) and the warm-code mistakes it
separates from the vendored warm (`harness.capture.broken_warms.WARM_CODE_MISTAKES`): what the
tree holds, the keys the vendored warm creates on it (exactly the keys its layers use), and the
keys each mistake creates instead, judged against `harness.capture.contrasts.contrast_keys`.
The suites run the same tree on real process groups (`suites/capture/test_contrast_tree.py`,
and each mistake in `suites/capture/test_negative_controls.py`)."""

from __future__ import annotations

import pytest
from _support.key_recorder import KeyRecorder

from harness.capture.broken_warms import WARM_CODE_MISTAKES
from harness.capture.contrasts import CAUGHT_AS, USED, contrast_keys
from harness.capture.decode import transport_layers
from harness.errors import UsageError
from harness.models.builders import CONTRAST_DCP_SIZES, build_contrasts
from harness.models.layers import DeepseekV4B12xMLAAttention, MultiHeadLatentAttention
from harness.warm.recognizers import WarmContext
from harness.warm.warmup import warm

MAX_TOKENS = 8


def _keys(dcp: int) -> dict[str, object]:
    return contrast_keys(dcp, dtype="bf16", max_tokens=MAX_TOKENS, device_type="cpu")


def _warmed(fn, dcp: int) -> set[object]:
    built = build_contrasts(dcp=dcp, max_num_batched_tokens=MAX_TOKENS)
    registry = KeyRecorder()
    fn(
        built.model,
        registry=registry,
        context=WarmContext(max_tokens=MAX_TOKENS, dcp_world_size=dcp),
        static_forward_context=built.static_forward_context,
    )
    return set(registry.created)


def test_the_tree_holds_each_contrast_the_warm_code_reads():
    built = build_contrasts(dcp=2, max_num_batched_tokens=MAX_TOKENS)
    tree = dict(built.model.named_modules())
    context = built.static_forward_context
    target, dcp1, prefixed = (tree[f"layers.{i}.self_attn"] for i in range(3))
    module_only = tree["layers.3.self_attn"]
    draft = context["model.layers.4.self_attn"]
    assert isinstance(module_only, DeepseekV4B12xMLAAttention)
    assert module_only not in context.values()
    assert all(draft is not m for m in tree.values())
    assert all(isinstance(m, MultiHeadLatentAttention) for m in (target, dcp1, prefixed, draft))
    assert (target.num_local_heads, draft.num_local_heads, prefixed.num_local_heads) == (6, 12, 24)
    assert (target.dcp_world_size, target.impl.dcp_world_size) == (2, 1)
    assert (draft.dcp_world_size, draft.impl.dcp_world_size) == (2, 1)
    assert (dcp1.dcp_world_size, dcp1.dcp_manager) == (1, None)
    assert prefixed.get_attn_backend().get_name() == "B12X_MLA_EXPERIMENTAL"
    assert not prefixed.dcp_manager.b12x  # a DCP manager of vLLM's own collectives
    # The decode step reaches the three transport users, the module-only layer included.
    names = [name for name, _, _ in transport_layers(built)]
    assert names == ["model.layers.0.self_attn", "model.layers.4.self_attn", "layers.3.self_attn"]


@pytest.mark.parametrize("dcp", [0, 1, 8, 16])
def test_the_tree_runs_only_where_every_layer_can_split_its_heads(dcp):
    with pytest.raises(UsageError, match=r"dcp in \(2, 4\)"):
        build_contrasts(dcp=dcp)


@pytest.mark.parametrize("dcp", CONTRAST_DCP_SIZES)
def test_the_vendored_warm_creates_exactly_the_keys_the_layers_use(dcp):
    keys = _keys(dcp)
    assert _warmed(warm, dcp) == {keys[name] for name in USED}


# What each mistake creates instead of the used keys (and what it must be caught for).
MISTAKEN = {
    "kimi-tp-16": ({"target", "module-only"}, "draft"),
    "no-dcp-gate": ({"dcp1", "target", "draft", "module-only"}, "dcp1"),
    "backend-prefix": ({"prefixed", "target", "draft", "module-only"}, "prefixed"),
    "kimi-dcp-from-impl": ({"module-only"}, "target"),
    "forward-context-dropped": ({"target", "module-only"}, "draft"),
    "forward-context-only": ({"target", "draft"}, "module-only"),
    "draft-skipped": ({"target", "module-only"}, "draft"),
}


@pytest.mark.parametrize("mistake", sorted(WARM_CODE_MISTAKES))
@pytest.mark.parametrize("dcp", CONTRAST_DCP_SIZES)
def test_each_warm_code_mistake_creates_the_wrong_keys(mistake, dcp):
    keys = _keys(dcp)
    created, named = MISTAKEN[mistake]
    assert _warmed(WARM_CODE_MISTAKES[mistake], dcp) == {keys[name] for name in created}
    assert CAUGHT_AS[mistake][1] == named
    assert set(MISTAKEN) == set(WARM_CODE_MISTAKES)
