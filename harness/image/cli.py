"""Sub-commands of the image concern: `lock check|pin`, `image build`, `gpu16`.

- `dcpqual lock check FILE`: exit 2 with one line naming the problem, or every problem on its own
  line (stderr) and a count when there are several; `ok` and the lock's sha256 on stdout, exit 0.
- `dcpqual lock pin --component NAME --repo PATH [--lock FILE]`: fill commit and tree (and what
  else the checkout answers) from a clean local checkout; the lock is rewritten atomically.
  With `--pr N [--base-ref refs/heads/B] [--side head|base]`: fetch the fork's pull request N
  into the clone at PATH and pin its head (recorded as number + head) or the commit it branched
  from; pull requests already recorded must be ancestors of what is pinned.
- `dcpqual image build [--lock FILE] [--context DIR] [--tag TAG] [--allow-dirty] [--out FILE]`:
  build with the docker SDK and write the image identity JSON (`harness.image.identity`).
- `dcpqual gpu16 [--no-image] [--identity FILE] [--lock FILE] [--evidence-root DIR] [-- ARGS]`:
  run the suites on 16 GPUs in the built image (or on the host) with `--backend nccl`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.errors import QualificationError, UsageError

DEFAULT_LOCK = Path("images/kimi-k3-cu133-torch213/source.lock.json")
DEFAULT_IDENTITY = Path("build/image/identity.json")
DEFAULT_EVIDENCE_ROOT = Path("evidence")


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


def cmd_lock_check(args: argparse.Namespace) -> int:
    from harness.image.lock import LockError, check_lock, lock_sha256

    problems = check_lock(args.file)
    if len(problems) == 1:  # the error line itself names it: one line in all
        raise LockError(args.file, problems)
    if problems:
        for line in problems:
            print(f"{args.file}: {line}", file=sys.stderr)
        raise UsageError(
            f"{args.file}: {len(problems)} problem(s); the lock does not pin the image"
        )
    print(f"{args.file}: ok (sha256 {lock_sha256(args.file)})")
    return 0


def cmd_lock_pin(args: argparse.Namespace) -> int:
    from harness.image.lock import check_lock, pin_component, pin_pull_request

    if args.pr is not None:
        result = pin_pull_request(
            args.lock,
            args.component,
            args.repo,
            args.pr,
            args.base_ref,
            args.side,
            args.title,
            args.expect_head,
        )
    elif args.side != "head" or args.title is not None or args.expect_head is not None:
        raise UsageError("--side, --title and --expect-head are for --pr")
    else:
        result = pin_component(args.lock, args.component, args.repo)
    print(f"{args.lock}: {result.component} at {result.commit} (tree {result.tree})")
    for where in result.filled:
        print(f"  filled {where}")
    if remaining := check_lock(args.lock):
        print(
            f"{args.lock}: {len(remaining)} problem(s) remain; see dcpqual lock check",
            file=sys.stderr,
        )
    return 0


def cmd_image_build(args: argparse.Namespace) -> int:
    from harness.image.build import plan_build, run_build
    from harness.image.engine import connect
    from harness.image.lock import write_json_atomic

    plan = plan_build(args.context, args.lock, args.tag, args.allow_dirty)
    client = connect("dcpqual image build")
    console = _console()
    identity = run_build(plan, client, console.print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, identity.to_json())
    failure = identity.check_failure()
    if failure is not None:
        raise QualificationError(
            f"image {identity.image_id} failed its in-image identity check: {failure} "
            f"(identity written to {args.out})"
        )
    print(f"{identity.reference} {identity.digest} (identity: {args.out})")
    return 0


def cmd_gpu16(args: argparse.Namespace) -> int:
    from harness.image import gpu_run

    pytest_args = list(args.pytest_args)
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    console = _console()
    if args.no_image:
        return gpu_run.gpu16_on_host(args.evidence_root, pytest_args, console.print)
    return gpu_run.gpu16_in_image(
        args.identity, args.lock, args.evidence_root, pytest_args, console.print
    )


def register(subparsers: Any) -> None:
    lock = subparsers.add_parser("lock", help="check or pin the image's source lock")
    lock_sub = lock.add_subparsers(dest="lock_command", metavar="ACTION", required=True)
    check = lock_sub.add_parser("check", help="validate a source lock (exit 2 if unpinned)")
    check.add_argument("file", type=Path, metavar="FILE", help="the source lock JSON to check")
    check.set_defaults(func=cmd_lock_check)
    pin = lock_sub.add_parser("pin", help="fill a component's commit and tree from a checkout")
    pin.add_argument(
        "--component",
        required=True,
        metavar="NAME",
        help="the lock's component to pin (nccl, pytorch, vllm, b12x)",
    )
    pin.add_argument(
        "--repo",
        required=True,
        type=Path,
        metavar="PATH",
        help="a git checkout of that component at the commit to pin",
    )
    pin.add_argument(
        "--lock",
        type=Path,
        default=DEFAULT_LOCK,
        metavar="FILE",
        help=f"the lock to update (default: {DEFAULT_LOCK})",
    )
    pin.add_argument(
        "--pr", type=int, default=None, metavar="N", help="pin the fork's pull request N"
    )
    pin.add_argument(
        "--base-ref",
        default="refs/heads/main",
        metavar="REF",
        help="the branch the pull request targets (default: refs/heads/main)",
    )
    pin.add_argument(
        "--side",
        choices=("head", "base"),
        default="head",
        help="pin the pull request's head (default) or the commit it branched from",
    )
    pin.add_argument("--title", default=None, help="default: the head commit's subject")
    pin.add_argument(
        "--expect-head",
        default=None,
        metavar="SHA",
        help="refuse unless the pull request's head is this (reviewed) commit",
    )
    pin.set_defaults(func=cmd_lock_pin)

    image = subparsers.add_parser("image", help="build the source-locked image")
    image_sub = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    build = image_sub.add_parser("build", help="build the image with the docker SDK")
    build.add_argument(
        "--lock", type=Path, default=None, metavar="FILE", help=f"default: CONTEXT/{DEFAULT_LOCK}"
    )
    build.add_argument(
        "--context",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="the harness checkout sent as build context (default: .)",
    )
    build.add_argument("--tag", default=None, help="default: dcpqual/IMAGE:lock-<sha256[:12]>")
    build.add_argument(
        "--allow-dirty",
        action="store_true",
        help="build from uncommitted changes (recorded; never qualified)",
    )
    build.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_IDENTITY,
        metavar="FILE",
        help=f"image identity JSON (default: {DEFAULT_IDENTITY})",
    )
    build.set_defaults(func=cmd_image_build)

    gpu16 = subparsers.add_parser(
        "gpu16", help="run the suites on 16 GPUs with NCCL, in the built image or on the host"
    )
    gpu16.add_argument(
        "--no-image",
        action="store_true",
        help="run on the host directly (the receipt cannot say qualified)",
    )
    gpu16.add_argument(
        "--identity",
        type=Path,
        default=DEFAULT_IDENTITY,
        metavar="FILE",
        help=f"the identity `dcpqual image build` wrote (default: {DEFAULT_IDENTITY})",
    )
    gpu16.add_argument(
        "--lock",
        type=Path,
        default=DEFAULT_LOCK,
        metavar="FILE",
        help=f"the source lock the image must be built from (default: {DEFAULT_LOCK})",
    )
    gpu16.add_argument(
        "--evidence-root",
        type=Path,
        default=DEFAULT_EVIDENCE_ROOT,
        metavar="DIR",
        help=f"the folder the dated bundle is made in (default: {DEFAULT_EVIDENCE_ROOT})",
    )
    gpu16.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        metavar="-- PYTEST_ARGS",
        help="pytest arguments for every rank, as `dcpqual run` takes them after --",
    )
    gpu16.set_defaults(func=cmd_gpu16)
