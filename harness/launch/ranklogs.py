"""Rank logs by global rank: `logs/rank-NN.stdout`, `.stderr` and `.stacks` in the bundle.

torchrun files a rank's output by *local* rank under its own run id
(`torchrun/node-KK/<run id>/attempt_0/<local rank>/stdout.log`), and local ranks repeat on
every node. Each rank's record says which node folder it belongs to (`extra["node_index"]`, the
launcher's --node-rank) and its local rank, so the mapping comes from the ranks themselves, not
from an assumed rendezvous order. torchrun's own files stay where they are; these are copies
under the names a reader asks for. The faulthandler dump (`stacks/rank-NN.txt`, written on a
timeout or abort) is already by global rank and stays the one copy (`dcpqual logs --stacks`
reads it there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.atomic import atomic_write_bytes, link_on_the_way
from harness.schema.layout import LOGS_DIR, RECORDS_DIR, TORCHRUN_DIR, rank_file_name
from harness.schema.rank_record import RankRecord, rank_record_path

STREAMS = ("stdout", "stderr")
_NODE = re.compile(r"^node-(\d+)$")


def log_name(rank: int, stream: str) -> str:
    return rank_file_name(rank, f".{stream}")


@dataclass(frozen=True)
class LogFile:
    """One torchrun log: which node folder, which local rank, which stream."""

    node: int
    local_rank: int
    stream: str
    path: Path


def _own_file(out_dir: Path, path: Path) -> bool:
    """A regular file reached without a link: what a link points to is not a rank's output
    (it could be any file the run may read)."""
    return link_on_the_way(out_dir, path) is None and path.is_file()


def torchrun_logs(out_dir: Path) -> list[LogFile]:
    """Every per-rank log torchrun left under torchrun/node-KK/ (newest attempt last); none
    reached through a link."""
    found = []
    for node_dir in sorted((out_dir / TORCHRUN_DIR).glob("node-*")):
        match = _NODE.match(node_dir.name)
        if match is None or not node_dir.is_dir():
            continue
        for path in sorted(node_dir.glob("*/attempt_*/*/*.log")):
            stream = path.stem
            if stream in STREAMS and path.parent.name.isdigit() and _own_file(out_dir, path):
                found.append(LogFile(int(match[1]), int(path.parent.name), stream, path))
    return found


def rank_map(out_dir: Path, world_size: int) -> dict[tuple[int, int], int]:
    """(node folder, local rank) -> global rank, from the rank records that say so."""
    mapping: dict[tuple[int, int], int] = {}
    for rank in range(world_size):
        try:
            record = RankRecord.read(rank_record_path(out_dir / RECORDS_DIR, rank))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        node = record.extra.node_index
        if node is None:
            node = record.node_rank
        if isinstance(node, int):
            mapping[(node, record.local_rank)] = record.rank
    return mapping


def collect_rank_logs(out_dir: Path, world_size: int, nproc_per_node: int) -> list[str]:
    """Copy every rank's logs to logs/rank-NN.*; returns the files written (bundle-relative).

    A rank that left no record (it died before writing one) is placed by the launch layout,
    node index x ranks per node + local rank, which is what torchrun assigns on one node.
    Nothing is read or written through a link (OSError where `logs` is one): the launcher sets
    the ranks' links aside first, this holds for any other caller.
    """
    mapping = rank_map(out_dir, world_size)
    written: list[str] = []
    logs = out_dir / LOGS_DIR
    for log in torchrun_logs(out_dir):
        rank = mapping.get((log.node, log.local_rank))
        if rank is None:
            rank = log.node * nproc_per_node + log.local_rank
        rel = f"{LOGS_DIR}/{log_name(rank, log.stream)}"
        data = log.path.read_bytes()
        atomic_write_bytes(logs / log_name(rank, log.stream), data, within=out_dir)
        written.append(rel)
    return sorted(written)
