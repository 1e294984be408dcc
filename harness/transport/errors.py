"""Errors of the transport layer, mapped onto the harness's error policy (`harness.errors`)."""

from __future__ import annotations

from harness.errors import QualificationError, UsageError


class TransportUsageError(UsageError):
    """A caller handed a transport a tensor it cannot take (shape, dtype, device)."""


class CapacityError(TransportUsageError):
    """A batch above the signature's max_tokens: the static staging buffers cannot hold it.

    Raised instead of reallocating, because a reallocation is exactly the lazy work that must
    not happen inside capture.
    """


class BackendUnavailableError(UsageError):
    """The requested backend cannot run here (b12x not installed, no CUDA, not sm_12x)."""


class SignatureMismatchError(QualificationError):
    """Ranks of one DCP group asked the registry for different transports.

    Raised on every rank of the group (they all see the same gathered list), never a hang.
    """


class RegistryClosedError(QualificationError):
    """The registry (or a transport) was used after `close()`."""
