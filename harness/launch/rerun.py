"""`dcpqual run --rerun-failed BUNDLE`: the failed tests of an earlier run, at its geometry.

The ranks run with pytest's cache plugin off (16 ranks would race on one .pytest_cache), so
`--last-failed` cannot exist; the bundle is the cache instead. Only a bundle that verifies is
used: its receipt is the one the writer wrote, so the node ids and geometry are the run's own.
Node ids are relative to the rank's pytest rootdir, which the receipt records; they are made
absolute so the rerun works from any working directory.

A bundle that verifies is still only as trustworthy as whoever could write it (unsigned, its
hashes are its own), so a rerun takes from it nothing that chooses code to import: the rootdir
must be absolute (a relative one would resolve against wherever the rerun is typed), every node
id must lie under it, and the run's `-p NAME` plugins are never taken from the receipt (no
record holds them, so verify cannot hold the receipt to them); a rerun names its own plugins
after `--`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import UsageError

if TYPE_CHECKING:
    from harness.schema.receipt import HashSeed


@dataclass(frozen=True)
class RerunSettings:
    """The bundle's run options a rerun keeps unless flags override them (RunOptions names;
    `nproc_per_node` as asked for, resolved again like a flag's text)."""

    nproc_per_node: str
    nnodes: int
    backend: str
    tp: int
    dcp: int
    warm_impl: str


@dataclass(frozen=True)
class RerunSource:
    """What a rerun takes from the bundle: its run options, the failed tests as targets, and
    each node's string-hash seed (its ranks hash as the run's did unless a seed is given)."""

    bundle: Path
    settings: RerunSettings
    targets: tuple[str, ...]
    hash_seeds: dict[int, HashSeed] = field(default_factory=dict)


def plugin_args(pytest_args: Sequence[str]) -> tuple[str, ...]:
    """The `-p NAME` / `-pNAME` arguments among pytest arguments, as `-p NAME` pairs (what a
    rerun may be given after `--`: ranks load no installed plugin unless it is named)."""
    found: list[str] = []
    args = iter(pytest_args)
    for arg in args:
        if arg == "-p":
            name = next(args, None)
            if name is not None:
                found += ["-p", name]
        elif arg.startswith("-p") and not arg.startswith("--"):
            found += ["-p", arg[2:]]
    return tuple(found)


def only_plugins(pytest_args: Sequence[str]) -> bool:
    """Whether `pytest_args` are nothing but `-p NAME` / `-pNAME` arguments."""
    args = iter(pytest_args)
    for arg in args:
        if arg == "-p":
            if next(args, None) is None:
                return False
        elif not (arg.startswith("-p") and not arg.startswith("--")):
            return False
    return True


def contained_nodeid(nodeid: str, rootdir: Path) -> str:
    """`nodeid` made absolute under `rootdir`; UsageError when its file is not inside it."""
    path = nodeid.partition("::")[0]
    where = (rootdir / path).resolve()
    if not where.is_relative_to(rootdir.resolve()):
        raise UsageError(
            f"--rerun-failed: the failed test {nodeid!r} is not under the run's rootdir "
            f"{rootdir}; a rerun runs only the tests of the checkout that ran"
        )
    return absolute_nodeid(nodeid, rootdir)


def absolute_nodeid(nodeid: str, rootdir: Path | None) -> str:
    """`suites/x/test_y.py::t[p]` -> `<rootdir>/suites/x/test_y.py::t[p]` (unchanged if already
    absolute or when the rootdir is unknown)."""
    path, sep, rest = nodeid.partition("::")
    if rootdir is None or Path(path).is_absolute():
        return nodeid
    return f"{rootdir / path}{sep}{rest}"


def rerun_source(bundle: Path) -> RerunSource:
    """Read BUNDLE's failed node ids and geometry; UsageError (one line) when it cannot serve."""
    from harness.evidence.verify import verify_bundle
    from harness.schema.layout import RECEIPT_NAME
    from harness.schema.receipt import Receipt

    result = verify_bundle(bundle)  # UsageError when it is not a folder
    if not result.ok:
        raise UsageError(
            f"--rerun-failed {bundle}: the bundle does not verify ({result.problems[0]}); "
            "run `dcpqual verify` on it"
        )
    receipt = Receipt.model_validate_json((Path(bundle) / RECEIPT_NAME).read_text())
    nodeids = [f.nodeid for f in receipt.failed_tests]
    if not nodeids and receipt.root_cause is not None and receipt.root_cause.test:
        nodeids = [receipt.root_cause.test]  # a receipt written before the failed-test list
    if not nodeids:
        raise UsageError(f"--rerun-failed {bundle}: its receipt names no failed test to rerun")
    root = Path(receipt.run.rootdir) if receipt.run.rootdir else None
    if root is None or not root.is_absolute():
        raise UsageError(
            f"--rerun-failed {bundle}: its receipt records no absolute rootdir "
            f"({receipt.run.rootdir!r}), so its tests cannot be found safely"
        )
    g = receipt.geometry
    settings = RerunSettings(
        nproc_per_node=str(g.nproc_per_node),
        nnodes=g.nnodes,
        backend=g.backend,
        tp=g.tp,
        dcp=g.dcp,
        warm_impl=receipt.warm_impl,
    )
    return RerunSource(
        bundle=Path(bundle),
        settings=settings,
        targets=tuple(dict.fromkeys(contained_nodeid(n, root) for n in nodeids)),
        hash_seeds={s.node: s for s in receipt.hash_seeds or ()},
    )
