#!/usr/bin/env bash
# The one-GPU smoke on a lent GPU machine, in one command (no network needed there):
#
#   tools/gpu-smoke.sh [dcpqual gpu-smoke options]
#
# 1. Installs, from tools/wheels/ (filled here by tools/gpu-smoke-wheels.sh and carried with the
#    working tree), each wheel whose distribution python3 lacks or has at another version, into a
#    private folder put first on PYTHONPATH; nothing is installed into the machine's Python.
# 2. Runs `python3 -m harness gpu-smoke` against the torch installed there (its version is
#    recorded), writing the bundle to $OUT/gpu-smoke when OUT is set (with the log beside it),
#    else to evidence/<UTC time>-<id>/; then `dcpqual verify` on the bundle.
# 3. Runs `python3 -m harness.smoke.b12x_check`: on an sm_12x machine with b12x and two or more
#    GPUs, the b12x channel/capture sequence on 2 NCCL ranks (bundle in $OUT/b12x); elsewhere one
#    line "b12x: NOT RUN: ..." that says why (the GPU's generation, b12x missing, one device).
#    Its log is $OUT/b12x.log.
#
# Exit: the smoke's (0 pass, 1 fail, 2 unusable: no CUDA, a missing package), or 124 at the
# time limit (GPU_SMOKE_TIMEOUT seconds, default 480); where the smoke passed, the b12x check's
# (0 passed or could not run here, 1 failed, 124 past B12X_CHECK_TIMEOUT, default 420).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
wheels=tools/wheels
site="${GPU_SMOKE_SITE:-${TMPDIR:-/tmp}/dcpqual-gpu-smoke-site}"
export PYTHONUNBUFFERED=1

# The carried wheels whose distribution is missing here or installed at another version.
mapfile -t needed < <("$py" - "$wheels" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    dist, wanted = wheel.name.split("-")[:2]
    try:
        have = version(dist)
    except PackageNotFoundError:
        have = None
    if have != wanted:
        print(wheel)
EOF
)
if [ "${#needed[@]}" -gt 0 ]; then
  echo "gpu-smoke.sh: installing ${#needed[@]} carried wheel(s) into $site"
  "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$site" "${needed[@]}"
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$py" -c 'import torch, pydantic, junitparser' 2>/dev/null; then
  echo "gpu-smoke.sh: $py cannot import torch, pydantic and junitparser; run" \
    "tools/gpu-smoke-wheels.sh where pip works and carry tools/wheels/" >&2
  exit 2
fi
"$py" -c 'import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"devices {torch.cuda.device_count() if torch.cuda.is_available() else 0}")'

args=()
log=/dev/null
if [ -n "${OUT:-}" ]; then
  args=(--out "$OUT/gpu-smoke")
  log="$OUT/gpu-smoke.log"
fi
set +e
timeout "${GPU_SMOKE_TIMEOUT:-480}" "$py" -m harness gpu-smoke "${args[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ -n "${OUT:-}" ] && [ -f "$OUT/gpu-smoke/receipt.json" ]; then
  "$py" -m harness verify "$OUT/gpu-smoke" || rc=1
fi

b12x_args=(--timeout "${B12X_CHECK_TIMEOUT:-420}")
b12x_log=/dev/null
if [ -n "${OUT:-}" ]; then
  b12x_args+=(--out "$OUT/b12x")
  b12x_log="$OUT/b12x.log"
fi
set +e
"$py" -m harness.smoke.b12x_check "${b12x_args[@]}" 2>&1 | tee "$b12x_log"
b12x_rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 0 ]; then
  rc=$b12x_rc
fi
exit "$rc"
