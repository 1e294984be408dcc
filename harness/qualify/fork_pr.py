"""`dcpqual qualify-pr`: qualify a pull request of the vLLM fork, before and after.

The evidence a reviewer of the fork wants is the fork's own code run twice, once at the commit
the pull request branched from and once at its head, with everything else equal. The plan:

for each side (base, then head), in a worktree of this harness at the current commit
  1. `dcpqual lock pin --component vllm --pr N --side SIDE` from a local clone of the fork (the
     pull request's head is fetched and must be the reviewed SHA; recorded as number + head,
     checked by ancestry), committed in the worktree so the image records a clean harness tree;
  2. `dcpqual image build` of that worktree (the build checks the merged tree and ancestry again);
  3. the engine lane in that image on the GPU node: `dcpqual run --models engine` on 16 ranks
     with NCCL, after the fork's and b12x's GPU source gates (their tallies reach the receipt
     through the in-image check; a failed gate fails the side);
then `dcpqual compare BASE HEAD` in Markdown and JSON: base fails / head passes is the evidence.

The plan is a value (`plan_fork_pr`) and every command in it an argv, so it is tested on CPU;
`run_plan` executes it and stops at the first step that fails, with that step's exit code
(here, without a Docker engine, the image build fails closed with one line, exit 2).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import gitinfo
from harness.errors import UsageError
from harness.image.build import DEFAULT_LOCK
from harness.image.lock import HEX40, load_lock

GPU_RANKS = 16
COMPONENT = "vllm"
REPOSITORY = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")

Runner = Callable[[Sequence[str], Path | None], int]  # argv, file for its stdout
Emit = Callable[[str], None]


@dataclass(frozen=True)
class EngineRun:
    """The engine lane of one side in its image: the identity the build wrote, the lock it was
    built from, where the bundle goes, and the command the container runs."""

    identity: Path
    lock: Path
    evidence_root: Path
    command: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """One step: a command (`argv`), or the engine lane in a container (`engine`)."""

    side: str  # "base", "head" or "compare"
    name: str
    argv: tuple[str, ...] = ()
    engine: EngineRun | None = None
    stdout: Path | None = None  # where the command's output goes (compare)

    def describe(self) -> str:
        if self.engine is not None:
            return (
                f"[{self.side}] {self.name}: docker run <image of {self.engine.identity}> "
                + " ".join(self.engine.command)
            )
        redirect = f" > {self.stdout}" if self.stdout else ""
        return f"[{self.side}] {self.name}: " + " ".join(self.argv) + redirect


@dataclass(frozen=True)
class ForkPrPlan:
    repository: str
    number: int
    head_sha: str
    base_ref: str
    work: Path
    steps: tuple[Step, ...]


def fork_url(repository: str) -> str:
    return f"https://github.com/{repository}.git"


def engine_command(out: str, nproc: int = GPU_RANKS) -> tuple[str, ...]:
    """What the container runs: the GPU source gates, then the engine lane (`gates.gated`)."""
    from harness.image.gates import gated

    run = ("dcpqual", "run", "--models", "engine", "--nproc-per-node", str(nproc))
    return gated((*run, "--backend", "nccl", "--out", out))


def _harness() -> tuple[str, ...]:
    return (sys.executable, "-m", "harness")


def plan_fork_pr(
    root: Path,
    repository: str,
    number: int,
    head_sha: str,
    fork_repo: Path,
    work: Path,
    base_ref: str = "refs/heads/main",
    lock_rel: Path = DEFAULT_LOCK,
) -> ForkPrPlan:
    """Check the inputs (nothing is written) and lay out every step."""
    if not REPOSITORY.fullmatch(repository):
        raise UsageError(f"repository {repository!r} is not OWNER/NAME")
    if number < 1:
        raise UsageError(f"pull request number must be 1 or more, not {number}")
    if not HEX40.fullmatch(head_sha):
        raise UsageError(f"head SHA {head_sha!r} is not the 40-hex commit you reviewed")
    if not base_ref.startswith("refs/heads/"):
        raise UsageError(f"base ref {base_ref!r} must be a branch, refs/heads/NAME")
    root = Path(root).resolve()
    lock = load_lock(root / lock_rel)
    locked = lock.components.get(COMPONENT)
    if locked is None:
        raise UsageError(f"{lock_rel} has no {COMPONENT} component to pin")
    wanted = fork_url(repository)
    if locked.source.repository.removesuffix(".git") != wanted.removesuffix(".git"):
        raise UsageError(
            f"{lock_rel} builds {COMPONENT} from {locked.source.repository}, not {wanted}"
        )
    # As configured (not as url.*.insteadOf rewrites it: a mirror may serve the fetches).
    origin = gitinfo.git(Path(fork_repo), "config", "--get", "remote.origin.url")
    if origin.removesuffix(".git").removesuffix("/") != wanted.removesuffix(".git"):
        raise UsageError(f"{fork_repo} is a clone of {origin}, not of {wanted}")
    harness = gitinfo.identity(root)
    if harness.dirty:
        raise UsageError(f"harness tree {root} has uncommitted changes; commit them first")
    work = Path(work).resolve()
    if work.exists() and any(work.iterdir()):
        raise UsageError(f"work folder {work} is not empty (evidence is never overwritten)")
    py = _harness()
    steps: list[Step] = []
    for side in ("base", "head"):
        tree = work / side
        lock_path = tree / lock_rel
        pin = [*py, "lock", "pin", "--component", COMPONENT, "--pr", str(number)]
        pin += ["--side", side, "--base-ref", base_ref, "--repo", str(Path(fork_repo).resolve())]
        pin += ["--lock", str(lock_path), "--expect-head", head_sha]
        message = f"Pin {COMPONENT} to {repository}#{number} ({side})"
        steps += [
            Step(
                side,
                "worktree",
                ("git", "-C", str(root), "worktree", "add", "--detach", str(tree), harness.commit),
            ),
            Step(side, "pin", tuple(pin)),
            Step(
                side,
                "commit",
                (
                    "git",
                    "-C",
                    str(tree),
                    "-c",
                    "user.name=dcpqual",
                    "-c",
                    "user.email=dcpqual@localhost",
                    "commit",
                    "-q",
                    "-m",
                    message,
                    "--",
                    str(lock_rel),
                ),
            ),
            Step(
                side,
                "image",
                (
                    *py,
                    "image",
                    "build",
                    "--context",
                    str(tree),
                    "--out",
                    str(tree / "identity.json"),
                ),
            ),
            Step(
                side,
                "engine",
                engine=EngineRun(
                    identity=tree / "identity.json",
                    lock=lock_path,
                    evidence_root=work / "evidence" / side,
                    command=engine_command("/evidence/{bundle}"),
                ),
            ),
        ]
    for form in ("markdown", "json"):
        steps.append(
            Step(
                "compare",
                form,
                (*py, "compare", "{base}", "{head}", f"--{form}"),
                stdout=work / f"compare.{'md' if form == 'markdown' else 'json'}",
            )
        )
    return ForkPrPlan(repository, number, head_sha, base_ref, work, tuple(steps))


def run_engine(run: EngineRun, emit: Emit) -> tuple[int, Path | None]:
    """The engine lane in the side's image, through gpu16's preflight and container spec; the
    exit status and the bundle it left."""
    import dataclasses
    import datetime as dt
    import os

    from harness.image import gpu_run
    from harness.image.engine import connect
    from harness.image.identity import read_identity

    identity = read_identity(run.identity)
    gpu_run.check_identity_current(identity, run.lock)
    gpu_run.require_gpus(GPU_RANKS, gpu_run.query_gpus())
    client = connect("dcpqual qualify-pr")
    name = gpu_run.evidence_name(dt.datetime.now(dt.UTC), identity)
    run.evidence_root.mkdir(parents=True, exist_ok=True)
    spec = gpu_run.gpu16_container_spec(
        identity, run.evidence_root, name, user=f"{os.getuid()}:{os.getgid()}"
    )
    command = tuple(c.replace("{bundle}", name) for c in run.command)
    spec = dataclasses.replace(spec, command=command)
    emit("$ " + " ".join(spec.to_cli_argv()))
    code = gpu_run.run_container(client, spec, emit)
    bundle = run.evidence_root / name
    return code, bundle if bundle.is_dir() else None


def _run_command(argv: Sequence[str], stdout: Path | None) -> int:
    if stdout is None:
        return subprocess.run(list(argv), check=False).returncode
    with stdout.open("w") as out:
        return subprocess.run(list(argv), stdout=out, check=False).returncode


def run_plan(
    plan: ForkPrPlan,
    emit: Emit = print,
    run: Runner = _run_command,
    engine: Callable[[EngineRun, Emit], tuple[int, Path | None]] = run_engine,
) -> int:
    """Execute the plan; the first failing step's exit code (compare's own code at the end:
    0 head no worse, 1 head regressed)."""
    bundles: dict[str, Path] = {}
    engine_codes: dict[str, int] = {}
    code = 0
    for step in plan.steps:
        emit("qualify-pr: " + step.describe())
        if step.engine is not None:
            code, bundle = engine(step.engine, emit)
            if bundle is None:
                emit(f"qualify-pr: {step.side}: the engine lane left no bundle (exit {code})")
                return code or 1
            bundles[step.side], engine_codes[step.side] = bundle, code
            continue  # a failing side is still evidence: compare says what failed
        argv = [a.format(**{k: str(v) for k, v in bundles.items()}) for a in step.argv]
        code = run(argv, step.stdout)
        usable = code in (0, 1) if step.side == "compare" else code == 0
        if not usable:
            emit(f"qualify-pr: {step.side} {step.name} exited {code}; stopping")
            return code
    if engine_codes.get("head", 0) != 0:
        emit(f"qualify-pr: the head's engine lane exited {engine_codes['head']}")
        return 1
    return code
