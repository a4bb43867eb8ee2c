# Sourced by run.sh and backends.sh with their arguments, [--quick] [OUTPUT_DIR]: sets $root (the repository),
# $quick (1 or 0), $out (OUTPUT_DIR made absolute; benchmarks/gpu/results by default) and $python (PYTHON or python3).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
out="$(mkdir -p "${1:-$root/benchmarks/gpu/results}" && cd "${1:-$root/benchmarks/gpu/results}" && pwd)"
python="${PYTHON:-python3}"
