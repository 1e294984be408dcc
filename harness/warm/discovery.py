"""Discovery: walk a model and its static forward context, return the distinct signatures.

Production warmup sees every layer twice (once as a module of the model, once as a value of the
compilation config's static forward context) and the MTP/draft head may reference a decoder's
attention module again. One module object is inspected once; one signature is warmed once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from torch import nn

from harness.core.signature import TransportSignature
from harness.warm.recognizers import Recognizer, WarmContext, qualified_names


@dataclass(frozen=True)
class DiscoveredLayer:
    name: str
    kind: str
    signature: TransportSignature


@dataclass(frozen=True)
class Discovery:
    """What discovery found: each recognized layer once, and the distinct signatures, sorted."""

    layers: tuple[DiscoveredLayer, ...]
    signatures: tuple[TransportSignature, ...]
    candidates_seen: int
    duplicates_skipped: int
    kinds_by_signature: Mapping[TransportSignature, tuple[str, ...]] = field(default_factory=dict)

    @property
    def per_kind(self) -> dict[str, int]:
        """Recognized layers per kind (e.g. {'kimi-k3': 15})."""
        return dict(sorted(Counter(layer.kind for layer in self.layers).items()))


def iter_candidates(
    model: nn.Module, static_forward_context: Mapping[str, nn.Module] | None
) -> Iterator[tuple[str, nn.Module]]:
    """Every module of the model (repeats included), then every forward-context value."""
    yield from model.named_modules(remove_duplicate=False)
    if static_forward_context:
        yield from static_forward_context.items()


class _ClassIndex:
    """Which recognizer (if any) owns a class; cached per type so discovery stays O(modules)."""

    def __init__(self, recognizers: Iterable[Recognizer]) -> None:
        self._recognizers = tuple(recognizers)
        self._cache: dict[type, Recognizer | None] = {}

    def lookup(self, cls: type) -> Recognizer | None:
        try:
            return self._cache[cls]
        except KeyError:
            names = qualified_names(cls)
            found = next(
                (r for name in names for r in self._recognizers if name in r.classes), None
            )
            self._cache[cls] = found
            return found


def discover(
    model: nn.Module,
    *,
    context: WarmContext,
    recognizers: Iterable[Recognizer],
    static_forward_context: Mapping[str, nn.Module] | None = None,
) -> Discovery:
    index = _ClassIndex(recognizers)
    seen_ids: set[int] = set()
    layers: list[DiscoveredLayer] = []
    kinds: dict[TransportSignature, set[str]] = {}
    candidates = duplicates = 0
    for name, module in iter_candidates(model, static_forward_context):
        candidates += 1
        if id(module) in seen_ids:
            duplicates += 1
            continue
        seen_ids.add(id(module))
        recognizer = index.lookup(type(module))
        if recognizer is None:
            continue
        signature = recognizer.recognize(module, context)
        if signature is None:
            continue
        layers.append(DiscoveredLayer(name=name, kind=recognizer.kind, signature=signature))
        kinds.setdefault(signature, set()).add(recognizer.kind)
    return Discovery(
        layers=tuple(layers),
        signatures=tuple(sorted(kinds)),
        candidates_seen=candidates,
        duplicates_skipped=duplicates,
        kinds_by_signature={sig: tuple(sorted(k)) for sig, k in sorted(kinds.items())},
    )
