"""The stand-in of vLLM's `MLADCPManager`: what one attention layer asks its DCP collectives for.

vLLM's layers build the manager at construction, with their own local heads, head dims, query
and output dtypes, a token capacity and the comm backend (`vllm/v1/attention/ops/dcp.py`), and
call `dcp_manager.query_gather(q)` and `dcp_manager.combine(out, lse)` in their decode forward.
The stand-in keeps exactly those values and routes both calls to whatever `DCPTransportHook` the
decode step binds, so the step learns what the layer asks for from the calls themselves and
never from the warm code's recognizers. A manager built for the B12X transport (`b12x=True`)
is a B12X DCP user; any other manager stands for vLLM's own NCCL/Triton collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from harness.core.choices import KV_CACHE_DTYPES as KV_CACHE_DTYPES  # re-exported


class DCPTransportHook(Protocol):
    """Carries out a manager's two DCP calls (the decode step binds one per run)."""

    def query_gather(self, manager: DCPManager, query: torch.Tensor) -> torch.Tensor: ...

    def combine(
        self, manager: DCPManager, partial_output: torch.Tensor, partial_lse: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass(eq=False)
class DCPManager:
    """Per-layer DCP collectives, fixed at the layer's construction (see the module doc).

    Dtypes are torch dtypes, as vLLM passes them; `max_num_tokens` is the capacity the layer's
    transport is sized for.
    """

    layer_name: str
    num_heads: int  # local heads per rank
    query_head_dim: int
    output_head_dim: int
    query_dtype: torch.dtype
    output_dtype: torch.dtype
    max_num_tokens: int
    comm_backend: str
    b12x: bool
    hook: DCPTransportHook | None = field(default=None, repr=False)

    def _bound(self) -> DCPTransportHook:
        if self.hook is None:
            raise RuntimeError(f"{self.layer_name}: no DCP transport bound to this layer")
        return self.hook

    def query_gather(self, query: torch.Tensor) -> torch.Tensor:
        return self._bound().query_gather(self, query)

    def combine(self, partial_output: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
        return self._bound().combine(self, partial_output, partial_lse)


def quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """Whether the layers quantize their DCP queries under this KV cache dtype: an fp8 cache,
    except `fp8_ds_mla` (whose queries stay in the model dtype)."""
    return kv_cache_dtype.startswith("fp8") and kv_cache_dtype != "fp8_ds_mla"


def kimi_query_dtype(kv_cache_dtype: str, dtype: torch.dtype) -> torch.dtype:
    """Kimi-K3's DCP query dtype: fp8 e4m3 under a quantized KV cache, except `fp8_ds_mla`."""
    return torch.float8_e4m3fn if quantized_kv_cache(kv_cache_dtype) else dtype
