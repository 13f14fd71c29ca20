#!/usr/bin/env bash
# The prepared GPU check on a lent GPU machine (benchmarks/gpu_check.py): `bash benchmarks/device.sh 1`
# then `bash benchmarks/device.sh 2`, two calls on the same warm machine (the second within its 30 s idle
# window), the first carrying .device/whl and .device/part-1, the second .device/whl and .device/part-2
# (make device-bundle builds them here); then, with the device time left, `bash benchmarks/device.sh 3`
# (carrying .device/whl) for the Qwen2.5 shapes. Ask for the nvidia-h200 kind: phase 2 runs four
# processes on the one card. Results go to $OUT; what a phase keeps for the next (the first half, the
# data) waits in /tmp/ragrl-device.
set -euo pipefail
# Options after the phase go to gpu_check.py: `bash benchmarks/device.sh 2 --grpo-seconds 320 --set K=V`.
phase=${1:?usage: benchmarks/device.sh 1|2|3}
keep=/tmp/ragrl-device
mkdir -p "$keep" "${OUT:=runs/gpu-check}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "$phase" != 3 ]; then cp -r ".device/part-$phase" "$keep/"; fi
if [ "$phase" = 2 ] && [ ! -f "$keep/part-1/smollm2.whl.part1" ]; then
    echo "phase 2 needs phase 1's files in $keep: run 'benchmarks/device.sh 1' first, and this call" \
         "within the machine's 30 s warm window after it (else a fresh machine starts bare)" >&2
    exit 2
fi
if [ -f "$keep/part-1/data.tar.gz" ] && [ ! -d "$keep/data" ]; then
    mkdir -p "$keep/data" && tar xzf "$keep/part-1/data.tar.gz" -C "$keep/data"
fi
export RAGRL_SHARED_DATA=$keep/data
python3 benchmarks/gpu_check.py --phase "$phase" --out "$OUT" --work "$keep/work" --parts "$keep" "${@:2}"
