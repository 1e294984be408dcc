"""The runtime requirement files the image installs, with the lock's decisions applied.

`python -m harness.image.requirements --torch V --triton V --pins "A==1 B[x]==2" --flashinfer SPEC
--fork FILE --harness DIR --out DIR` (run inside the image build; standard library only, because
it runs before the harness's own dependencies are installed) writes to DIR:

- `constraints.txt`: torch and Triton at the foundation's versions (nothing may move them);
- `pins.txt`: the lock's `python_pins`, installed as given;
- `vllm-runtime.txt`: the fork's runtime requirements (nested `-r` files inlined) with every line
  for torch, Triton, a pinned distribution, or flashinfer-python when b12x comes from it, turned
  into a comment that says the lock dropped it. The fork pins nvidia-cutlass-dsl 4.7.1, b12x
  1.5.1 pins 4.8.0; left to pip the install is unsatisfiable, so the lock decides;
- `flashinfer.txt`: the flashinfer-python build b12x comes from (empty when from its repository);
- `harness.txt`: the harness checkout itself.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_INCLUDE = re.compile(r"\s*(?:-r|--requirement)(?:\s+|=)(\S+)\s*$")


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name, extras dropped."""
    return re.sub(r"[-_.]+", "-", name.partition("[")[0]).lower()


def requirement_name(line: str) -> str | None:
    """The distribution a requirement line names; None for comments, options and blank lines."""
    text = line.split("#", 1)[0].strip()
    if not text or text.startswith("-"):
        return None
    found = _NAME.match(text)
    return normalize(found.group(1)) if found else None


def inline(path: Path, seen: tuple[Path, ...] = ()) -> list[str]:
    """The lines of a requirements file with nested `-r FILE` inlined (relative to the file)."""
    path = path.resolve()
    if path in seen:
        raise ValueError(f"{path} includes itself")
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        include = _INCLUDE.match(line)
        if include:
            lines.append(f"# from {include.group(1)}")
            lines += inline(path.parent / include.group(1), (*seen, path))
        else:
            lines.append(line)
    return lines


def filter_lines(lines: Sequence[str], drop: set[str]) -> list[str]:
    """`lines` with every requirement of a distribution in `drop` commented out, saying why."""
    out = []
    for line in lines:
        name = requirement_name(line)
        if name is not None and name in drop:
            out.append(f"# dropped, the lock decides {name}: {line.strip()}")
        else:
            out.append(line)
    return out


def render(
    fork: Path,
    *,
    torch: str,
    triton: str,
    pins: Sequence[str],
    flashinfer: str,
    harness: str,
) -> dict[str, str]:
    """File name -> text of every file this module writes (pure apart from reading `fork`)."""
    for pin in pins:
        if "==" not in pin or requirement_name(pin) is None:
            raise ValueError(f"pin {pin!r} is not NAME==VERSION")
    drop = {"torch", "triton", *(n for p in pins if (n := requirement_name(p)))}
    if flashinfer:
        if "==" not in flashinfer:
            raise ValueError(f"flashinfer {flashinfer!r} is not flashinfer-python==VERSION")
        drop.add("flashinfer-python")
    return {
        "constraints.txt": f"torch=={torch}\ntriton=={triton}\n",
        "pins.txt": "".join(f"{p}\n" for p in pins),
        "vllm-runtime.txt": "\n".join(filter_lines(inline(fork), drop)) + "\n",
        "flashinfer.txt": f"{flashinfer}\n" if flashinfer else "",
        "harness.txt": f"{harness}\n",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.image.requirements")
    parser.add_argument("--torch", required=True)
    parser.add_argument("--triton", required=True)
    parser.add_argument("--pins", required=True, help="NAME==VERSION, space separated")
    parser.add_argument("--flashinfer", default="", help="flashinfer-python==V, or empty")
    parser.add_argument("--fork", required=True, type=Path, help="the fork's runtime requirements")
    parser.add_argument("--harness", required=True, help="the harness checkout to install")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        files = render(
            args.fork,
            torch=args.torch,
            triton=args.triton,
            pins=args.pins.split(),
            flashinfer=args.flashinfer,
            harness=args.harness,
        )
    except (OSError, ValueError) as exc:
        print(f"requirements: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
