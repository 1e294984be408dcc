"""The vocabulary every role shares, torch-free: transport signatures and parallel geometry.

Nothing here imports torch, so the controller, `verify` and the CLI's help can use these values
without it; the torch mapping of dtype names lives in `harness.transport.dtypes`.
"""
