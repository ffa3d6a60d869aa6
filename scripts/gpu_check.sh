#!/usr/bin/env bash
# Device check for a machine with a GPU (see the `device` tool): the conformance
# suite on tinygrad's GPU device, then a copy-bandwidth run. Under 5 minutes.
#
#   bash scripts/gpu_check.sh [DEVICE]      # DEVICE: NV (default), CUDA, AMD, ...
#
# The machine has no network: carry a built .venv with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
device="${1:-NV}"
py=.venv/bin/python
[ -x "$py" ] || { echo "no .venv: carry one built by scripts/setup" >&2; exit 2; }
"$py" -c "from tinygrad import Device; Device['$device']; print('device', Device['$device'])"
DEVBRIDGE_TEST_DEVICES="$device" timeout 200 "$py" -m pytest -q -p no:cacheprovider \
  tests/test_conformance.py -k "tinygrad-$device"
timeout 80 "$py" bench/copy_bandwidth.py --device "$device" --sizes 64,65536,1048576,67108864
