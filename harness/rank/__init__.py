"""What runs on every rank: the pytest plugin loaded with `-p harness.rank.plugin`.

`plugin` (hooks), `bootstrap` (process group), `sidechannel` (c10d store exchanges with
deadlines), `agreement` (pure verdict and blame rules), `watchdog` (timeouts, peer failures,
SIGTERM), `rankfiles` (record, stacks, torchrun error file). Never imports the controller
(`harness.launch`) or `harness.evidence`; `harness.schema.rank_record` is the contract between
the two sides.
"""
