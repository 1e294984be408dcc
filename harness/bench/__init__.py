"""Benchmarks: `dcpqual bench` measures transport, launch, discovery, capture and memory costs.

Driver side: `cli` (options) -> `driver` (sections in one session) -> `report` (JSON + tables),
with `stats`, `results`, `targets`, `discovery_bench` and `launch_bench` (torchrun through
`harness.launch`). Rank side (under torchrun, imports nothing of the driver): `rank`,
`rank_measure`, `bare_rank`, and `probe`, the plugin on a measured run's ranks. The method is in
bench/README.md.
"""
