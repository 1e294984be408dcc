"""The bench's launching and rank side: a dead rank is named, ranks leave together, phases add."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.bench import probe, rank
from harness.bench.launch_bench import dead_ranks, profile_of, why_failed

# torchrun 2.13's report after rank 1 aborted and the agent ended rank 0.
AGENT_LOG = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
harness.bench.rank FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_11:37:55
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 24222)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 24222
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_11:37:55
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 24223)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 24223
=======================================================
"""


def fake_launch(tmp_path: Path, agent: str, stderr: dict[int, str]) -> Path:
    node = tmp_path / "torchrun" / "node-00"
    node.mkdir(parents=True)
    (node / "agent.log").write_text(agent)
    for local, text in stderr.items():
        folder = node / "run_x" / "attempt_0" / str(local)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(text)
    return tmp_path


def test_dead_ranks_root_cause_first() -> None:
    assert dead_ranks(AGENT_LOG) == [(1, 1, -6), (0, 0, -15)]
    assert dead_ranks("torchrun exited") == []


def test_a_dead_rank_is_named_with_its_signal_and_stderr(tmp_path: Path) -> None:
    out = fake_launch(
        tmp_path, AGENT_LOG, {0: "", 1: "x\nterminate called without an active exception\n"}
    )
    text = why_failed(out, 1, world=2)
    assert text.startswith("bench rank 1 of 2 died first (exit -6 (SIGABRT); torchrun exit 1)")
    assert "then rank 0 exit -15 (SIGTERM)" in text
    assert text.endswith("terminate called without an active exception")


def test_without_torchruns_report_the_first_rank_stderr_is_shown(tmp_path: Path) -> None:
    out = fake_launch(tmp_path, "Traceback: agent broke", {0: "", 1: "boom"})
    text = why_failed(out, 1, world=2)
    assert "no failed rank in its report" in text and text.endswith("boom")


class FakeGroup:
    """Stands in for torch.distributed and the bootstrap: records the order of calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, me: int, fail: bool = False) -> None:
        self.calls: list[str] = []
        env = rank.RankEnv(rank=me, world_size=2)
        monkeypatch.setattr(rank.RankEnv, "from_env", staticmethod(lambda: env))
        monkeypatch.setattr(rank, "init_process_group", lambda *a: self._note("init", "cpu"))
        monkeypatch.setattr(rank, "teardown", lambda: self._note("teardown"))
        monkeypatch.setattr(rank.Clock, "barrier", lambda clock: self._note("barrier"))
        monkeypatch.setattr(rank, "_write", lambda *a: self._note("write"))
        monkeypatch.setattr(rank.os, "_exit", lambda code: self._note(f"exit {code}"))
        monkeypatch.setattr(
            rank.dist, "all_gather_object", lambda every, mine: self._note("gather")
        )

        def measure(clock: Any, spec: Any) -> dict[str, Any]:
            if fail:
                raise RuntimeError("measurement broke")
            return {}

        import harness.bench.rank_measure as rank_measure

        monkeypatch.setattr(rank_measure, "measure", measure)

    def _note(self, what: str, value: Any = None) -> Any:
        self.calls.append(what)
        import torch

        return torch.device(value) if value else None


@pytest.mark.parametrize(
    ("me", "expected"),
    [
        (0, ["init", "gather", "write", "barrier", "teardown", "exit 0"]),
        (1, ["init", "gather", "barrier", "teardown", "exit 0"]),
    ],
)
def test_every_rank_waits_for_rank_0s_write_then_all_leave(
    monkeypatch: pytest.MonkeyPatch, me: int, expected: list[str]
) -> None:
    group = FakeGroup(monkeypatch, me)
    rank.main([rank.RankSpec().to_json(), "/nonexistent/out.json"])
    assert group.calls == expected


def test_a_failing_rank_prints_why_leaves_the_group_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    group = FakeGroup(monkeypatch, 1, fail=True)
    rank.main([rank.RankSpec().to_json(), "/nonexistent/out.json"])
    assert group.calls == ["init", "teardown", "exit 1"]
    assert "RuntimeError: measurement broke" in capsys.readouterr().err


def test_rank_spec_round_trips() -> None:
    spec = rank.RankSpec(batches=(1, 8), strategies=("a2a",), capture=False)
    assert rank.RankSpec.from_json(spec.to_json()) == spec


def test_probe_splits_each_test_into_body_and_overhead(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 1.0, 3.0, 3.5, 4.0, 10.0])  # protocol 0..10; call 1..3; a write 3.5..4

    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock))
    phases = probe.Phases()
    write = phases._timer("records_s", lambda: None)

    class Item:
        nodeid = "suites/transport/test_gather.py::test_x[1]"

    phases.before("pytest_runtest_protocol", [], {"item": Item()})
    phases.before("pytest_runtest_call", [], {})
    phases.after(None, "pytest_runtest_call", [], {})
    write()
    phases.after(None, "pytest_runtest_protocol", [], {})
    suite = phases.to_json()["suites"]["transport"]
    assert suite == {"tests": 1, "tests_s": 2.0, "overhead_s": 8.0, "records_s": 0.5}


def test_probe_names_what_it_could_not_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "TIMED", {"agreement_s": ("harness.rank.sidechannel:Gone.post",)})
    phases = probe.Phases()
    phases.wrap()
    assert phases.unprobed == ["harness.rank.sidechannel:Gone.post"]


def test_profile_takes_median_and_slowest_rank_and_the_launchers_share() -> None:
    def probe_of(r: int, configure: float) -> dict[str, Any]:
        phases = {"import_torch": 2.0, "configure": configure, "collection": 1.0, "finish": 0.5,
                  "suites": {"capture": {"tests": 3, "tests_s": 4.0}}, "unprobed": []}  # fmt: skip
        return {"rank": r, "cpu_s": 10.0, "loaded_at": 100.0 + r, "ended_at": 150.0 + r,
                "phases": phases}  # fmt: skip

    prof = profile_of([probe_of(0, 1.0), probe_of(1, 3.0), probe_of(2, 8.0)], 90.0, 160.0)
    assert prof is not None
    assert prof["phases_s"]["configure"] == {"median": 3.0, "max": 8.0}
    assert prof["phases_s"]["suite capture (3 tests): tests_s"] == {"median": 4.0, "max": 4.0}
    assert (prof["launcher_before_ranks_s"], prof["ranks_s"], prof["launcher_after_ranks_s"]) == (
        10.0, 52.0, 8.0,
    )  # fmt: skip
    assert prof["cpu_s_all_ranks"] == 30.0
    assert profile_of([{"rank": 0}], 0.0, 1.0) is None  # not profiled: no table
    json.dumps(prof)
