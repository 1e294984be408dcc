"""The multi-rank runner: `dcpqual run` and what runs on every rank.

Controller side (the `dcpqual run` process): `cli` -> `plan` (validated options, the torchrun
argv) -> `launcher` (one launch, the process tree, the pipeline) -> `collect` (the RunContext for
the evidence writer); `progress` (live line), `nodes` (multi-node out-folder protocol),
`proctree` (find and end every process of a run).

Rank side (loaded by pytest with `-p harness.dist.plugin`; never imports the controller or
`harness.evidence`): `plugin` (hooks), `bootstrap` (process group), `sidechannel` (c10d store
exchanges with deadlines), `agreement` (pure verdict and blame rules), `watchdog` (timeouts,
peer failures, SIGTERM), `rankfiles` (record, stacks, torchrun error file). `records` is the
contract between the two sides.
"""
