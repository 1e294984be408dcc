"""Capture window and lazy-specialization detectors.

- `window`: `CaptureWindow(detectors, registry=, mode="strict"|"record").capture(step, inputs)`
  -> `CapturedStep.replay(new_inputs)`; real `torch.cuda.graph` on CUDA, a frozen-registry
  simulation on CPU.
- `detector`: the plugin contract (`Detector`, `without`); `detectors`: transport registry,
  transport buffers, process groups, dynamo; `gpu_detectors`: CUDA memory, Triton JIT, b12x.
- `decode`: a DCP decode step through every attention layer's transport (`DecodeStep`).
- `controls`: one negative control per detector; `check`: default detector set, per-rank
  records, cross-rank agreement.
- `events`, `records`: `LazyEvent`, `LazySpecializationError`, `CaptureRecord` (the evidence).

Kept free of imports: `harness.rank`, `harness.launch` and `harness.evidence` import `records`
alone.
"""
