"""The pytest arguments after `--`, checked with pytest's own parser before torchrun starts.

A bad pytest argument otherwise surfaces only after every rank started, as "ranks did not
finish" with pytest's error in the rank logs. Here the arguments are parsed in-process as the
ranks' pytest would parse them (no entry-point autoload, the same ini file), without running a
hook beyond option parsing: an unknown option, a missing path, or an option that cannot work
under the ranks' lockstep is one line and exit 2, before anything is written.

The parse also says whether the arguments name targets (paths, node ids) of their own: those
replace the default targets, as they replace pytest's `testpaths`; options alone narrow the
default targets (`-- -k warmup` runs suites/ filtered by `-k`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError

# Plugins that run tests in worker processes: a worker is not a rank, and the ranks' lockstep
# (every rank runs every test together) cannot hold across them.
_WORKER_PLUGINS = frozenset({"xdist", "xdist.plugin", "xdist.looponfail", "loadgroup"})
_WORKER_FLAGS = ("-n", "--numprocesses", "--dist", "--maxprocesses", "--max-worker-restart")
_LOCKSTEP = (
    "cannot run under the ranks' lockstep (dcpqual run already starts one pytest per rank; "
    "pytest-xdist workers are not ranks)"
)
# Option dests (pytest's own) that make pytest run no test body: nothing would be qualified.
_NO_TEST_BODY = {
    "collectonly": "--collect-only",
    "setuponly": "--setup-only",
    "setupplan": "--setup-plan",
    "showfixtures": "--fixtures",
    "show_fixtures_per_test": "--fixtures-per-test",
    "markers": "--markers",
}
# Option dests of pytest's cache plugin, which the ranks run without (16 ranks would race on
# one .pytest_cache).
_CACHE = {
    "lf": ("--lf", "use dcpqual run --rerun-failed BUNDLE to rerun a bundle's failed tests"),
    "failedfirst": (
        "--ff",
        "use dcpqual run --rerun-failed BUNDLE to rerun a bundle's failed tests",
    ),
    "newfirst": ("--nf", "the ranks keep no pytest cache"),
    "stepwise": ("--sw", "the ranks keep no pytest cache"),
    "stepwise_skip": ("--sw-skip", "the ranks keep no pytest cache"),
    "cacheshow": ("--cache-show", "the ranks keep no pytest cache"),
    "cacheclear": ("--cache-clear", "the ranks keep no pytest cache"),
}


@dataclass(frozen=True)
class PytestArgs:
    """The user's pytest arguments, checked, and whether they name targets of their own."""

    args: tuple[str, ...]
    names_targets: bool


def _refuse(what: str, why: str) -> UsageError:
    return UsageError(f"pytest argument {what} {why}")


def _prescan(args: Sequence[str]) -> None:
    """What pytest's parser would not refuse, or would refuse with a less useful line."""
    tokens = iter(args)
    for token in tokens:
        if token == "--":
            return  # what follows is positional for pytest
        if token in ("-h", "--help", "-V", "--version"):
            raise _refuse(token, "runs no test; see pytest --help on this machine")
        if token == "-p" or token.startswith("-p"):
            name = next(tokens, "") if token == "-p" else token[2:]
            if name.strip() in _WORKER_PLUGINS:
                raise _refuse(f"-p {name}", _LOCKSTEP)
        for flag in _WORKER_FLAGS:
            short = len(flag) == 2 and token.startswith(flag) and not token.startswith("--")
            if token == flag or token.startswith(flag + "=") or short:
                raise _refuse(token, _LOCKSTEP)


@contextlib.contextmanager
def _rank_environment() -> Iterator[None]:
    """The parse sees what a rank's pytest sees: no plugin autoload (RANK_PYTEST_ENV)."""
    from harness.launch.plan import RANK_PYTEST_ENV

    saved = {name: os.environ.get(name) for name in RANK_PYTEST_ENV}
    os.environ.update(RANK_PYTEST_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _parse(args: Sequence[str]) -> tuple[dict[str, object], list[str], bool, str]:
    """pytest's parse of `args`: options, targets, whether targets were given, pyargs flag.

    Raises UsageError with pytest's own message, last line first.
    """
    import pytest
    from _pytest.config import Config, _prepareconfig

    with _rank_environment():
        try:
            config = _prepareconfig(list(args))
        except pytest.UsageError as exc:
            raise UsageError(f"pytest arguments: {_last_line(str(exc))}") from None
        except ImportError as exc:  # a -p plugin that does not import
            raise UsageError(f"pytest argument -p: {_last_line(str(exc))}") from None
    try:
        options = dict(vars(config.option))
        given = config.args_source == Config.ArgsSource.ARGS
        return options, list(config.args), given, str(config.invocation_params.dir)
    finally:
        config._ensure_unconfigure()


def _last_line(message: str) -> str:
    """pytest's error line (its usage lines and `rootdir:` notes dropped)."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error: " in ln]
    line = errors[-1] if errors else (lines[-1] if lines else message)
    return line.split("error: ", 1)[-1] if errors else line.removeprefix("ERROR: ")


def check_pytest_args(
    args: Sequence[str], default_targets: Callable[[], Sequence[str]]
) -> PytestArgs:
    """Refuse what the ranks' pytest would refuse, or could not run in lockstep; say whether
    `args` name targets (else the default targets are run, narrowed by `args`)."""
    args = tuple(args)
    _prescan(args)
    # First parse without conftests (the suites' conftest imports torch); only if that finds
    # an unknown option are the targets' conftests loaded, as they may add options.
    try:
        options, targets, given, cwd = _parse([*args, "--noconftest"])
    except UsageError:
        retry = list(args) if _has_path(args) else [*default_targets(), *args]
        options, targets, given, cwd = _parse(retry)
    for dest, flag in _NO_TEST_BODY.items():
        if options.get(dest):
            raise _refuse(flag, "runs no test body, so nothing would be qualified")
    if options.get("maxfail"):
        raise _refuse(
            "-x/--maxfail",
            "would stop one rank alone and break the ranks' lockstep; use dcpqual run's own "
            "--maxfail N before -- (default 1, 0: never stop)",
        )
    for dest, (flag, hint) in _CACHE.items():
        if options.get(dest):
            raise _refuse(flag, f"needs pytest's cache; {hint}")
    if options.get("junitprefix"):
        raise _refuse(
            "--junit-prefix",
            "renames every test in the ranks' JUnit reports, which verify holds to the rank "
            "records by node id",
        )
    if given:
        _check_targets(targets, Path(cwd), pyargs=bool(options.get("pyargs")))
    return PytestArgs(args=args, names_targets=given)


def _has_path(args: Sequence[str]) -> bool:
    """Only to choose the retry's argument list: a bare word that exists as a path."""
    return any(not a.startswith("-") and Path(a.split("::", 1)[0]).exists() for a in args)


def _check_targets(targets: Sequence[str], cwd: Path, *, pyargs: bool) -> None:
    import pytest
    from _pytest.main import resolve_collection_argument

    for index, target in enumerate(targets):
        try:
            resolve_collection_argument(cwd, target, index, as_pypath=pyargs)
        except pytest.UsageError as exc:
            raise UsageError(f"pytest target {_last_line(str(exc))}") from None
