"""dcpqual: qualification harness for B12X DCP transport warmup on multi-rank torchrun jobs.

PYTEST_DONT_REWRITE: the installed `pytest11` entry point makes pytest mark this package for
assertion rewriting, and a process that imported it first (a rank, a preloading parent) would
then be warned "already imported"; the library's asserts are internal invariants, not tests.
"""

__version__ = "0.1.0"
