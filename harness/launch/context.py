"""After torchrun exits: what the launcher adds to the ranks' own files for the evidence writer.

The writer reads records, junit and logs from the folder itself (and decides killed ranks and the
root cause from them). The launcher contributes what only it knows: torchrun's exit status,
whether the run timed out, the command, and torchrun's own root-cause view from its error files
(the ranks write TORCHELASTIC_ERROR_FILE on a primary failure; the agent may copy the first into
its own). Everything becomes one `RunContext`.
"""

from __future__ import annotations

from dataclasses import fields

from harness.evidence import rules
from harness.evidence.run_context import RunContext
from harness.evidence.torchrun_errors import first_torchrun_error
from harness.image.identity import image_for_run
from harness.launch.plan import RunOptions, RunPlan
from harness.schema.launch import Launch, NodeState
from harness.schema.receipt import ChosenOptions, RequestedCount, RunExtra


def chosen_options(options: RunOptions) -> ChosenOptions:
    """The run's options a rerun or a reader needs that geometry does not say: how
    --nproc-per-node was given (auto|cpu|gpu|N) and what it resolved to, --maxfail, --tee,
    and the bundle a --rerun-failed run reran."""
    return ChosenOptions(
        nproc_per_node=RequestedCount(
            requested=options.nproc_requested or str(options.nproc_per_node),
            resolved=options.nproc_per_node,
        ),
        maxfail=options.maxfail,
        tee=list(options.tee),
        test_timeout_s=options.resolved_test_timeout,
        timeout_s=options.timeout_s,
        rerun_of=None if options.rerun_of is None else str(options.rerun_of),
    )


# RunContext's fields named like an option that do not hold the option as given: the resolved
# DCP, and the targets the ranks' pytest was given (not the user's pytest arguments).
RUN_CONTEXT_RESOLVED: frozenset[str] = frozenset({"dcp", "pytest_args"})


def run_context(
    plan: RunPlan,
    result: Launch,
    *,
    nodes: dict[int, NodeState | None] | None = None,
) -> RunContext:
    """The hand-off to `finalize_bundle`. With several nodes, the run failed if any node's
    torchrun did, and a node that never reported counts as a failure too (the rule the receipt
    is held to, `rules.launched_outcome`)."""
    options = plan.options
    extra = RunExtra(
        launch=result,
        options=chosen_options(options),
        nodes=None if nodes is None else {str(k): m for k, m in nodes.items()},
    )
    exit_code, timed_out = rules.launched_outcome(result, extra.nodes)
    error = first_torchrun_error(plan.out_dir)
    same = {f.name for f in fields(RunOptions)} - RUN_CONTEXT_RESOLVED
    return RunContext(
        **{f.name: getattr(options, f.name) for f in fields(RunContext) if f.name in same},
        world_size=options.world_size,
        dcp=options.resolved_dcp,
        command=plan.argv,
        pytest_args=plan.targets,
        exit_code=exit_code,
        timed_out=timed_out,
        started_at=result.started_at,
        finished_at=result.finished_at,
        torchrun_error=error,
        image=image_for_run(),
        extra=extra,
    )
