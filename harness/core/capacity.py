"""The token capacity the fork's B12X DCP runtime looks its transports up by (torch-free).

Every fork registry keys a transport by its exact token capacity, so a warm that sizes its
transports by another number than the runtime warms keys the runtime never asks for and misses
the ones it does: a pool miss in capture. What the runtime uses depends on the fork's era
(`../shared/fork.md` section 1):

- `engine` (era A, the seed change's time, the one the vendored warm is faithful to): the
  capacity the engine gives the layer (`max_num_batched_tokens` for the stand-ins, the manager's
  `max_num_tokens` for vLLM's trees), clamped by `VLLM_DCP_A2A_MAX_TOKENS` when it is set.
- `decode-cap` (eras C and D): `B12X_DECODE_TOKEN_CAP = 8` (or `VLLM_DCP_A2A_MAX_TOKENS`), never
  more than the engine's capacity.

The default is `engine` with the variable unset, so the default geometry's runtime capacity and
the seed's warm agree, as they did in production then; the other policies and the variable are
the cases where they do not (see the README's qualification table).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from harness.errors import UsageError

B12X_DECODE_TOKEN_CAP = 8
TOKEN_CAP_ENV = "VLLM_DCP_A2A_MAX_TOKENS"
CAPACITY_POLICIES: tuple[str, ...] = ("engine", "decode-cap")
DEFAULT_CAPACITY_POLICY = "engine"


@dataclass(frozen=True)
class RuntimeCapacity:
    """How the runtime sizes (and looks up) a B12X DCP transport; see the module doc."""

    policy: str = DEFAULT_CAPACITY_POLICY
    env_cap: int | None = None  # VLLM_DCP_A2A_MAX_TOKENS, None when unset

    def __post_init__(self) -> None:
        if self.policy not in CAPACITY_POLICIES:
            raise UsageError(
                f"unknown token capacity policy {self.policy!r}; expected one of "
                f"{', '.join(CAPACITY_POLICIES)}"
            )
        if self.env_cap is not None and (
            not isinstance(self.env_cap, int) or isinstance(self.env_cap, bool) or self.env_cap < 1
        ):
            raise UsageError(f"{TOKEN_CAP_ENV} must be a positive integer, got {self.env_cap!r}")

    @property
    def cap(self) -> int | None:
        """The cap the runtime applies, None where it takes the engine's capacity as is."""
        if self.env_cap is not None:
            return self.env_cap
        return B12X_DECODE_TOKEN_CAP if self.policy == "decode-cap" else None

    def tokens(self, engine_tokens: int) -> int:
        """The token capacity of the transport a layer with `engine_tokens` uses at runtime."""
        cap = self.cap
        return engine_tokens if cap is None else min(engine_tokens, cap)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, policy: str = DEFAULT_CAPACITY_POLICY
    ) -> RuntimeCapacity:
        """The runtime capacity under `env` (default: this process's environment)."""
        raw = (os.environ if env is None else env).get(TOKEN_CAP_ENV, "").strip()
        if not raw:
            return cls(policy)
        try:
            value = int(raw)
        except ValueError:
            raise UsageError(f"{TOKEN_CAP_ENV} must be a positive integer, got {raw!r}") from None
        return cls(policy, value)

    def describe(self) -> str:
        cap = self.cap
        limit = "the engine's capacity" if cap is None else f"at most {cap} tokens"
        env = f", {TOKEN_CAP_ENV}={self.env_cap}" if self.env_cap is not None else ""
        return f"{self.policy} ({limit}{env})"


# The seed's era with the variable unset: what every default in the harness assumes.
SEED_RUNTIME = RuntimeCapacity()
