#!/usr/bin/env bash
# Fill tools/wheels/ with what tools/gpu-smoke.sh installs on a GPU machine that has no network:
# the harness's Python needs that such a machine lacks (pydantic and its dependencies, junitparser),
# as wheels for CPython 3.12 on x86_64 Linux. pydantic-core is compiled, so it is fetched for
# cp312 manylinux x86_64 explicitly; the rest are pure Python. Versions are the ones installed in
# the Python that runs the harness's tests here, so the GPU machine runs the tested combination.
#
#   tools/gpu-smoke-wheels.sh [PYTHON]      # default .venv/bin/python; needs pip and an index
#
# The wheels are never committed (tools/wheels/ is ignored); carry the folder to the GPU machine
# with the working tree (a few MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-.venv/bin/python}"
target="${GPU_SMOKE_PYTHON:-3.12}"
abi="cp${target/./}"
dest=tools/wheels
pure=(pydantic annotated-types typing-inspection typing-extensions junitparser)

if ! "$py" -c 'import pydantic, junitparser' 2>/dev/null; then
  echo "gpu-smoke-wheels.sh: $py has no pydantic/junitparser to read versions from" >&2
  exit 2
fi
version() { "$py" -c 'import sys; from importlib.metadata import version; print(version(sys.argv[1]))' "$1"; }

specs=()
for name in "${pure[@]}"; do specs+=("$name==$(version "$name")"); done
core="pydantic-core==$(version pydantic-core)"

rm -rf "$dest"
mkdir -p "$dest"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$target" -d "$dest" "${specs[@]}"
"$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$target" --implementation cp --abi "$abi" \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 -d "$dest" "$core"
ls -1 "$dest"
du -sh "$dest"
