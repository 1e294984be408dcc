"""What every on-disk model shares: frozen, unknown keys refused, and the limitation value.

A model that forbids unknown keys is what lets `dcpqual verify` reject a file that was edited to
say more than its writer wrote, and what lets the committed JSON Schemas under `schemas/` be
exact. Nothing here imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, computed_field

if TYPE_CHECKING:
    # To the type checker a derived field is the property it reads as.
    derived_field = property
else:

    def derived_field(func: Callable[[Any], Any]) -> Any:
        """A read-only property that is also written to the JSON (and shown in the JSON Schema
        as `readOnly`): pydantic's `computed_field` over the property."""
        return computed_field(property(func))


class Model(BaseModel):
    """Base of every on-disk model: immutable, no unknown keys, fields by name or alias."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def adapter_of(cls: type[Any]) -> TypeAdapter[Any]:
    """One TypeAdapter per class, built the first time it is needed (building one costs
    milliseconds; a rank record update must not pay it again)."""
    found = _ADAPTERS.get(cls)
    if found is None:
        found = _ADAPTERS[cls] = TypeAdapter(cls)
    return found


class JsonValue:
    """`to_json`/`from_json` for a pydantic dataclass, through its own cached TypeAdapter: the
    JSON form is exactly what the model validates and what its JSON Schema describes."""

    def to_json(self) -> dict[str, Any]:
        return dict(adapter_of(type(self)).dump_python(self, mode="json"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """The value `data` describes; a wrong type or an unknown key is a ValidationError."""
        value: Self = adapter_of(cls).validate_python(data)
        return value

    def to_wire(self) -> str:
        """Compact JSON text, straight from the model (what the ranks' side channel carries)."""
        return adapter_of(type(self)).dump_json(self).decode()

    @classmethod
    def from_wire(cls, raw: bytes | str) -> Self:
        """The value a peer posted; a wrong type or an unknown key is a ValidationError."""
        value: Self = adapter_of(cls).validate_json(raw)
        return value


def checked_derived(data: Any, handler: Callable[[Any], Any], name: str, what: str) -> Any:
    """For a wrap validator: `data` validated without its derived key `name`, which, when
    written, must equal what the validated fields give (a ValueError naming both otherwise)."""
    if not isinstance(data, dict) or name not in data:
        return handler(data)
    claimed = data[name]
    value = handler({k: v for k, v in data.items() if k != name})
    given = getattr(value, name)
    if claimed != given:
        raise ValueError(f"{what}: {name}={claimed!r} but the values give {given!r}")
    return value


def first_error(exc: ValidationError, top: str = "(top)") -> str:
    """The first thing a validation refused, as one line: "where: why" (`top` names the whole
    value when the problem is not in one field)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or top
    return f"{where}: {first['msg']}"


class Limitation(Model):
    """One path that did not run (or a caveat about one): a stable `key` tools match on, and
    the `text` a reviewer reads. Rendered as the line "key: text"."""

    key: str = Field(min_length=1, pattern=r"^[^:\n]+$")
    text: str

    def line(self) -> str:
        return f"{self.key}: {self.text}"

    @classmethod
    def parse(cls, line: str) -> Limitation:
        """The inverse of `line`; a line without "key: " is refused (ValueError)."""
        key, sep, text = line.partition(": ")
        if not sep:
            raise ValueError(f"a limitation reads 'key: text', got {line!r}")
        return cls(key=key, text=text)


def limitation_lines(items: Iterable[Limitation]) -> list[str]:
    return [item.line() for item in items]


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256(value: str) -> bool:
    """A lowercase sha256 hex digest, matched whole (no trailing newline)."""
    return bool(_SHA256_HEX.fullmatch(value))
