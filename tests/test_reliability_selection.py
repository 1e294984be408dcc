"""Whatever narrows what pytest collects is a `selection` limitation; a module skipped at
collection is a skipped test. Real `dcpqual run` launches at 2 ranks.

What the ranks collected is held to the harness's own suites/ (its files, found by the harness,
not by the rootdir) and to its collection rules, whatever the targets: an ini override given
with -o or in PYTEST_ADDOPTS, another configuration file, a folder with a suites/ of its own, a
conftest hook that takes tests away without deselecting them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _support.runs import SUITES, receipt

from harness.cli import main
from harness.rank.plugin import HARNESS_SUITES

pytestmark = [pytest.mark.torchrun]

WORLD = 2
FOREIGN_CONFTEST = """\
def pytest_collection_modifyitems(items):
    del items[1:]  # quietly: no pytest_deselected
"""


def launch(out: Path, *pytest_args: str) -> int:
    argv = ["run", "--nproc-per-node", str(WORLD), "--tp", str(WORLD), "--out", str(out)]
    return main([*argv, "--", *pytest_args])


def foreign_folder(root: Path) -> Path:
    """A folder with its own suites/ and pytest.ini: a hook narrows it, two modules skip."""
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    suites = root / "suites"
    suites.mkdir()
    (suites / "conftest.py").write_text(FOREIGN_CONFTEST)
    (suites / "test_kept.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (suites / "test_module_skip.py").write_text(
        "import pytest\npytest.skip('not here', allow_module_level=True)\n"
        "def test_never():\n    assert False\n"
    )
    (suites / "test_import_skip.py").write_text(
        "import pytest\npytest.importorskip('no_such_module_anywhere')\n"
        "def test_never():\n    assert False\n"
    )
    return root


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[int, dict[str, Any], Path]]:
    base = tmp_path_factory.mktemp("selection")
    out: dict[str, tuple[int, dict[str, Any], Path]] = {}

    def record(name: str, code: int) -> None:
        out[name] = (code, receipt(base / name), base / name)

    # The harness's own whole suites/, narrowed to nothing by an ini override.
    record("ini", launch(base / "ini", "-o", "python_files=nomatch_*.py", str(HARNESS_SUITES)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTEST_ADDOPTS", "-o python_functions=test_world*")
        record("addopts", launch(base / "addopts", str(SUITES / "rank_pass.py")))
    folder = foreign_folder(base / "foreign-folder")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        record("foreign", launch(base / "foreign", "suites"))
    return out


def selection(data: dict[str, Any]) -> str:
    return {i["key"]: i["text"] for i in data["limitation_items"]}["selection"]


def test_an_ini_override_of_the_whole_suites_is_a_narrowed_selection(runs) -> None:
    code, data, out = runs["ini"]
    text = selection(data)
    assert "pytest targets other than" not in text  # the target was the whole suites/
    assert "python_files is 'nomatch_*.py', not 'test_*.py *_test.py'" in text
    assert "files of the harness's suites/ that gave no test: suites/" in text
    assert data["status"] != "qualified" and code == 1  # nothing selected: a failing run
    assert main(["verify", str(out)]) == 0


def test_an_ini_override_in_pytest_addopts_is_named(runs) -> None:
    code, data, out = runs["addopts"]
    assert code == 0 and data["verdict"] == "pass"
    assert "python_functions is 'test_world*', not 'test'" in selection(data)
    assert main(["verify", str(out)]) == 0


def test_a_foreign_suites_folder_is_not_the_harness_s_whole_suites(runs) -> None:
    code, data, out = runs["foreign"]
    assert code == 0 and data["verdict"] == "pass" and data["status"] == "source-qualified"
    text = selection(data)
    assert "pytest targets other than the whole suites/ folder: suites" in text
    assert "tests collected from outside the harness's suites/: suites/test_" in text
    assert "suites/test_kept.py" in data["selection"]["outside"]
    assert "suites/transport/test_gather.py" in data["selection"]["unreached"]
    assert "1 collected tests taken away without being deselected" in text
    assert "a conftest.py from outside the harness" in text
    assert "pytest.ini, not " in text
    assert main(["verify", str(out)]) == 0


def test_modules_skipped_at_collection_are_skipped_tests(runs) -> None:
    _, data, _ = runs["foreign"]
    assert data["coverage"]["skipped_everywhere"] == 2
    skipped = {i["key"]: i["text"] for i in data["limitation_items"]}["skipped"]
    assert "2 test(s) skipped on every rank" in skipped
    assert data["coverage"]["first_skipped_everywhere"].startswith("suites/test_")


def test_only_what_narrowed_a_run_is_named(runs) -> None:
    """Negative control: the PYTEST_ADDOPTS run names its one rule and its one file, no
    hook and no skip."""
    _, data, _ = runs["addopts"]
    assert data["selection"]["rules"] == ["python_functions is 'test_world*', not 'test'"]
    assert data["selection"]["outside"] == ["tests/rank_suites/rank_pass.py"]
    assert data["selection"]["removed"] == 0 and data["coverage"]["skipped_everywhere"] == 0
