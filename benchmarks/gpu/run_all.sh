#!/usr/bin/env bash
# Every GPU measurement in one command: tests/gpu, then benchmarks/gpu/bench_gpu.py, into one
# results file (benchmarks/results/bench_gpu.json, with the tests' summary in it).
#
#   bash benchmarks/gpu/run_all.sh [--quick]
#
# On a GPU machine that reaches no package index (see ../shared/gpu/README.md): wheels in
# .whl/ at the repository root (../shared/gpu/wheels.sh, then `pip wheel --no-deps -w .whl .`)
# are installed first, into /tmp/site, where $OUT is set (the device tool) or
# DEEPX_INSTALL_WHL=1. Where $OUT is set (the device tool), the logs and the
# results file are copied there too. On a machine without a GPU it says so in one line and
# exits 1, having measured nothing.
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}

# The wheels go in on the device machine ($OUT set there) or when asked (DEEPX_INSTALL_WHL=1).
if { [ -n "${OUT:-}" ] || [ "${DEEPX_INSTALL_WHL:-}" = 1 ]; } && ls .whl/*.whl >/dev/null 2>&1; then
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "run_all.sh: installing .whl/ failed"; exit 2; }
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

why=$($python - <<'PY'
try:
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    print("" if n > 0 else "CuPy sees no CUDA device")
except Exception as e:  # no CuPy, no driver
    print(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no message'}")
PY
)
if [ -n "$why" ]; then
  echo "run_all.sh: no GPU here ($why); nothing measured"
  exit 1
fi

logs=benchmarks/results/gpu-logs
mkdir -p "$logs"
nvidia-smi > "$logs/nvidia-smi.txt" 2>&1 || true
PYTHONUNBUFFERED=1 $python -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$logs/tests_gpu.log"
tests_rc=${PIPESTATUS[0]}
PYTHONUNBUFFERED=1 $python benchmarks/gpu/bench_gpu.py --tests-log "$logs/tests_gpu.log" "$@" \
  2>&1 | tee "$logs/bench_gpu.log"
bench_rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  cp "$logs"/*.log "$logs/nvidia-smi.txt" "$OUT"/ 2>/dev/null
  cp benchmarks/results/bench_gpu*.json "$OUT"/ 2>/dev/null
fi
echo "run_all.sh: tests/gpu exit $tests_rc, bench_gpu exit $bench_rc"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
