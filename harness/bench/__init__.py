"""Benchmarks: `dcpqual bench` measures transport, launch, discovery, capture and memory costs.

Driver side: `cli` (options) -> `driver` (sections in one session) -> `report` (statistics,
targets, JSON, tables), with `launching` (torchrun through `harness.launch`). Rank side, under
torchrun: `bare_rank` (every bench rank's life, and the bare launch), `bare_real_rank` (the
bare launch that imports vLLM and builds the real trees), `ranks` (transport and capture), and
`probe`, the plugin on a measured run's ranks. The results file is
`harness.schema.bench`; the method is in bench/README.md.
"""
