"""A test whose id and failure message are Markdown written to break out of summary.md.

Its id closes an inline code span with a backtick and follows it with a link, an image and raw
HTML; it fails on every rank, so the id and the message become the run's root cause.
"""

from __future__ import annotations

import pytest

HOSTILE = "x`[click](https://evil.example)<img src=x onerror=alert(1)>`|*y*"


@pytest.mark.parametrize("label", [HOSTILE], ids=[HOSTILE])
def test_hostile_id(label):
    message = "see [here](https://evil.example) <script>alert(1)</script> `code`"
    assert label == "", message
