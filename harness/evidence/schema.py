"""The receipt's models, as the evidence package names them (they live in
`harness.schema.receipt`, torch-free, beside every other on-disk format)."""

from __future__ import annotations

from harness.schema.image import DIGEST_PATTERN, Image
from harness.schema.receipt import (
    SCHEMA,
    Backend,
    Capture,
    CaptureEvent,
    Coverage,
    Environment,
    FailedTest,
    Geometry,
    Gpu,
    Models,
    NegativeControl,
    Ranks,
    Receipt,
    RootCause,
    RootCauseKind,
    Run,
    RunExtra,
    Selection,
    SignatureRow,
    Source,
    Status,
    Tally,
    Verdict,
)

__all__ = [
    "DIGEST_PATTERN",
    "SCHEMA",
    "Backend",
    "Capture",
    "CaptureEvent",
    "Coverage",
    "Environment",
    "FailedTest",
    "Geometry",
    "Gpu",
    "Image",
    "Models",
    "NegativeControl",
    "Ranks",
    "Receipt",
    "RootCause",
    "RootCauseKind",
    "Run",
    "RunExtra",
    "Selection",
    "SignatureRow",
    "Source",
    "Status",
    "Tally",
    "Verdict",
]
