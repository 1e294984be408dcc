"""Helpers shared by the harness's tests (import as `_support.<module>`; ranks spawned from the
repository root import them as `tests._support.<module>`, e.g. `--warm-impl`)."""
