"""torchrun's error files (TORCHELASTIC_ERROR_FILE, under the out folder's torchrun/), read one
way by the launcher, which names the failure they report, and by verify, which holds a root
cause the receipt says torchrun reported to the bundle's own copy of them.
"""

from __future__ import annotations

from pathlib import Path

from harness.evidence.run_context import TorchrunFailure
from harness.jsonfile import read_json
from harness.schema.layout import TORCHRUN_DIR
from harness.schema.rank_record import note_in


def parse_error_file(path: Path, root: Path) -> TorchrunFailure | None:
    """Read a TORCHELASTIC_ERROR_FILE in torch's format; None when absent or not that format."""
    try:
        data = read_json(path)
        message = data["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if isinstance(message, str):
        return TorchrunFailure(None, message, float(data.get("timestamp", 0)), _rel(path, root))
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    note = note_in(data)
    try:
        return TorchrunFailure(
            rank=None if note is None else note.rank,
            message=str(message.get("message", "")),
            time=note.time if note is not None else float(extra.get("timestamp", 0)),
            file=_rel(path, root),
        )
    except (AttributeError, TypeError, ValueError):
        return None


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def first_torchrun_error(out_dir: Path) -> TorchrunFailure | None:
    """The earliest error file under torchrun/ (every node's agent and worker files)."""
    found = [
        err
        for path in sorted((out_dir / TORCHRUN_DIR).rglob("*.json"))
        if (err := parse_error_file(path, out_dir)) is not None
    ]
    if not found:
        return None
    return min(found, key=lambda e: (e.time, e.rank is None, e.rank or 0))
