"""What one capture check on one rank leaves for the evidence bundle (the rank record's
capture entries; their models live in `harness.schema.capture`, torch-free)."""

from __future__ import annotations

from harness.schema.capture import CaptureRecord, DetectorStatus, SignatureUse

__all__ = ["CaptureRecord", "DetectorStatus", "SignatureUse"]
