#!/usr/bin/env bash
# Render the projects that bench/gpu.sh trains into build/gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
COPIER=${COPIER:-.venv/bin/copier}
rm -rf build/gpu && mkdir -p build/gpu
render() { local dest=$1; shift; "$COPIER" copy -q --trust --defaults --vcs-ref HEAD "$@" . "build/gpu/$dest"; }
render default --data package_name=proj --data 'extras=[preemption, device_data, guard, finders, ema, speed_report]'
render fp16 --data package_name=proj --data amp=fp16 --data optimizer=lamb \
    --data scheduler=onecycle --data 'extras=[preemption, device_data, guard, finders, ema]' --data channels_last=true
render ddp --data package_name=proj --data distributed=ddp --data 'extras=[preemption, device_data, guard, finders, ema]'
