"""DCP transport: the combine math, the torch.distributed backend, the b12x backend, the registry.

- `combine`: `lse_combine` (the torch oracle) and `combine_local` (the A2A strategy's local step).
- `reference`: the independent float64 reference (numpy) the suites check the transports with.
- `torch_backend`: `TorchDCPTransport`, gather + reduction (AG+RS or A2A) on gloo or NCCL.
- `b12x_backend`: `B12xDCPTransport` over b12x's `PCIeDCPA2APool` (CUDA sm_12x only) and
  `b12x_available()` for evidence limitations.
- `registry`: `TransportRegistry`, one transport per signature, collective creation, events.
- `allocator`, `events`, `checks`, `errors`: what the above share.
- `testing`: deterministic inputs and adversarial LSE patterns for tests and suites.
"""
