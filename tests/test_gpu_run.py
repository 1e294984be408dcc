"""The 16-GPU run: the docker run spec, GPU preflight, and failing closed without hardware."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _support.identities import IMAGE_ID, RTX, make_identity, write_identity
from _support.locks import pinned_lock_data, write_lock

from harness.cli import main
from harness.errors import UsageError
from harness.image import gpu_run
from harness.image.gpu_run import GpuInfo, GpuUnavailable
from harness.image.identity import IDENTITY_ENV, ImageIdentity, image_for_run
from harness.schema.image import Image


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    return write_lock(tmp_path / "source.lock.json", pinned_lock_data())


@pytest.fixture
def identity(lock_file: Path) -> ImageIdentity:
    return make_identity(lock_file)


# --- the container spec ----------------------------------------------------------------------


def test_spec_follows_the_rules(identity: ImageIdentity, tmp_path: Path) -> None:
    spec = gpu_run.gpu16_container_spec(identity, tmp_path / "evidence", "RUN", ["-k", "warm"])
    assert spec.image == IMAGE_ID, "started by digest, never by tag"
    assert spec.privileged is False
    assert spec.ipc_mode == "host"
    assert spec.memlock == -1
    assert spec.gpus == "all"
    assert spec.mounts == (gpu_run.Mount(str((tmp_path / "evidence").resolve()), "/evidence"),)
    assert spec.environment["NCCL_P2P_LEVEL"] == "SYS"
    assert spec.environment["NCCL_IB_DISABLE"] == "1"
    assert json.loads(spec.environment[IDENTITY_ENV]) == identity.to_json()
    run = (
        "dcpqual", "run", "--nproc-per-node", "16", "--backend", "nccl",
        "--models", "stand-in,engine", "--out", "/evidence/RUN", "--", "-k", "warm",
    )  # fmt: skip
    assert spec.command[:2] == ("sh", "-c"), "the GPU source gates run first, in one shell"
    gates, _, rest = spec.command[2].partition("; g=$?; ")
    assert gates.startswith("python -m harness.image.gates --where gpu ")
    assert shlex.join(run) in rest, "then the run itself, unchanged"
    assert rest.endswith('exit "$g"'), "a failed gate fails a passing run"


def test_the_gpu_node_runs_the_engine_lane_with_the_production_kimi_launch() -> None:
    """What `--models stand-in,engine` starts on 16 NCCL ranks: Kimi-K3 with its MTP draft,
    the B12X_MLA backend and its env gate, DCP = TP = 16, CUDA graphs at the capture sizes."""
    from harness.engine.settings import resolve_settings
    from harness.launch.cli import options_from_args
    from harness.launch.plan import rank_plan

    argv = gpu_run.run_argv(16, "/evidence/RUN")
    assert argv[argv.index("--models") + 1] == "stand-in,engine"
    parser = argparse.ArgumentParser()
    from harness.launch import cli

    sub = parser.add_subparsers()
    cli.register(sub)
    args = parser.parse_args(list(argv[1:]))
    options = options_from_args(args, environ={})
    plan = rank_plan(options, Path("/evidence/RUN"))
    assert (plan.models, plan.dcp) == ("stand-in,engine", 16)
    settings = resolve_settings(
        gpu=True,
        dcp=plan.resolved_dcp(16),
        dcp_comm_backend=plan.dcp_comm_backend,
        model=plan.engine_model,
        config=plan.engine_config,
        args=plan.engine_args,
        env=plan.engine_env,
    )
    assert settings.model == "kimi-k3"
    assert settings.env == {"VLLM_USE_B12X_DCP_A2A": "1"}
    kwargs = settings.kwargs(Path("/m"), 16)
    assert kwargs["attention_backend"] == "B12X_MLA"
    assert (kwargs["tensor_parallel_size"], kwargs["decode_context_parallel_size"]) == (16, 16)
    assert kwargs["distributed_executor_backend"] == "external_launcher"
    assert kwargs["compilation_config"] == {
        "cudagraph_mode": "FULL_AND_PIECEWISE",
        "cudagraph_capture_sizes": [1, 2, 4, 8],
    }
    assert kwargs["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert "enforce_eager" not in kwargs


def test_spec_as_sdk_kwargs(identity: ImageIdentity, tmp_path: Path) -> None:
    kw = gpu_run.gpu16_container_spec(identity, tmp_path, "RUN", user="1000:1000").to_sdk_kwargs()
    assert kw["privileged"] is False and kw["ipc_mode"] == "host" and kw["detach"] is True
    (request,) = kw["device_requests"]
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
    limits = {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}
    assert limits["memlock"] == (-1, -1)
    assert kw["volumes"] == {str(tmp_path.resolve()): {"bind": "/evidence", "mode": "rw"}}
    assert kw["user"] == "1000:1000" and kw["working_dir"] == "/opt/dcpqual/src"
    assert "cap_add" not in kw and "devices" not in kw


def test_spec_as_docker_run_line(identity: ImageIdentity, tmp_path: Path) -> None:
    argv = gpu_run.gpu16_container_spec(identity, tmp_path, "RUN").to_cli_argv()
    assert "--privileged" not in argv
    assert argv[:4] == ["docker", "run", "--rm", "--gpus"] and argv[4] == "all"
    assert "--ipc=host" in argv
    assert argv[argv.index("--ulimit") + 1] == "memlock=-1:-1"
    assert f"{tmp_path.resolve()}:/evidence:rw" in argv
    assert "NCCL_P2P_LEVEL=SYS" in argv and "NCCL_IB_DISABLE=1" in argv
    assert f"{IDENTITY_ENV}=..." in argv  # the identity JSON is passed, not printed
    command = argv[argv.index(IMAGE_ID) + 1 :]
    assert command[:2] == ["sh", "-c"] and "dcpqual run --nproc-per-node 16" in command[2]


def test_evidence_name_is_dated_and_names_the_digest(identity: ImageIdentity) -> None:
    now = dt.datetime(2026, 5, 1, 12, 30, 5, tzinfo=dt.UTC)
    assert gpu_run.evidence_name(now, identity) == "20260501T123005Z-gpu16-eeeeeeeeeeee"
    assert gpu_run.evidence_name(now, None) == "20260501T123005Z-gpu16-host"


# --- GPU preflight ---------------------------------------------------------------------------


def test_parse_nvidia_smi() -> None:
    text = "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 590.10\n" * 2
    gpus = gpu_run.parse_nvidia_smi(text)
    assert len(gpus) == 2 and gpus[0].memory_mib == 97887 and gpus[0].driver == "590.10"
    with pytest.raises(GpuUnavailable, match="cannot read nvidia-smi"):
        gpu_run.parse_nvidia_smi("garbage\n")


def test_require_gpus_names_what_it_found() -> None:
    gpu_run.require_gpus(16, [RTX] * 16)
    with pytest.raises(GpuUnavailable, match=r"found 1 NVIDIA GPU\(s\) \(NVIDIA H200\); .*16"):
        gpu_run.require_gpus(16, [GpuInfo(0, "NVIDIA H200", 143771, "570")])
    with pytest.raises(GpuUnavailable, match="found 0 NVIDIA GPU"):
        gpu_run.require_gpus(16, [])


def test_query_gpus_without_a_driver() -> None:
    def no_binary(*_: Any, **__: Any) -> Any:
        raise FileNotFoundError("nvidia-smi")

    with pytest.raises(GpuUnavailable, match="nvidia-smi not found"):
        gpu_run.query_gpus(run=no_binary)

    def failing(*_: Any, **__: Any) -> Any:
        return subprocess.CompletedProcess([], 9, "", "NVIDIA-SMI has failed\nno driver\n")

    with pytest.raises(GpuUnavailable, match="nvidia-smi failed: NVIDIA-SMI has failed no driver"):
        gpu_run.query_gpus(run=failing)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has a driver")
def test_gpu16_host_fails_closed_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["gpu16", "--no-image", "--evidence-root", str(tmp_path / "ev")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dcpqual gpu16: error: no NVIDIA driver here: nvidia-smi not found"]
    assert not (tmp_path / "ev").exists()


def test_gpu16_host_refuses_fewer_than_16(tmp_path: Path) -> None:
    with pytest.raises(GpuUnavailable, match="needs 16"):
        gpu_run.gpu16_on_host(tmp_path / "ev", [], print, gpus=lambda: [RTX] * 8)
    assert not (tmp_path / "ev").exists()


# --- image preflight: everything before an engine ---------------------------------------------


def test_gpu16_without_an_identity_says_build_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["gpu16", "--identity", str(tmp_path / "none.json")])
    assert code == 2
    assert "build the image first (nox -s image)" in capsys.readouterr().err


def test_gpu16_refuses_an_image_of_another_lock(
    tmp_path: Path, identity: ImageIdentity, lock_file: Path
) -> None:
    ident = write_identity(tmp_path / "identity.json", identity)
    lock_file.write_text(lock_file.read_text() + " ")
    with pytest.raises(UsageError, match="rebuild with nox -s image"):
        gpu_run.gpu16_in_image(ident, lock_file, tmp_path / "ev", [], print, gpus=lambda: [RTX])


def test_gpu16_refuses_an_image_that_failed_its_check(tmp_path: Path, lock_file: Path) -> None:
    ident = write_identity(tmp_path / "identity.json", make_identity(lock_file, False))
    with pytest.raises(UsageError, match="failed its in-image identity check: cuda"):
        gpu_run.gpu16_in_image(ident, lock_file, tmp_path / "ev", [], print, gpus=lambda: [RTX])


def test_gpu16_in_image_needs_16_gpus_then_an_engine(
    tmp_path: Path, identity: ImageIdentity, lock_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ident = write_identity(tmp_path / "identity.json", identity)
    with pytest.raises(GpuUnavailable, match="found 1 NVIDIA GPU"):
        gpu_run.gpu16_in_image(ident, lock_file, tmp_path / "ev", [], print, gpus=lambda: [RTX])
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(UsageError, match="no Docker engine reachable"):
        gpu_run.gpu16_in_image(
            ident, lock_file, tmp_path / "ev", [], print, gpus=lambda: [RTX] * 16
        )
    assert not (tmp_path / "ev").exists()


# --- identity: round trip, what a receipt may claim -------------------------------------------


def test_identity_round_trip_and_bad_schema(identity: ImageIdentity) -> None:
    assert ImageIdentity.from_json(json.loads(json.dumps(identity.to_json()))) == identity
    with pytest.raises(UsageError, match="not an image identity"):
        ImageIdentity.from_json({"schema": "other"})
    broken = identity.to_json()
    del broken["digest"]
    with pytest.raises(UsageError, match="digest"):
        ImageIdentity.from_json(broken)
    with pytest.raises(UsageError, match=r"image identity: harness\.surprise: Extra inputs"):
        ImageIdentity.from_json({**identity.to_json(), "harness": {"surprise": 1}})
    with pytest.raises(UsageError, match="image identity: digest: String should match"):
        ImageIdentity.from_json({**identity.to_json(), "digest": "latest"})


def test_what_the_in_image_check_holds_against_an_image(
    identity: ImageIdentity, lock_file: Path
) -> None:
    assert identity.check_failure() is None
    failed = make_identity(lock_file, runtime_ok=False)
    assert failed.check_failure() == "cuda: expected 13.3, found none"
    assert identity.model_copy(update={"runtime": None}).check_failure() == "the check did not run"


def test_qualification_blockers(identity: ImageIdentity, lock_file: Path) -> None:
    assert identity.qualification_blockers() == []
    failed = make_identity(lock_file, runtime_ok=False)
    assert failed.qualification_blockers() == [
        "the in-image identity check failed: cuda: expected 13.3, found none"
    ]
    dirty = Image.model_validate(
        {**identity.to_json(), "harness": {"dirty": True}, "runtime": None}
    )
    assert dirty.qualification_blockers() == [
        "image was built from a dirty harness tree",
        "the in-image identity check did not run",
    ]


def test_image_for_run_is_none_outside_an_image_and_honest_inside(
    identity: ImageIdentity, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(IDENTITY_ENV, raising=False)
    assert image_for_run() is None
    monkeypatch.setenv(IDENTITY_ENV, json.dumps(identity.to_json()))
    monkeypatch.setenv("DCPQUAL_LOCK", identity.lock_path)
    monkeypatch.setenv("DCPQUAL_IMAGE_ROOT", str(tmp_path))
    image = image_for_run()
    assert image is not None and image.digest == IMAGE_ID
    assert image.runtime is not None and image.runtime.ok is False  # CPU torch: the check says so
    assert image.qualification_blockers()


def test_identity_fits_the_receipt_image_schema(identity: ImageIdentity) -> None:
    """The contract with the evidence writer: its `Image` model reads our dict as is."""
    from harness.schema.image import Image

    image = Image.model_validate(identity.to_json())
    assert image.digest == IMAGE_ID
    assert image.source_lock_sha256 == identity.source_lock_sha256
    assert image.reference == identity.reference
