"""Security: a planted secret never reaches the evidence of a real run; the gpu16
container is started unprivileged. Each check is shown to fail when its protection is removed.

The writer-level redaction rules (JSON/XML escaped forms, the receipt's `env`) are unit-tested in
tests/test_evidence_writer.py and tests/test_evidence_environment.py; the container spec's own
fields in tests/test_gpu_run.py. Here: the whole path, `dcpqual run` and `dcpqual gpu16`.
"""

from __future__ import annotations

import json
import secrets
import shutil
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _support.identities import RTX, make_identity, write_identity
from _support.leaks import pieces_in, pieces_left
from _support.locks import pinned_lock_data, write_lock
from _support.runs import SUITES, run

from harness.cli import main
from harness.core.secrets import Scrubber
from harness.evidence import writer
from harness.evidence.files import walk
from harness.evidence.verify import verify_bundle
from harness.image import engine, gpu_run

# -- a planted secret, through a real 2-rank `dcpqual run` -------------------------------------


def leaks(root: Path, secret: str) -> list[str]:
    """Files under `root` whose name or bytes hold `secret`."""
    needle = secret.encode()
    return [
        e.relpath
        for e in walk(root)
        if secret in e.relpath or (e.kind == "file" and needle in e.path.read_bytes())
    ]


@pytest.mark.torchrun
def test_a_planted_token_never_reaches_the_evidence_or_the_console_of_a_real_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rank_secret.py spills HF_TOKEN into every kind of file a run leaves and, with both ranks
    tee'd and uncaptured, through the launcher's console; neither the bundle nor the console
    shows it, while the ranks' lines do reach the console. The raw folder is kept as the writer
    found it, and finalized a second time with redaction removed (`writer.environment_scrubber`
    -> a scrubber of no values and no shapes), to show the same check then fails. The raw copy
    is taken at the first step of the ending, before the launcher's scrub."""
    token = f"hf_dcpqual{uuid.uuid4().hex}"
    monkeypatch.setenv("HF_TOKEN", token)
    raw = tmp_path / "raw"
    kept: dict[str, Any] = {}
    finalize, scrub_first = writer.finalize_bundle, writer.scrub_out_dir

    def keep_raw_then_scrub(out_dir: Path) -> Any:  # the first step of every ending
        shutil.copytree(out_dir, raw)
        return scrub_first(out_dir)

    def keep_ctx_then_finalize(out_dir: Path, ctx: Any) -> Any:
        kept["ctx"] = ctx
        return finalize(out_dir, ctx)

    monkeypatch.setattr(writer, "scrub_out_dir", keep_raw_then_scrub)
    monkeypatch.setattr(writer, "finalize_bundle", keep_ctx_then_finalize)
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--tee", "0,1", "--out", str(out)]
    code = main([*argv, "--", "-s", str(SUITES / "rank_secret.py")])

    assert code == 1  # rank 1 failed, as planned
    printed = capsys.readouterr()
    lines = printed.out.splitlines()
    assert any(ln.startswith("[default0]:") and "HF_TOKEN=[REDACTED]" in ln for ln in lines)
    refused = "AssertionError: request refused for HF_TOKEN=[REDACTED]"
    assert any(ln.startswith("[default1]:E ") and refused in ln for ln in lines)
    assert token not in printed.out and token not in printed.err

    spilled = leaks(raw, token)
    for where in ("junit/rank-01.xml", "notes/rank-00.txt"):
        assert where in spilled, f"the suite did not spill the token into {where}: {spilled}"
    # What the ranks write themselves reached the disk already scrubbed: their output (through
    # the relay) and their records, which the suite's failure and printout went into.
    assert not [p for p in spilled if p.startswith(("torchrun/", "records/"))], spilled
    assert "[REDACTED]" in (raw / "records" / "rank-01.json").read_text()
    logs = [p for p in (raw / "torchrun").rglob("stdout.log") if "[REDACTED]" in p.read_text()]
    assert logs, "the suite's printout never reached a rank's log"
    assert leaks(out, token) == []
    receipt = json.loads((out / "receipt.json").read_text())
    assert "[REDACTED]" in receipt["root_cause"]["message"]
    assert "HF_TOKEN" not in receipt["environment"]["env"]
    assert set(receipt["scrubbed_files"]) >= {"junit/rank-01.xml", "notes/rank-00.txt"}

    no_redaction = Scrubber((), shapes=False)
    monkeypatch.setattr(writer, "environment_scrubber", lambda: no_redaction)
    finalize(raw, kept["ctx"])
    unredacted = leaks(raw, token)
    # The receipt and summary.md take their text from the records, scrubbed as written; the
    # merged JUnit report comes from pytest's own reports, which only the ending scrubs.
    assert "junit/merged.xml" in unredacted, unredacted


@pytest.mark.torchrun
def test_a_token_that_pytest_printed_cut_short_leaves_no_piece_in_the_evidence_or_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rank_secret_cut.py fails an assertion on two URLs that differ just after the token, with
    both ranks tee'd and `-l`: pytest shows pieces of the token (beside an ellipsis, at the edge
    of a diff's lines), which no whole form matches. No piece of 6 characters reaches the bundle
    or the console (the token's letters are no hex digits, so hashes and ids cannot match)."""
    letters = "ghijkmnopqrstuvwxyzGHJKLMNPQRSTUVWXYZ"
    token = "hf_" + "".join(secrets.choice(letters) for _ in range(32))
    monkeypatch.setenv("HF_TOKEN", token)
    out = tmp_path / "bundle"
    argv = ["run", "--nproc-per-node", "2", "--tp", "2", "--tee", "0,1", "--out", str(out)]
    code = main([*argv, "--", "-l", str(SUITES / "rank_secret_cut.py")])

    assert code == 1  # rank 1 failed, as planned
    printed = capsys.readouterr()
    assert "identical leading characters in diff" in printed.out  # the diff was printed
    assert pieces_in(printed.out + printed.err, token, 6) == []
    assert pieces_left(out, token, 6) == []
    assert main(["verify", str(out)]) == 0


# -- the gpu16 container, as it reaches the engine ---------------------------------------------

# Settings that hand the container the host, beyond the GPUs, IPC and memlock the run needs.
ESCALATIONS = ("cap_add", "devices", "security_opt", "pid_mode", "network_mode", "userns_mode")


def privilege_problems(started: dict[str, Any], logged: str) -> list[str]:
    problems = []
    if started.get("privileged") is not False:
        problems.append(f"privileged={started.get('privileged')!r}")
    if "--privileged" in logged.split():
        problems.append("the logged docker run line has --privileged")
    problems += [f"{key}={started[key]!r}" for key in ESCALATIONS if started.get(key)]
    return problems


class FakeEngine:
    """Just enough of docker.DockerClient for `gpu16_in_image`: records what it is asked to run."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.started: list[dict[str, Any]] = []
        self.api = SimpleNamespace(inspect_image=lambda ref: {"Config": {"Labels": labels}})
        self.containers = SimpleNamespace(run=self._run)

    def _run(self, **kwargs: Any) -> Any:
        self.started.append(kwargs)
        return SimpleNamespace(
            logs=lambda stream, follow: iter([b"dcpqual run: verdict PASS\n"]),
            wait=lambda: {"StatusCode": 0},
            remove=lambda force: None,
        )


def start_gpu16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    """`dcpqual gpu16` up to the engine: the kwargs it started the container with, and the
    `docker run` line it logged."""
    lock_file = write_lock(tmp_path / "source.lock.json", pinned_lock_data())
    identity = make_identity(lock_file)
    fake = FakeEngine(labels={"io.dcpqual.lock.sha256": identity.source_lock_sha256})
    monkeypatch.setattr(engine, "connect", lambda purpose: fake)
    lines: list[str] = []
    code = gpu_run.gpu16_in_image(
        write_identity(tmp_path / "identity.json", identity),
        lock_file,
        tmp_path / "evidence",
        [],
        lines.append,
        gpus=lambda: [RTX] * gpu_run.GPU_RANKS,
    )
    assert code == 0
    [started] = fake.started
    return started, next(line for line in lines if line.startswith("$ docker run"))


def test_the_gpu16_container_is_started_unprivileged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, logged = start_gpu16(tmp_path, monkeypatch)
    assert privilege_problems(started, logged) == []
    assert started["device_requests"] and started["ipc_mode"] == "host"  # what it does need


def test_a_privileged_container_would_be_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same path with the spec's `privileged=False` flipped: the check above fails."""
    spec_of = gpu_run.gpu16_container_spec
    monkeypatch.setattr(
        gpu_run,
        "gpu16_container_spec",
        lambda *args, **kwargs: replace(spec_of(*args, **kwargs), privileged=True),
    )
    started, logged = start_gpu16(tmp_path, monkeypatch)
    assert privilege_problems(started, logged) == [
        "privileged=True",
        "the logged docker run line has --privileged",
    ]


@pytest.mark.torchrun
def test_an_honest_run_whose_text_looks_like_credentials_passes_and_keeps_its_ids(
    tmp_path: Path,
) -> None:
    """rank_shaped_ids.py names tests like settings (`MAX_TOKENS=64`) and remotes with a user
    (`ssh://git@...`), and one of its tests runs a child that fails through torchrun's `@record`,
    which writes the error file the child inherited from its rank. None of that is a secret or
    a rank's failure: the run passes, verifies, and counts each of its five tests by its id."""
    out = tmp_path / "run"
    code, _ = run(out, 2, "rank_shaped_ids.py")
    assert code == 0
    assert verify_bundle(out).ok, verify_bundle(out).problems
    data = json.loads((out / "receipt.json").read_text())
    assert data["verdict"] == "pass" and data["coverage"]["collected"] == 5
    ids = json.loads((out / "records" / "rank-00.json").read_text())["collected"]
    assert [i.partition("::")[2] for i in ids] == [
        "test_limit[MAX_TOKENS=64]",
        "test_limit[MAX_TOKENS=128]",
        "test_remote[ssh://git@example.org/a]",
        "test_remote[ssh://ci@example.org/a]",
        "test_a_child_that_fails_is_reported",
    ]
    assert list(out.glob("torchrun/**/error.json"))  # the child's, beside a pass
