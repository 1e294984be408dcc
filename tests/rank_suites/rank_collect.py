"""One rank collects an extra test: every rank must abort with a diff, none may hang."""

from __future__ import annotations

import os

import pytest


def test_common():
    pass


if os.environ.get("RANK") == os.environ.get("DCPQUAL_FAULT_RANK", "1"):

    def test_only_on_the_fault_rank():
        pass


@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    assert n
