"""Benchmarks: `dcpqual bench` measures transport, launch, discovery, capture and memory costs.

Driver side: `cli` -> `driver` (sections in one session) -> `report` (JSON + tables), with
`stats`, `bandwidth` and `targets` as pure helpers and `rank_results`, `discovery_bench`,
`launch_bench` per section. Rank side (under torchrun, imports nothing of the driver): `rank`,
`rank_env`, `rank_transport`, `rank_capture`, `bare_rank`, and the suites' `rss_plugin`.
The method is in bench/README.md.
"""
