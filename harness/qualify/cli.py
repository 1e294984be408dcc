"""Sub-commands of the qualification concern: `dcpqual compare`, `dcpqual nightly` and
`dcpqual qualify-pr`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.terminal import printable


def register(subparsers: Any) -> None:
    compare = subparsers.add_parser(
        "compare",
        help="what changed between two evidence bundles (before/after evidence)",
        description=(
            "Verify both bundles, then report what changed from BASE to HEAD: verdict, "
            "signatures, lazy events in capture, suite tallies, environment and image. Exit 0 "
            "when HEAD is no worse than BASE, 1 when it regresses, 2 for unusable input."
        ),
    )
    compare.add_argument("base", type=Path, metavar="BASE_DIR", help="the bundle before")
    compare.add_argument("head", type=Path, metavar="HEAD_DIR", help="the bundle after")
    form = compare.add_mutually_exclusive_group()
    form.add_argument("--markdown", action="store_true", help="Markdown for a PR comment")
    form.add_argument("--json", action="store_true", help="JSON (schema dcpqual-compare/v1)")
    compare.set_defaults(func=run_compare)

    nightly = subparsers.add_parser(
        "nightly",
        help="image -> gpu16 -> verify -> compare with the newest nightly in an archive",
        description=(
            "Build the image, run gpu16 into a dated bundle in the archive, verify it and compare "
            "it with the newest earlier bundle there. Exit 0 when the run passed, verified and "
            "did not regress; 1 otherwise; a failed step's code (2: no GPU host) when it left "
            "no bundle."
        ),
    )
    nightly.add_argument(
        "--archive", type=Path, required=True, metavar="DIR", help="persistent folder of bundles"
    )
    nightly.add_argument(
        "--report", type=Path, metavar="DIR", help="write nightly.json, compare.md/.json here"
    )
    nightly.add_argument(
        "--no-image", action="store_true", help="gpu16 on the host (never qualified)"
    )
    nightly.set_defaults(func=run_nightly)

    pr = subparsers.add_parser(
        "qualify-pr",
        help="qualify a pull request of the vLLM fork: engine lane at its base and head, compare",
        description=(
            "Pin the lock's vllm component to the fork pull request's base and to its head (in "
            "two worktrees of this harness), build both images, run the engine lane in each on "
            "the GPU node and write `dcpqual compare` of the two bundles (compare.md, "
            "compare.json in the work folder). Exit 0 when the head passed and did not regress, "
            "1 otherwise; a failed step's code (2: no engine, no GPUs, unusable input)."
        ),
    )
    pr.add_argument(
        "--repository",
        required=True,
        metavar="OWNER/NAME",
        help="the fork, e.g. local-inference-lab/vllm",
    )
    pr.add_argument("--pr", type=int, required=True, metavar="N", help="the pull request number")
    pr.add_argument(
        "--head-sha",
        required=True,
        metavar="SHA",
        help="the reviewed head (40 hex); any other is refused",
    )
    pr.add_argument(
        "--fork-repo", type=Path, required=True, metavar="PATH", help="a local clone of the fork"
    )
    pr.add_argument(
        "--base-ref",
        default="refs/heads/main",
        metavar="REF",
        help="the branch the pull request targets (default: refs/heads/main)",
    )
    pr.add_argument("--work", type=Path, required=True, metavar="DIR", help="an empty folder")
    pr.add_argument(
        "--dry-run", action="store_true", help="print the plan and exit without running it"
    )
    pr.set_defaults(func=run_qualify_pr)


def run_compare(args: argparse.Namespace) -> int:
    from harness.qualify.compare import compare_bundles, load_bundle
    from harness.qualify.report import render_markdown, render_text

    comparison = compare_bundles(load_bundle(args.base), load_bundle(args.head))
    if args.json:
        print(json.dumps(comparison.to_json(), indent=2, sort_keys=True))
    elif args.markdown:
        print(printable(render_markdown(comparison)), end="")
    else:
        print(printable(render_text(comparison)), end="")
    return comparison.exit_code


def run_nightly(args: argparse.Namespace) -> int:
    from harness.qualify.nightly import main_nightly

    return main_nightly(archive=args.archive, report=args.report, no_image=args.no_image)


def run_qualify_pr(args: argparse.Namespace) -> int:
    from harness.qualify.fork_pr import plan_fork_pr, run_plan

    plan = plan_fork_pr(
        Path("."),
        args.repository,
        args.pr,
        args.head_sha,
        args.fork_repo,
        args.work,
        base_ref=args.base_ref,
    )
    if args.dry_run:
        for step in plan.steps:
            print(step.describe())
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    return run_plan(plan)
