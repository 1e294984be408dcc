"""The launcher's record of a run's launch, kept in the bundle as files of their own.

No rank file records how torchrun ended: a rank that wrote a passing record may still have
crashed on its way out, and a node's torchrun may have failed while node 0's passed. The
receipt's `run.exit_code` and `run.timed_out` therefore follow from the launcher's record
(`rules.launched_outcome`), and that record is in the bundle, covered by its hashes:

- `launch.json`: node 0's `Launch` (how its torchrun ended), written by the evidence writer;
- `nodes/node-KK.json`: with several nodes, each node's marker, written by that node's own
  launcher when its torchrun exited.

`launch_record_problems` holds the receipt to those files, so a receipt cannot drop its launch
record (every launcher run has one; only the one-rank smoke's receipt has none, and it is held
to the smoke's own `smoke/result.json`, and its rank record to the checks that result gives,
whether or not it also states a launch, which it must not), edit it alone, or leave out a node
whose marker says it failed. These files are the launcher's, not the ranks': a forger who
rewrites one together with the receipt is caught only by a signature (harness.evidence.signing).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from harness.jsonfile import read_json
from harness.schema.base import first_error
from harness.schema.launch import Launch, NodeState
from harness.schema.layout import (
    LAUNCH_NAME,
    NODES_DIR,
    RECEIPT_NAME,
    RECORDS_DIR,
    SMOKE_RESULT_NAME,
    node_dir_name,
)
from harness.schema.rank_record import RankRecord, rank_record_path
from harness.schema.receipt import Receipt
from harness.schema.smoke import Smoke, SmokeResult, smoke_tests


def marker_path(out_dir: Path, node_rank: int) -> Path:
    return out_dir / NODES_DIR / f"{node_dir_name(node_rank)}.json"


def read_marker(out_dir: Path, node_rank: int) -> NodeState | None:
    """Node `node_rank`'s marker; None while there is none, or none that is whole and valid
    (a marker being replaced, or a folder another tool wrote to)."""
    try:
        return NodeState.model_validate(read_json(marker_path(out_dir, node_rank)))
    except (OSError, ValueError):
        return None


def launch_record_bytes(launch: Launch) -> bytes:
    """`launch.json` as the writer writes it: the record, keys sorted, one trailing newline."""
    return (json.dumps(launch.model_dump(mode="json"), indent=2, sort_keys=True) + "\n").encode()


def launch_record_problems(bundle: Path, receipt: Receipt) -> list[str]:
    """One line per way the receipt's launch record disagrees with the bundle's files."""
    return [*_launch_problems(bundle, receipt), *_node_problems(bundle, receipt)]


def _launch_problems(bundle: Path, receipt: Receipt) -> list[str]:
    extra = receipt.run.extra
    path = bundle / LAUNCH_NAME
    if extra.smoke is not None:  # the smoke starts no torchrun: it has no launch to record
        found = []
        if extra.launch is not None:
            found.append(
                f"{RECEIPT_NAME}: run.extra.smoke beside run.extra.launch: the smoke starts no "
                "torchrun, and a run that records its launch is not the smoke"
            )
        if path.exists() or path.is_symlink():
            found.append(f"{LAUNCH_NAME}: a smoke's bundle has no launch")
        return found + _smoke_problems(bundle, receipt, extra.smoke)
    if extra.launch is None:
        return [
            f"{RECEIPT_NAME}: run.extra.launch is absent: a run's exit code and timeout follow "
            "from the launcher's record of its launch, and this receipt has none"
        ]
    if not path.exists() and not path.is_symlink():
        return [f"{LAUNCH_NAME}: missing: the receipt's run.extra.launch has no record to match"]
    try:
        kept = Launch.model_validate(read_json(path))
    except OSError as exc:
        return [f"{LAUNCH_NAME}: not a launch record: {exc}"]
    except ValidationError as exc:
        return [f"{LAUNCH_NAME}: not a launch record: {first_error(exc)}"]
    except ValueError as exc:
        return [f"{LAUNCH_NAME}: not a launch record: {exc}"]
    if kept == extra.launch:
        return []
    return [
        f"{RECEIPT_NAME}: run.extra.launch is not what {LAUNCH_NAME} records (exit code "
        f"{kept.exit_code}, timed out {kept.timed_out})"
    ]


def _smoke_problems(bundle: Path, receipt: Receipt, smoke: Smoke) -> list[str]:
    """A receipt without a launch must be the smoke's (which starts no torchrun): one rank on
    one node, with the smoke's own result in the bundle saying the machine and failures the
    receipt states, so calling a torchrun run a smoke does not switch its launch checks off."""
    g = receipt.geometry
    if (g.world_size, g.nnodes) != (1, 1):
        return [
            f"{RECEIPT_NAME}: run.extra.smoke on a run of {g.world_size} rank(s) on {g.nnodes} "
            "node(s): the smoke is one rank, and every other run records its launch"
        ]
    path = bundle / SMOKE_RESULT_NAME
    if not path.exists() and not path.is_symlink():
        return [f"{SMOKE_RESULT_NAME}: missing: the receipt's run.extra.smoke has no result"]
    try:
        result = SmokeResult.from_json(read_json(path))
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        shown = first_error(exc) if isinstance(exc, ValidationError) else str(exc)
        return [f"{SMOKE_RESULT_NAME}: not a smoke result: {shown}"]
    if (result.machine, result.failures) != (smoke.machine, smoke.failures):
        return [f"{RECEIPT_NAME}: run.extra.smoke is not what {SMOKE_RESULT_NAME} records"]
    return _smoke_record_problems(bundle, result)


def _smoke_record_problems(bundle: Path, result: SmokeResult) -> list[str]:
    """The smoke's rank record holds its checks, one test each, with the outcomes its result
    gives (`smoke_tests`): the verdict is derived from that record, so a one-rank torchrun run
    that calls itself the smoke (to drop its launch record and the exit code it gives) is
    held to a smoke result its own tests are not."""
    path = rank_record_path(bundle / RECORDS_DIR, 0)
    if not path.exists() and not path.is_symlink():
        return []  # the ranks check reports the rank killed
    try:
        record = RankRecord.read(path)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []  # reported by the ranks check
    stated = [(t.nodeid, t.outcome) for t in record.tests]
    expected = [(t.nodeid, t.outcome) for t in smoke_tests(result)]
    if stated == expected and list(record.collected) == [n for n, _ in expected]:
        return []
    where = path.relative_to(bundle).as_posix()
    found = next(
        (
            f"test {i} is {a[0]} {a[1]} where it gives {b[0]} {b[1]}"
            for i, (a, b) in enumerate(zip(stated, expected, strict=False))
            if a != b
        ),
        f"{len(stated)} tests (of {len(record.collected)} collected) where it gives "
        f"{len(expected)}",
    )
    return [f"{where}: not the smoke's checks that {SMOKE_RESULT_NAME} gives: {found}"]


def _node_problems(bundle: Path, receipt: Receipt) -> list[str]:
    """With several nodes, the receipt names every node's marker (null for a node that left
    none) and each is the marker that node wrote into the bundle."""
    nnodes, nodes = receipt.geometry.nnodes, receipt.run.extra.nodes
    if nnodes == 1:
        return []
    if nodes is None:
        return [
            f"{RECEIPT_NAME}: run.extra.nodes is absent: a {nnodes}-node run records every "
            "node's marker"
        ]
    expected = {str(k) for k in range(nnodes)}
    problems = [
        f"{RECEIPT_NAME}: run.extra.nodes has {key!r}, not a node of this {nnodes}-node run"
        for key in sorted(set(nodes) - expected)
    ]
    for node in range(nnodes):
        key = str(node)
        if key not in nodes:
            problems.append(
                f"{RECEIPT_NAME}: run.extra.nodes has no entry for node {node} (a node that "
                "left no marker is recorded as null)"
            )
            continue
        kept, stated = read_marker(bundle, node), nodes[key]
        if stated is not None and (stated.node_rank, stated.nnodes) != (node, nnodes):
            problems.append(
                f"{RECEIPT_NAME}: run.extra.nodes[{key!r}] is the marker of node "
                f"{stated.node_rank} of {stated.nnodes}, not of node {node} of {nnodes}"
            )
        elif stated != kept:
            where = marker_path(Path(), node).as_posix()
            said = "none" if kept is None else f"state {kept.state}, exit code {kept.exit_code}"
            problems.append(
                f"{RECEIPT_NAME}: run.extra.nodes[{key!r}] is not the marker {where} holds ({said})"
            )
    return problems
