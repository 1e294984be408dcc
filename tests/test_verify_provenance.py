"""The image a run was in and the harness checkout it ran are held to what the ranks saw at their
start (`RankRecord.provenance`): a forger who pastes a locked image and a clean commit into the
receipt of a GPU run outside an image, from a dirty checkout, and reseals every hash, no longer
gets `qualified`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _support.evidence_factory import (
    CLEAN_CHECKOUT,
    DIRTY_CHECKOUT,
    GPU_DIGEST,
    LOCKED_IMAGE,
    capture,
    context,
    control,
    gpu_environment,
    write_rank,
)
from _support.forge import forge

from harness.evidence import verify, writer
from harness.evidence.verify import verify_bundle
from harness.gitinfo import GitIdentity
from harness.rank.rankfiles import rank_provenance
from harness.schema.image import Image
from harness.schema.rank_record import Provenance
from harness.schema.receipt import Source

WORLD = 4


def seen(checkout: Source, digest: str | None, rank: int) -> Provenance:
    """What rank `rank` records: the image digest, and the harness checkout on rank 0 only."""
    assert checkout.commit and checkout.tree and checkout.dirty is not None
    ident = GitIdentity(checkout.commit, checkout.tree, checkout.dirty, tuple(checkout.dirty_paths))
    return Provenance.of(digest, ident if rank == 0 else None)


def gpu_bundle(
    out: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    ranks_saw: Source,
    writer_sees: Source,
    image: dict[str, Any] | None,
) -> Path:
    """A passing 4-rank NCCL run with CUDA-graph windows, b12x and controls; its ranks saw
    `ranks_saw` checked out (and the image, if any) and the writer sees `writer_sees` now."""
    monkeypatch.setattr(writer, "capture_environment", gpu_environment)
    monkeypatch.setattr(writer, "capture_sources", lambda: {"dcpqual": writer_sees})
    out.mkdir()
    digest = None if image is None else image["digest"]
    for rank in range(WORLD):
        write_rank(
            out,
            rank,
            WORLD,
            captures=[capture(rank, path="cuda-graph"), control(rank)],
            transport="b12x",
            backend="nccl",
            provenance=seen(ranks_saw, digest, rank),
        )
    identity = None if image is None else Image.model_validate(image)
    writer.finalize_bundle(out, context(WORLD, backend="nccl", image=identity))
    assert verify_bundle(out).ok, verify_bundle(out).problems
    return out


def receipt(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "receipt.json").read_text())


def test_the_receipt_states_the_checkout_rank_0_ran_not_the_one_there_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkout was cleaned after the run started: the code that ran was dirty."""
    bundle = gpu_bundle(
        tmp_path / "b",
        monkeypatch,
        ranks_saw=DIRTY_CHECKOUT,
        writer_sees=CLEAN_CHECKOUT,
        image=LOCKED_IMAGE,
    )
    stated = receipt(bundle)
    assert stated["sources"]["dcpqual"] == DIRTY_CHECKOUT.model_dump(mode="json")
    assert stated["status"] == "source-qualified"
    assert any(line.startswith("sources: ") for line in stated["limitations"])


def test_a_locked_image_and_a_clean_checkout_pasted_in_do_not_qualify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = gpu_bundle(
        tmp_path / "b",
        monkeypatch,
        ranks_saw=DIRTY_CHECKOUT,
        writer_sees=DIRTY_CHECKOUT,
        image=None,
    )
    assert receipt(bundle)["status"] == "source-qualified"

    def launder(data: dict[str, Any]) -> None:
        data["image"] = LOCKED_IMAGE
        data["sources"]["dcpqual"] = CLEAN_CHECKOUT.model_dump(mode="json")
        data["limitations"] = [
            x for x in data["limitations"] if x.partition(": ")[0] not in ("image", "sources")
        ]

    assert forge(bundle, launder).status == "qualified"  # the forger's prize
    with monkeypatch.context() as patch:
        patch.setattr(verify, "rederive_problems", lambda *_: [])
        assert verify_bundle(bundle).ok  # the receipt alone says nothing else of either
    problems = verify_bundle(bundle).problems
    assert problems == (
        f"receipt.json: image.digest is {GPU_DIGEST!r} but the rank records and JUnit reports "
        "say None",
        "receipt.json: sources.dcpqual.dirty is False but the rank records and JUnit reports "
        "say True",
    )


def test_records_that_do_not_say_hold_the_receipt_to_nothing(tmp_path: Path) -> None:
    """Records written before provenance was recorded (the smoke's too) leave both as stated."""
    out = tmp_path / "b"
    out.mkdir()
    for rank in range(2):
        write_rank(out, rank, 2)
    writer.finalize_bundle(out, context(2))

    def paste(data: dict[str, Any]) -> None:
        data["image"] = LOCKED_IMAGE

    forge(out, paste)
    assert not [p for p in verify_bundle(out).problems if "image.digest" in p]


def test_a_rank_records_the_image_its_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCPQUAL_IMAGE_IDENTITY", json.dumps({"digest": GPU_DIGEST}))
    assert rank_provenance(3) == Provenance(image_digest=GPU_DIGEST)
    monkeypatch.delenv("DCPQUAL_IMAGE_IDENTITY")
    assert rank_provenance(3) == Provenance()
    monkeypatch.setenv("DCPQUAL_IMAGE_IDENTITY", "{not json")
    assert rank_provenance(3).image_digest is None
    zero = rank_provenance(0)
    assert zero.harness_commit is not None and len(zero.harness_commit) == 40


def test_rank_0_cannot_be_the_one_record_that_says_nothing(tmp_path: Path) -> None:
    """Rank 0 names the checkout; a record of its that says nothing while the others name
    their image would leave a pasted clean checkout held to nothing."""
    out = tmp_path / "b"
    out.mkdir()
    for rank in range(2):
        provenance = None if rank == 0 else Provenance(image_digest=None)
        write_rank(out, rank, 2, provenance=provenance)
    writer.finalize_bundle(out, context(2))
    assert verify_bundle(out).problems == (
        "receipt.json: rank 0's provenance is None but the rank records and JUnit reports say "
        "'recorded, as ranks [1] record it'",
    )
