"""dcpqual: qualification harness for B12X DCP transport warmup on multi-rank torchrun jobs."""

__version__ = "0.1.0"
