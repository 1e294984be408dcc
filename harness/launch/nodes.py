"""Multi-node runs: how several `dcpqual run` agents share one out folder and one bundle.

Design: every node is given the same `--out`, on a folder all nodes can reach (trivially so for
two agents on one host; NFS or similar across hosts). Node 0 owns the folder: it refuses a
non-empty one, creates it and writes `nodes/node-00.json` ("started"). Other nodes touch nothing
until that marker appears (so node 0's emptiness check cannot trip over them), then run their
ranks, which write `records/`, `junit/`, `stacks/` under their global rank numbers and torchrun
logs under `torchrun/node-KK/`. When its torchrun exits, each node rewrites its marker as
"finished" with torchrun's exit status. Node 0 waits for every node's "finished" marker, then
writes the one bundle (all ranks) and verifies it; the other nodes wait for `receipt.json` and
exit with its verdict, so every node's exit code tells the same story.

When node 0 dies (SIGKILL, a lost host) it writes no bundle. Node 1 then writes it in node 0's
place, once no receipt came within its wait, node 0's marker never said finished, and it could
take the exclusive lock node 0's launcher holds on the folder for its whole run (`take_over`):
the receipt fails the run and says why (`run.extra.node_zero_gone`, the `node-0` limitation).
The lock is what keeps a late node 0 and node 1 from both writing one, so it holds where every
node shares the folder's locks: one host, or a network file system that carries them.

Without a shared folder node K never sees node 0's marker and stops with a clear error.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from harness.atomic import atomic_write_text
from harness.errors import UsageError
from harness.evidence.launch_record import marker_path, read_marker
from harness.jsonfile import read_json
from harness.schema.base import first_error
from harness.schema.launch import Launch, NodeState
from harness.schema.layout import RECEIPT_NAME, SUMS_NAME
from harness.schema.receipt import Receipt


def started_marker(node_rank: int, nnodes: int, endpoint: str, started_at: str) -> NodeState:
    """This node's marker before its torchrun starts."""
    return NodeState(
        node_rank=node_rank,
        nnodes=nnodes,
        rdzv_endpoint=endpoint,
        state="started",
        hostname=socket.gethostname(),
        pid=os.getpid(),
        started_at=started_at,
    )


def finished_marker(started: NodeState, launch: Launch) -> NodeState:
    """The same node's marker once its torchrun has exited, with how it ended."""
    return started.model_copy(
        update={
            "state": "finished",
            "exit_code": launch.exit_code,
            "timed_out": launch.timed_out,
            "finished_at": launch.finished_at,
            "zygote": launch.zygote,
            "leftovers": list(launch.leftovers),
        }
    )


def write_marker(out_dir: Path, marker: NodeState) -> None:
    """Never through a link the ranks left in the shared folder (OSError)."""
    text = json.dumps(marker.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    path = marker_path(out_dir, marker.node_rank)
    atomic_write_text(path, text, fsync=False, within=out_dir)


def join_out_dir(out_dir: Path, *, nnodes: int, endpoint: str, wait_s: float) -> Path:
    """Node K > 0: wait for node 0 to own `out_dir` for this very rendezvous, then join it."""
    out_dir = out_dir.absolute()
    deadline = time.monotonic() + wait_s
    while True:
        if (out_dir / RECEIPT_NAME).exists():
            raise UsageError(f"--out {out_dir} already holds a finished bundle")
        marker = read_marker(out_dir, 0)
        if marker is not None:
            if (marker.rdzv_endpoint, marker.nnodes) != (endpoint, nnodes):
                raise UsageError(
                    f"--out {out_dir} belongs to another run (node 0 uses rendezvous "
                    f"{marker.rdzv_endpoint} with {marker.nnodes} nodes, this node "
                    f"{endpoint} with {nnodes})"
                )
            if marker.state != "started":
                raise UsageError(f"--out {out_dir}: node 0 of that run already finished")
            return out_dir
        if time.monotonic() >= deadline:
            raise UsageError(
                f"--out {out_dir}: node 0 did not start a run there within {wait_s:g}s; "
                "multi-node runs need --out on a folder shared by every node, and node 0 running"
            )
        time.sleep(0.2)


def wait_for_nodes(out_dir: Path, nnodes: int, wait_s: float) -> dict[int, NodeState | None]:
    """Node 0: every node's marker once all say "finished", or what was there at the deadline."""
    deadline = time.monotonic() + wait_s
    while True:
        markers = {k: read_marker(out_dir, k) for k in range(nnodes)}
        if all(m is not None and m.state == "finished" for m in markers.values()):
            return markers
        if time.monotonic() >= deadline:
            return markers
        time.sleep(0.2)


def finished(out_dir: Path, node_rank: int) -> bool:
    """Node `node_rank`'s marker says its torchrun finished."""
    marker = read_marker(out_dir, node_rank)
    return marker is not None and marker.state == "finished"


def _bundle_begun(out_dir: Path) -> bool:
    return any((out_dir / name).exists() for name in (RECEIPT_NAME, SUMS_NAME))


def take_over(out_dir: Path, wait_s: float, take: Callable[[Path], bool]) -> bool:
    """Node 1, once node 0 wrote no receipt in time and never said it finished: True once this
    process holds node 0's claim on the folder (`take`: the lock node 0's launcher holds for its
    whole run, taken without waiting) and no bundle was begun; False when a bundle was begun
    (node 0 was alive after all) or the claim stayed held until the deadline (node 0, or its
    guardian scrubbing the folder, is still there)."""
    deadline = time.monotonic() + wait_s
    while not _bundle_begun(out_dir):
        if take(out_dir):
            return not _bundle_begun(out_dir)  # node 0 may have finished just before
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return False


class InvalidReceipt(ValueError):
    """Node 0's bundle is finished but its receipt is not one: this node cannot tell its verdict."""


def wait_for_receipt(out_dir: Path, wait_s: float) -> Receipt | None:
    """Node K > 0: node 0's receipt once it and SHA256SUMS are written, else None at the
    deadline. Node 0 renames the whole receipt into place before it writes SHA256SUMS, so one
    that is there but does not read as a receipt never will: InvalidReceipt, with the first
    thing wrong. One not readable yet (a shared folder's lagging view) is waited for."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if (out_dir / SUMS_NAME).exists():
            try:
                return Receipt.model_validate(read_json(out_dir / RECEIPT_NAME))
            except OSError:
                pass
            except ValidationError as exc:
                raise InvalidReceipt(f"{RECEIPT_NAME}: {first_error(exc)}") from None
            except ValueError as exc:
                raise InvalidReceipt(f"{RECEIPT_NAME}: {exc}") from None
        time.sleep(0.2)
    return None
