"""The harness's error policy, in one place.

- `UsageError` (and its subclasses): the user gave us something we cannot use (bad geometry,
  bad lock file, an evidence folder that already holds files). The CLI prints one line and
  exits 2. Messages carry the offending values.
- `QualificationError`: the harness ran, and what it checked is wrong. Exit 1.
- `assert` is for internal invariants only.
"""

from __future__ import annotations


class DcpqualError(Exception):
    """Base class of every error the CLI turns into a one-line message."""

    exit_code: int = 1


class UsageError(DcpqualError, ValueError):
    """Unusable input: exit 2, nothing written."""

    exit_code = 2


class GeometryError(UsageError):
    """A parallel geometry (tp, dcp, heads, world size) that cannot be used."""


class QualificationError(DcpqualError):
    """The harness ran, and what it checked does not hold."""

    exit_code = 1
