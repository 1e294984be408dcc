"""pytest arguments after `--` narrow the configured targets exactly as pytest's would: a path
(or node id) replaces the default suites/, options alone keep it, as options alone keep
pytest's `testpaths`. Read through the real CLI up to the plan the launcher would start."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main
from harness.launch import launcher
from harness.launch.plan import REPO_ROOT, build_plan, run_targets

SUITES = str(REPO_ROOT / "suites")


@pytest.fixture
def planned(monkeypatch, tmp_path):
    """`dcpqual run ARGV` -> the ranks' pytest targets of the plan it would have launched."""

    def run(*argv: str) -> tuple[str, ...]:
        seen = {}

        def capture(options):
            seen["plan"] = build_plan(options, tmp_path / "out")
            return 0

        monkeypatch.setattr(launcher, "run", capture)
        assert main(["run", "--nproc-per-node", "2", *argv]) == 0
        return seen["plan"].targets

    return run


def test_options_alone_keep_the_suites_and_narrow_them(planned):
    assert planned("--", "-k", "warmup") == (SUITES, "-k", "warmup")


def test_no_pytest_arguments_run_the_suites(planned):
    assert planned() == (SUITES,)


def test_a_path_replaces_the_suites(planned):
    target = str(Path(SUITES) / "warmup")
    assert planned("--", target, "-k", "x") == (target, "-k", "x")


def test_a_node_id_replaces_the_suites(planned):
    target = str(Path(REPO_ROOT) / "tests" / "rank_suites" / "rank_pass.py")
    assert planned("--", "-q", f"{target}::test_world_formed") == (
        "-q",
        f"{target}::test_world_formed",
    )


def test_options_with_values_are_not_taken_for_paths(planned):
    """`-m slow` and `-k warmup` hold words, not targets: pytest's parser says so."""
    assert planned("--", "-m", "slow", "-k", "suites") == (SUITES, "-m", "slow", "-k", "suites")


def test_options_alone_are_held_to_the_suites_geometry(capsys):
    """They still run the suites, which build every stand-in model at --tp."""
    code = main(["run", "--nproc-per-node", "4", "--tp", "64", "--", "-k", "warmup"])
    assert code == 2
    assert "kimi-k3 has 96 attention heads: at tp=64" in capsys.readouterr().err


def test_direct_options_keep_their_targets_unless_told():
    """A RunOptions made in code (rerun, bench) names its targets, as before."""
    from harness.launch.plan import RunOptions

    options = RunOptions(nproc_per_node=2, pytest_args=("x.py",))
    assert run_targets(options) == ("x.py",)
    narrowing = RunOptions(nproc_per_node=2, pytest_args=("-q",), pytest_names_targets=False)
    assert run_targets(narrowing) == (SUITES, "-q")


def test_gpu16_hands_its_pytest_arguments_to_run_which_narrows_alike(planned):
    """`dcpqual gpu16 -- -k warmup` runs `dcpqual run ... -- -k warmup` (in the image or on the
    host): the suites stay, narrowed."""
    from harness.image.gpu_run import run_argv

    argv = run_argv(16, "/evidence/x", ["-k", "warmup"])
    assert argv[argv.index("--") :] == ("--", "-k", "warmup")
    assert planned("--", *argv[argv.index("--") + 1 :]) == (SUITES, "-k", "warmup")
