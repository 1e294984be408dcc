"""The GitHub workflows keep their hardening: pinned actions, least privilege, no untrusted code
on the GPU host, no template injection. actionlint and zizmor run in `nox -s lint`; these tests
pin down the project's own rules, which those tools do not know."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parent.parent / ".github" / "workflows"
NAMES = (
    "ci.yml",
    "nightly-gpu16.yml",
    "pr-qualification.yml",
    "fork-pr-qualification.yml",
    "mutants-weekly.yml",
)
GPU_LABEL = "rtx-pro-6000-x16"
GPU_GROUP = "gpu-rtx-pro-6000-x16"
PINNED_USES = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+/[\w./-]+)@([0-9a-f]{40}) # v\d+(\.\d+)*$")


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    data["on"] = data.pop(True, data.get("on"))
    return data


def jobs(name: str) -> dict[str, dict[str, Any]]:
    return load(name)["jobs"]


def steps(name: str) -> list[tuple[str, dict[str, Any]]]:
    return [(job, step) for job, spec in jobs(name).items() for step in spec.get("steps", [])]


def on_gpu_host(spec: dict[str, Any]) -> bool:
    runs_on = spec["runs-on"]
    return isinstance(runs_on, list) and "self-hosted" in runs_on


def test_the_workflows_exist() -> None:
    assert sorted(p.name for p in WORKFLOWS.glob("*.yml")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_pinned_by_commit_sha(name: str) -> None:
    lines = [line for line in (WORKFLOWS / name).read_text().splitlines() if "uses:" in line]
    assert lines
    unpinned = [line.strip() for line in lines if not PINNED_USES.match(line)]
    assert not unpinned, f"pin by full commit SHA with a '# vX.Y.Z' comment: {unpinned}"


@pytest.mark.parametrize("name", NAMES)
def test_least_privilege(name: str) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {}, "top-level permissions must be empty"
    for job, spec in workflow["jobs"].items():
        assert "permissions" in spec, f"{name}: job {job} has no explicit permissions"
        writes = {k for k, v in spec["permissions"].items() if v == "write"}
        allowed = {"pull-requests"} if (name, job) == ("pr-qualification.yml", "comment") else set()
        assert writes <= allowed, f"{name}: job {job} may not write {writes - allowed}"


@pytest.mark.parametrize("name", NAMES)
def test_checkouts_do_not_persist_credentials(name: str) -> None:
    checkouts = [s for _, s in steps(name) if s.get("uses", "").startswith("actions/checkout@")]
    assert checkouts
    for step in checkouts:
        assert step.get("with", {}).get("persist-credentials") is False


@pytest.mark.parametrize("name", NAMES)
def test_no_expressions_inside_scripts(name: str) -> None:
    """Inputs reach scripts through env only, never by `${{ }}` expansion (template injection)."""
    for job, step in steps(name):
        assert "${{" not in step.get("run", ""), f"{name}: {job}: {step.get('name', step['run'])}"


@pytest.mark.parametrize("name", NAMES)
def test_every_job_has_a_timeout(name: str) -> None:
    for job, spec in jobs(name).items():
        assert isinstance(spec.get("timeout-minutes"), int), f"{name}: job {job}"


def test_no_event_a_contributor_controls_reaches_the_gpu_host() -> None:
    for name in NAMES:
        triggers = load(name)["on"]
        assert "pull_request_target" not in triggers, name
        if any(on_gpu_host(spec) for spec in jobs(name).values()):
            assert set(triggers) <= {"schedule", "workflow_dispatch"}, (name, set(triggers))


def test_gpu_jobs_run_one_at_a_time_on_the_gpu_host() -> None:
    gpu_jobs = [
        (name, job, spec) for name in NAMES for job, spec in jobs(name).items() if on_gpu_host(spec)
    ]
    assert {(name, job) for name, job, _ in gpu_jobs} == {
        ("nightly-gpu16.yml", "nightly"),
        ("pr-qualification.yml", "base"),
        ("pr-qualification.yml", "head"),
        ("fork-pr-qualification.yml", "qualify"),
    }
    for name, job, spec in gpu_jobs:
        assert GPU_LABEL in spec["runs-on"], (name, job)
        assert spec["concurrency"] == {"group": GPU_GROUP, "cancel-in-progress": False}
        assert spec["permissions"] == {"contents": "read"}, (name, job)


def test_pr_qualification_is_dispatched_with_the_reviewed_head_and_approved() -> None:
    workflow = load("pr-qualification.yml")
    inputs = workflow["on"]["workflow_dispatch"]["inputs"]
    assert inputs["pr"]["required"] and inputs["head_sha"]["required"]
    spec = workflow["jobs"]
    for job in ("base", "head"):
        assert spec[job]["environment"] == "gpu-qualification"
    checkout_refs = {
        job: step["with"]["ref"]
        for job, step in steps("pr-qualification.yml")
        if step.get("uses", "").startswith("actions/checkout@")
    }
    assert checkout_refs == {
        "base": "${{ needs.resolve.outputs.base_sha }}",
        "head": "${{ needs.resolve.outputs.head_sha }}",
        # the comparison runs the base's code, never the head's
        "report": "${{ needs.resolve.outputs.base_sha }}",
    }
    scripts = "\n".join(step.get("run", "") for _, step in steps("pr-qualification.yml"))
    assert "dcpqual compare bundles/base bundles/head --markdown" in scripts
    assert "gh pr comment" in scripts
    # only the job that posts holds a write token, and it runs no project code
    comment = spec["comment"]
    assert not any(s.get("uses", "").startswith("actions/checkout@") for s in comment["steps"])


def test_a_fork_pull_request_is_qualified_at_the_reviewed_head_after_approval() -> None:
    """The fork's pull request, not this repository's: the reviewed head is checked when the
    pull request is resolved and again when it is pinned; the GPU job waits for approval and
    runs this repository's harness (its checkout names no other ref)."""
    workflow = load("fork-pr-qualification.yml")
    inputs = workflow["on"]["workflow_dispatch"]["inputs"]
    assert inputs["repository"]["options"] == ["local-inference-lab/vllm"]
    assert inputs["pr"]["required"] and inputs["head_sha"]["required"]
    qualify = workflow["jobs"]["qualify"]
    assert qualify["environment"] == "gpu-qualification" and qualify["needs"] == "resolve"
    checkout = next(s for s in qualify["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert "ref" not in checkout["with"]
    scripts = "\n".join(step.get("run", "") for _, step in steps("fork-pr-qualification.yml"))
    assert '[[ "$head" != "$REVIEWED_HEAD" ]]' in scripts
    assert "-s qualify_pr --" in scripts and '--head-sha "$HEAD_SHA"' in scripts
    assert '--base-ref "$BASE_REF"' in scripts and '--fork-repo "$RUNNER_TEMP/fork"' in scripts
    assert "compare.md" in scripts and "gh pr comment" not in scripts


def test_nightly_is_scheduled_and_uploads_whatever_happened() -> None:
    workflow = load("nightly-gpu16.yml")
    assert {"schedule", "workflow_dispatch"} == set(workflow["on"])
    scripts = "\n".join(step.get("run", "") for _, step in steps("nightly-gpu16.yml"))
    assert "-s nightly" in scripts and "--archive" in scripts
    uploads = [s for _, s in steps("nightly-gpu16.yml") if "upload-artifact" in s.get("uses", "")]
    assert uploads and all(s["if"] == "always()" for s in uploads)


def test_ci_runs_each_cpu_session_and_keeps_the_evidence() -> None:
    spec = jobs("ci.yml")
    assert set(spec) == {"lint", "tests", "compat", "cpu16"}
    for job in spec:
        assert not on_gpu_host(spec[job])
        assert any(f"-s {job}" in s.get("run", "") for s in spec[job]["steps"]), job
    uploads = [s for s in spec["cpu16"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert len(uploads) == 1 and uploads[0]["if"] == "always()"
    assert uploads[0]["with"]["path"] == "evidence/"


def test_mutants_run_weekly_on_a_hosted_runner_and_keep_the_report() -> None:
    workflow = load("mutants-weekly.yml")
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    (cron,) = [entry["cron"] for entry in workflow["on"]["schedule"]]
    assert cron.split()[2:4] == ["*", "*"] and cron.split()[4] != "*", f"weekly, got {cron!r}"
    (spec,) = workflow["jobs"].values()
    assert not on_gpu_host(spec)
    runs = [s["run"] for s in spec["steps"] if "run" in s]
    assert "nox --non-interactive -s mutants" in runs
    uploads = [s for s in spec["steps"] if "upload-artifact" in s.get("uses", "")]
    assert len(uploads) == 1 and uploads[0]["if"] == "always()"
    assert uploads[0]["with"]["path"] == "mutants-results/"
