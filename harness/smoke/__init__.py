"""The one-GPU smoke (`dcpqual gpu-smoke`): the GPU paths of the harness on one CUDA device.

- what the smoke saw, as values, and its verdict (capture passed, every control fired), live in
  `harness.schema.smoke`: they are the format of the bundle's `smoke/result.json`.
- `step`: the stand-in Kimi-K3 decode step at world 1, and the registry view that maps the
  signatures vendored warmup finds at TP16/DCP16 onto the world-1 DCP group.
- `run`: one process group of one rank, warm, strict CUDA-graph capture, replays, then the
  negative controls, each inside a real capture.
- `bundle`: the evidence bundle (same receipt schema as `dcpqual run`); `cli`: the command.

Kept free of imports, so `dcpqual --help` loads no torch.
"""
