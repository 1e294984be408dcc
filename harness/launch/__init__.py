"""The controller: `dcpqual run` and everything that happens in the launching process.

`cli` -> `plan` (validated options, the torchrun argv) -> `launcher` (one launch, the process
tree, the pipeline) -> `collect` (the RunContext for the evidence writer); `progress` (live
line), `nodes` (multi-node out-folder protocol), `proctree` (find and end every process of a run).
Never imported by the rank side (`harness.rank`).
"""
