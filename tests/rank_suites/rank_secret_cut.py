"""The fault rank compares two URLs that carry the run's HF_TOKEN and differ just after it (the
page): pytest's introspection prints each side shortened around an ellipsis, and a diff that
skips the identical leading characters, so what it shows of the token is a piece, never the
whole. With `-l` the locals show a long value cut short too."""

from __future__ import annotations

import os

from _world import fault_rank, rank

TOKEN = os.environ.get("HF_TOKEN", "")


def test_compares_urls_that_carry_the_token():
    assert TOKEN, "the test that launches this suite plants HF_TOKEN"
    url = f"https://api.example.com/v1/models?access_token={TOKEN}&page=2"
    padded = "q" * 200 + TOKEN + "r" * 60  # `-l`: its repr is cut inside the token
    page = 2 if rank() != fault_rank() else 3
    assert url == f"https://api.example.com/v1/models?access_token={TOKEN}&page={page}", padded[:3]
