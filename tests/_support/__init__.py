"""Helpers shared by the harness's tests (import as `_support.<module>`)."""
