"""Stand-in vLLM model trees (Kimi-K3, DeepSeek-V4, generic MLA, mixed) with no real weights
(builders.py), vLLM's own trees (real/), and what picks and runs a warm implementation on them.

Nothing is imported here: `dcpqual signatures` lives in this package, and `--help` must not
import torch."""
