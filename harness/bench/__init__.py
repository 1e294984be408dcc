"""Benchmarks: `dcpqual bench` measures transport, launch, discovery, capture and memory costs.

Driver side: `cli` (options) -> `driver` (sections in one session) -> `report` (targets, JSON,
tables), with `stats` and `launching` (torchrun through `harness.launch`). Rank side, under
torchrun: `ranks` (transport and capture), `bare_rank`, and `probe`, the plugin on a measured
run's ranks. The results file is `harness.schema.bench`; the method is in bench/README.md.
"""
