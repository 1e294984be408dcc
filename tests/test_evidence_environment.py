"""Environment capture: kept prefixes, redaction, secret scrubbing, source identity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from _support.locks import make_repo

from harness.evidence.environment import (
    REDACTED,
    SCRUBBED,
    capture_environment,
    cpu_features,
    filtered_env,
    scrub,
    secret_forms,
    secret_values,
)
from harness.evidence.sources import capture_sources, git_source

ENV = {
    "NCCL_DEBUG": "INFO",
    "NCCL_IB_DISABLE": "1",
    "VLLM_API_KEY": "sk-live-0123456789",
    "B12X_CACHE": "/tmp/b12x",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "HF_TOKEN": "hf_abcdefghijklmnop",
    "AWS_SECRET_ACCESS_KEY": "aws/secret+value==",
    "DB_PASSWORD": "short",
    "HOME": "/root",
    "PATH": "/usr/bin",
}


def test_filtered_env_keeps_prefixes_and_redacts_secret_names() -> None:
    kept, redacted = filtered_env(ENV)
    assert kept == {
        "B12X_CACHE": "/tmp/b12x",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_DISABLE": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "VLLM_API_KEY": REDACTED,
    }
    assert redacted == ["VLLM_API_KEY"]


def test_a_kept_variable_keeps_its_url_but_never_its_password() -> None:
    env = {"VLLM_DB_URL": "postgres://qual:pw@db:5432/x", "NCCL_DEBUG": "INFO"}
    kept, redacted = filtered_env(env)
    assert kept == {"VLLM_DB_URL": f"postgres://qual:{REDACTED}@db:5432/x", "NCCL_DEBUG": "INFO"}
    assert redacted == []


def test_secret_values_are_every_secret_looking_variable_long_enough() -> None:
    assert set(secret_values(ENV)) == {
        "sk-live-0123456789",
        "hf_abcdefghijklmnop",
        "aws/secret+value==",
    }  # "short" is too short to scrub safely; it is still never kept in `env`


def test_scrub_catches_raw_json_and_xml_forms() -> None:
    secret = 'p"a<s>s&w/o\\rd-123'
    forms = secret_forms([secret])
    for text in (
        f"token={secret}",
        json.dumps({"t": secret}),
        f"<x a={json.dumps(secret)}>{secret.replace('&', '&amp;').replace('<', '&lt;')}</x>",
    ):
        data = text.encode()
        clean, hits = scrub(data, forms)
        assert hits >= 1 and SCRUBBED.encode() in clean
        assert b"rd-123" not in clean, clean


def test_capture_environment_on_this_machine(monkeypatch) -> None:
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("TORCH_SECRET_SAUCE", "x" * 12)
    env = capture_environment(hosts=["node1", "node0", "node1", ""])
    assert env.torch == torch.__version__
    assert env.cuda == torch.version.cuda
    assert env.env["NCCL_SOCKET_IFNAME"] == "lo"
    assert env.env["TORCH_SECRET_SAUCE"] == REDACTED
    assert env.hosts == ["node0", "node1"]
    if not torch.cuda.is_available():
        assert env.device_names == ["cpu"] and env.gpus == [] and env.nccl is None


def test_the_cpus_amx_and_avx512_features_are_recorded(tmp_path: Path) -> None:
    """What vLLM's CPU platform chooses by: a host without AMX gets other MLA kernels and another
    token budget."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8 sha_ni\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_features(cpuinfo) == [
        "amx_bf16",
        "amx_int8",
        "amx_tile",
        "avx512_bf16",
        "avx512f",
        "avx2",
    ]
    cpuinfo.write_text("flags\t\t: fpu sse avx2\n")
    assert cpu_features(cpuinfo) == ["avx2"]
    assert cpu_features(tmp_path / "missing") == []
    assert capture_environment(environ={}).cpu_features == cpu_features()


# The environment as a process that has not imported torch captures it, and whether it did.
NOT_IMPORTED = """
import json, sys
from harness.evidence.environment import capture_environment
env = capture_environment(environ={}).model_dump(mode="json")
print(json.dumps({"env": env, "imported": "torch" in sys.modules}))
"""


def test_a_launcher_without_torch_imported_records_what_torch_itself_says() -> None:
    """The oracle is torch, imported here: every fact it gives, the other process wrote too."""
    proc = subprocess.run(
        [sys.executable, "-c", NOT_IMPORTED], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    facts = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_git": torch.version.git_version,
        "cuda_available": torch.cuda.is_available(),
    }
    assert {k: found["env"][k] for k in facts} == facts
    here = capture_environment(environ={}).model_dump(mode="json")
    assert found["env"] == here
    built_for_gpu = torch.version.cuda is not None or torch.version.hip is not None
    assert found["imported"] == built_for_gpu, "a CPU build imported torch for nothing"


def test_git_source_names_commit_and_tree(repo_root: Path) -> None:
    source = git_source(repo_root)
    assert source.commit is not None and len(source.commit) == 40
    assert source.tree is not None and len(source.tree) == 40 and source.tree != source.commit
    assert source.dirty is not None


def test_git_source_outside_git_is_unknown(tmp_path: Path) -> None:
    source = git_source(tmp_path, version="1.0")
    assert (source.version, source.commit, source.tree, source.dirty) == ("1.0", None, None, None)


def test_git_source_of_a_dirty_checkout_names_what_differs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "b.txt": "b\n"})
    (repo / "a.txt").write_text("changed\n")  # status " M a.txt": its first column is blank
    (repo / "new.txt").write_text("new\n")
    source = git_source(repo)
    assert source.dirty is True and source.commit is not None
    assert source.dirty_paths == ["a.txt", "new.txt"]


def test_git_source_of_a_folder_inside_a_checkout_is_unknown(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"sub/a.txt": "a\n"})
    source = git_source(repo / "sub", version="1.0")
    assert (source.version, source.commit, source.tree, source.dirty) == ("1.0", None, None, None)


def test_capture_sources_always_has_the_harness() -> None:
    assert "dcpqual" in capture_sources()


def test_a_secret_too_short_to_scrub_from_files_is_never_kept_in_env() -> None:
    env = {"NCCL_PASSWORD": "pw1", "VLLM_TOKEN": "1", "TORCH_STORE_URL": "http://u:p@h/"}
    kept, redacted = filtered_env(env)
    assert kept == {
        "NCCL_PASSWORD": REDACTED,
        "VLLM_TOKEN": REDACTED,
        "TORCH_STORE_URL": f"http://u:{REDACTED}@h/",
    }
    assert redacted == ["NCCL_PASSWORD", "VLLM_TOKEN"]
