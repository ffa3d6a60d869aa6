#!/usr/bin/env bash
# Device check for a machine with a GPU (see the `device` tool), in one short run: on each GPU
# device tinygrad opens (or the ones named), the conformance and dtype suites, the demo with
# faults and restarts, the queue-latency benchmark and `devbridge bench --quick`; then one
# summary line per device and step. Exit 0 only if every step passed.
#
#   bash scripts/gpu_check.sh [DEVICE ...]      # default: whichever of NV, CUDA, AMD open
#
# The machine has no network: carry a built .venv with the working tree.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "no .venv: carry one built by scripts/setup" >&2; exit 2; }

devices=("$@")
if [ ${#devices[@]} -eq 0 ]; then
  for d in NV CUDA AMD; do
    "$py" -c "from tinygrad import Device; Device['$d']" >/dev/null 2>&1 && devices+=("$d")
  done
fi
[ ${#devices[@]} -gt 0 ] || { echo "gpu_check: no GPU device opens here (tried NV, CUDA, AMD)"; exit 2; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/devbridge-gpu-check.XXXXXX")  # each step's whole output
summary=()
failed=0
step() {  # step DEVICE NAME TIMEOUT COMMAND...: run one step, keep its last line for the summary
  local device=$1 name=$2 limit=$3
  shift 3
  local log="$logs/$device.$name.log"
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || failed=1
  summary+=("$(printf '%-5s %-12s rc=%-3s %s' "$device" "$name" "$rc" "$(grep -v '^\s*$' "$log" | tail -1)")")
}

for d in "${devices[@]}"; do
  "$py" -c "from devbridge.backends import tinygrad_compat as tg; print(tg.capabilities(tg.open_device('$d')))"
  step "$d" conformance 240 env DEVBRIDGE_TEST_DEVICES="$d" "$py" -m pytest -q -p no:cacheprovider \
    tests/backends/test_conformance.py tests/backends/test_dtypes.py -k "tinygrad-$d"
  step "$d" demo 120 .venv/bin/devbridge demo --device "$d" --objects 1000 --faults 0.05 --restart-every 50
  step "$d" latency 120 "$py" bench/queue_latency.py --device "$d" --busy 0.5 --rounds 3
  step "$d" bench 180 .venv/bin/devbridge bench --device "$d" --quick
done
printf '%s\n' "${summary[@]}" "logs: $logs"
exit $failed
