"""The engine lane: vLLM's own engine (`LLM(...)`, external launcher) started on every rank,
its startup phases watched through stable seams (`harness.engine.watch`)."""
