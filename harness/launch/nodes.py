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

Without a shared folder node K never sees node 0's marker and stops with a clear error.
"""

from __future__ import annotations

import json
import os
import socket
import time
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
