"""The names of an out folder's files and folders, the one place each is defined: the launcher,
the ranks, the bundle writer, `verify`, `logs`, `compare` and the bench all find them here."""

from __future__ import annotations

# What the bundle writer writes.
RECEIPT_NAME = "receipt.json"
SUMMARY_NAME = "summary.md"
SUMS_NAME = "SHA256SUMS"
MERGED_JUNIT = "junit/merged.xml"
LAUNCH_NAME = "launch.json"
SMOKE_RESULT_NAME = "smoke/result.json"

# Folders: what the ranks write (records, JUnit, stack dumps), what torchrun writes (one
# --log-dir per node), what the launcher writes (rank logs by global rank, node markers), and
# where the writer sets aside files that are not evidence.
RECORDS_DIR = "records"
JUNIT_DIR = "junit"
STACKS_DIR = "stacks"
TORCHRUN_DIR = "torchrun"
LOGS_DIR = "logs"
NODES_DIR = "nodes"
STRAYS_DIR = "strays"


def rank_file_name(rank: int, suffix: str) -> str:
    """`rank-NN<suffix>`: how every per-rank file is named (records, JUnit, stacks, logs)."""
    return f"rank-{rank:02d}{suffix}"


def node_dir_name(node_rank: int) -> str:
    """`node-NN`: a node's torchrun log folder and its marker's stem."""
    return f"node-{node_rank:02d}"
