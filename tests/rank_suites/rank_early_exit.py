"""Every rank ends its pytest session in the second of three tests, claiming success.

`pytest.exit(..., returncode=0)` stops the session: the third collected test never runs on any
rank, so the run proved less than it selected and must not pass.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist


def test_first_runs():
    dist.barrier()


def test_ends_the_session_early():
    pytest.exit("leaving before the rest of the suite ran", returncode=0)


def test_never_runs():
    dist.barrier()
