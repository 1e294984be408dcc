"""Pieces the capture suite assembles on every rank: the default detector set, the per-rank
record, and the cross-rank agreement that keeps one rank from passing alone."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from harness.capture.detector import Detector
from harness.capture.detectors import (
    DynamoDetector,
    ObservableRegistry,
    ProcessGroupDetector,
    TransportBufferDetector,
    TransportRegistryDetector,
)
from harness.capture.events import LazyEvent
from harness.capture.gpu_detectors import (
    B12xKernelResolutionDetector,
    CudaMemoryDetector,
    TritonJitDetector,
    driver_floor,
)
from harness.core.signature import TransportSignature
from harness.errors import UsageError
from harness.schema.capture import CaptureRecord, DetectorStatus, SignatureUse
from harness.transport.b12x_backend import slab_bytes

DETECTOR_NAMES: tuple[str, ...] = (
    TransportRegistryDetector.name,
    TransportBufferDetector.name,
    ProcessGroupDetector.name,
    DynamoDetector.name,
    CudaMemoryDetector.name,
    TritonJitDetector.name,
    B12xKernelResolutionDetector.name,
)


def default_detectors(
    registry: ObservableRegistry, *, device: torch.device | str | None = None
) -> list[Detector]:
    """Every detector, in `DETECTOR_NAMES` order; those that cannot run here say why. The
    memory detector's floor is sized by the b12x slabs of the registry's transports."""
    return [
        TransportRegistryDetector(registry),
        TransportBufferDetector(registry),
        ProcessGroupDetector(),
        DynamoDetector(),
        CudaMemoryDetector(device, driver_tolerance_bytes=memory_floor(registry)),
        TritonJitDetector(),
        B12xKernelResolutionDetector(),
    ]


def memory_floor(registry: object) -> int:
    """`driver_floor` over the b12x slabs of the transports `registry` holds (a b12x registry:
    the channels a lazy creation of the same geometry would allocate); the default otherwise."""
    if getattr(registry, "backend", None) != "b12x":
        return driver_floor(())
    signatures = getattr(registry, "signatures", lambda: ())()
    return driver_floor(slab_bytes(s) for s in signatures)


def signature_uses(
    model: str,
    warmed: Iterable[TransportSignature],
    used: Iterable[TransportSignature],
) -> tuple[SignatureUse, ...]:
    """One entry per signature that was warmed or used inside capture, sorted."""
    warmed, used = set(warmed), set(used)
    return tuple(
        SignatureUse(model=model, signature=s, warmed=s in warmed, used_in_capture=s in used)
        for s in sorted(warmed | used)
    )


def capture_record(
    *,
    test: str,
    model: str,
    rank: int,
    path: str,
    warm_impl: str,
    events: Sequence[LazyEvent],
    statuses: Sequence[DetectorStatus],
    signatures: Sequence[SignatureUse] = (),
    negative_control: bool = False,
    expected_detectors: Sequence[str] = (),
    replays: int = 0,
) -> CaptureRecord:
    return CaptureRecord(
        test=test,
        model=model,
        rank=rank,
        path=path,
        warm_impl=warm_impl,
        signatures=tuple(signatures),
        events=tuple(events),
        negative_control=negative_control,
        expected_detectors=tuple(expected_detectors),
        detectors=tuple(statuses),
        replays=replays,
    )


def gather_ints(value: int, *, device: torch.device | str = "cpu") -> tuple[int, ...]:
    """Every rank's `value`, in rank order (one all_gather over the world)."""
    mine = torch.tensor([int(value)], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return tuple(int(t.item()) for t in every)


def any_rank_nonzero(value: int, *, device: torch.device | str = "cpu") -> bool:
    """Whether `value` is nonzero on any rank, every rank getting the same answer.

    One all_reduce (MAX, which gloo and NCCL both have) of a single element: gloo's ring moves
    it in a couple of hops, where an all_gather takes one hop per rank (about 6 ms against
    30 ms at 16 ranks on two cores).
    """
    flag = torch.tensor([int(value != 0)], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def int_ranges(
    values: Sequence[int], *, device: torch.device | str = "cpu"
) -> tuple[tuple[int, int], ...]:
    """(min, max) of each of `values` over the ranks, every rank getting the same answer.

    One all_reduce (MAX) of the values and their negations: max(-v) is -min(v). Each value must
    fit in int64 with its negation (|v| < 2**63). Cheaper at 16 ranks than gathering every
    rank's values (see `any_rank_nonzero`), and exact: equal on every rank iff min == max.
    """
    both = torch.tensor([*values, *(-int(v) for v in values)], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    top = [int(v) for v in both.tolist()]
    n = len(values)
    return tuple((-top[n + i], top[i]) for i in range(n))


def same_on_every_rank(data: str, *, device: torch.device | str = "cpu") -> bool:
    """Whether every rank holds the same `data`, every rank getting the same answer: its
    length and a 14-byte BLAKE2b digest of it (two 7-byte parts, so each negation fits in
    int64) agree, in one small all_reduce (`int_ranges`)."""
    raw = data.encode()
    digest = hashlib.blake2b(raw, digest_size=14).digest()
    parts = (len(raw), int.from_bytes(digest[:7], "big"), int.from_bytes(digest[7:], "big"))
    return all(lo == hi for lo, hi in int_ranges(parts, device=device))


MAX_CHECKS_AT_ONCE = 63  # one bit per check in one int64 per rank


def ranks_failing_each(
    oks: Sequence[bool], *, device: torch.device | str = "cpu"
) -> tuple[tuple[int, ...], ...]:
    """Per local check, the ranks (in the world) where it failed: every rank gets the same
    answer. When every check passed everywhere (the common case) that takes one one-element
    all_reduce; otherwise the ranks' failure masks follow in one all_gather, to name the
    failing ranks of each check (every rank saw the same failure flag, so all take it)."""
    if not 0 < len(oks) <= MAX_CHECKS_AT_ONCE:
        raise UsageError(f"1 to {MAX_CHECKS_AT_ONCE} checks at once, got {len(oks)}")
    mask = sum(1 << i for i, ok in enumerate(oks) if not ok)
    if not any_rank_nonzero(mask, device=device):
        return tuple(() for _ in oks)
    masks = gather_ints(mask, device=device)
    return tuple(
        tuple(rank for rank, mask in enumerate(masks) if mask >> i & 1) for i in range(len(oks))
    )


# `torch.testing.assert_close`'s defaults for float32, which every compared pair is cast to.
DEFAULT_RTOL, DEFAULT_ATOL = 1.3e-6, 1e-5


def first_mismatch(
    actual: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> str | None:
    """None when every pair of outputs is close, else the first mismatch as text: suites
    collect it and agree across ranks before failing.

    Close means what `torch.testing.assert_close` means for two float32 CPU tensors (same
    shape; `|a - e| <= atol + rtol * |e|` elementwise, NaN never close, equal infinities
    close; its float32 defaults when no tolerance is given), checked with `torch.isclose`:
    `torch.testing` imports `torch.distributed.tensor` and sympy, hundreds of modules and
    tens of MB on every rank, for a check that needs one elementwise op.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("give both rtol and atol, or neither")
    rtol = DEFAULT_RTOL if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        problem = _not_close(a.float().cpu(), e.float().cpu(), rtol, atol)
        if problem is not None:
            return f"output {i}: {problem}"
    return None


def _not_close(a: torch.Tensor, e: torch.Tensor, rtol: float, atol: float) -> str | None:
    if a.shape != e.shape:
        return f"shapes differ: {list(a.shape)}, expected {list(e.shape)}"
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=False)
    if bool(close.all()):
        return None
    bad = int((~close).sum())
    # NaN differences count as the greatest, so the reported index is a mismatched element.
    abs_diff = (a - e).abs().nan_to_num(nan=float("inf")).masked_fill(close, 0.0)
    rel_diff = (abs_diff / e.abs()).nan_to_num(nan=float("inf")).masked_fill(close, 0.0)
    lines = [
        "Tensor-likes are not close!",
        f"Mismatched elements: {bad} / {a.numel()} ({100.0 * bad / a.numel():.1f}%)",
        f"Greatest absolute difference: {float(abs_diff.max())} at index "
        f"{_index(abs_diff, a.shape)} (up to {atol} allowed)",
        f"Greatest relative difference: {float(rel_diff.max())} at index "
        f"{_index(rel_diff, a.shape)} (up to {rtol} allowed)",
    ]
    return "\n".join(lines)


def _index(diff: torch.Tensor, shape: torch.Size) -> tuple[int, ...]:
    flat = int(diff.reshape(-1).argmax())
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))
