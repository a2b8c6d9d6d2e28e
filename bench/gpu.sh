#!/usr/bin/env bash
# The GPU check, in one go on a single GPU:
#   - every rendered project below trains on CUDA (bf16, fp16 + GradScaler, compile, DDP);
#   - no host sync inside train_one_epoch (bench/sync_check.py lists any);
#   - the speed report (--speed-report) of the default project, data on the GPU and loaded;
#   - throughput of eager fp32 against bf16 + channels_last + torch.compile, for the built-in
#     ResNet and torchvision's ResNet-18/50 at CIFAR (32 px) and ImageNet (224 px) sizes.
# PART (default checks,speeds) picks the parts; its third, bench, runs the CPU benchmarks on
# the GPU (bench/run_all.py --device cuda) and writes $OUT/RESULTS-gpu.md.
# Projects are rendered into build/gpu by bench/render_gpu_projects.sh (needs copier), so the
# GPU machine needs only python3 with torch, torchvision and tqdm (and, for PART=bench,
# lightning and scikit-learn).
# Results: $OUT (default build/gpu-results)/gpu.log, throughput.csv, RESULTS-gpu.md.
# DEADLINE=S (seconds from the start) skips the throughput runs that would start after S-60.
# BENCH_FLAGS are added to run_all.py's, e.g. "--repeats 3 --only time_to_accuracy.py".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-results}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
PART=${PART:-checks,speeds}
exec > >(tee -a "$OUT/gpu.log") 2>&1
P=build/gpu
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"

failures=0
check() {  # name, command...
    local name=$1; shift
    echo "=== $name"
    local t0=$SECONDS
    if ! "$@"; then echo "FAILED: $name"; failures=$((failures + 1)); fi
    echo "=== $name: $((SECONDS - t0)) s"
}
common=(--synthetic-size 20000 --batch-size 256 --workers 8)

checks() {
    check "default (bf16) trains on CUDA" \
        bash -c "cd $P/default && $PY train.py ${common[*]} --epochs 2 --out-dir $OUT/default"
    check "fp16 + GradScaler + LAMB + 1cycle + EMA + channels_last" \
        bash -c "cd $P/fp16 && $PY train.py ${common[*]} --epochs 2 --out-dir $OUT/fp16"
    check "DDP project under torchrun on every GPU (nccl)" \
        bash -c "cd $P/ddp && $PY -m torch.distributed.run --standalone --nproc-per-node=gpu \
            train.py ${common[*]} --epochs 2 --out-dir $OUT/ddp"
    check "no host sync inside train_one_epoch (default, data on the GPU, EMA, clipping)" \
        $PY bench/sync_check.py "$P/default" "${common[@]}" --epochs 1 --log-interval 100000 \
        --clip-grad 1 --out-dir "$OUT/sync-default"
    check "no host sync inside train_one_epoch (default, DataLoader, pinned copies)" \
        $PY bench/sync_check.py "$P/default" "${common[@]}" --epochs 1 --log-interval 100000 \
        --data-on-device off --out-dir "$OUT/sync-loader"
    check "speed report of the default project on CUDA (--speed-report, its markdown kept)" \
        bash -c "cd $P/default && $PY train.py ${common[*]} --speed-report --out-dir $OUT/speed \
            && $PY train.py ${common[*]} --data-on-device off --speed-report \
            --out-dir $OUT/speed-loader"
    echo "=== host syncs inside train_one_epoch with fp16 + GradScaler + LAMB (the scaler reads"
    echo "    its scale on the host, and its step reads found_inf unless the optimizer is fused:"
    echo "    listed, not counted as a failure)"
    $PY bench/sync_check.py "$P/fp16" "${common[@]}" --epochs 1 --log-interval 100000 \
        --out-dir "$OUT/sync-fp16"
}

speed() {  # model, image size, synthetic size, batch, setting name, flags...
    local model=$1 size=$2 n=$3 batch=$4 name=$5; shift 5
    local log="$OUT/speed-$model-$size-$name.log"
    echo "--- $model $size px, $name"
    if [[ -n ${DEADLINE:-} ]] && ((SECONDS + 60 > DEADLINE)); then
        echo "skipped: DEADLINE=$DEADLINE s is too near"
        return
    fi
    (cd $P/default && timeout 240 $PY train.py --model "$model" --image-size "$size" \
        --synthetic-size "$n" --batch-size "$batch" --workers 8 --epochs 2 --fresh \
        --out-dir "$OUT/s" "$@") > "$log" 2>&1 \
        || { echo "FAILED: speed $model $size $name"; tail -5 "$log"; failures=$((failures + 1)); }
    # The second epoch: compilation and warm-up are over.
    local s
    s=$(grep "^epoch 2/2" "$log" | sed -E 's/.* ([0-9]+) samples\/s.*/\1/')
    echo "$model,$size,$name,${s:-}" | tee -a "$OUT/throughput.csv"
}

speeds() {
    echo "=== throughput: eager fp32 vs bf16 + channels_last + torch.compile"
    echo "model,image_size,setting,samples_per_s" > "$OUT/throughput.csv"
    for model in resnet_small/32/50000/512 resnet18/32/50000/512 resnet50/224/4000/128 \
        resnet18/224/4000/128; do
        IFS=/ read -r name size n batch <<< "$model"
        speed "$name" "$size" "$n" "$batch" eager-fp32 --amp off --no-channels-last --no-compile
        speed "$name" "$size" "$n" "$batch" bf16-cl-compile --amp bf16 --channels-last --compile
    done
    # One line per model and size: the speed-up of bf16 + channels_last + compile.
    awk -F, 'NR > 1 { key = $1 " " $2 " px"; v[key, $3] = $4; keys[key] = 1 }
        END { for (k in keys) if (v[k, "eager-fp32"] > 0 && v[k, "bf16-cl-compile"] > 0)
            printf "%s: %.2fx\n", k, v[k, "bf16-cl-compile"] / v[k, "eager-fp32"] }' \
        "$OUT/throughput.csv" | sort
}

benchmarks() {
    check "CPU benchmarks on the GPU (bench/run_all.py --device cuda)" \
        $PY bench/run_all.py --device cuda --project "$P/default" --output "$OUT/RESULTS-gpu.md" \
        ${BENCH_FLAGS:-}
}

for part in ${PART//,/ }; do
    case $part in
        checks) checks ;;
        speeds) speeds ;;
        bench) benchmarks ;;
        *) echo "PART is a comma-separated list of checks, speeds and bench, not $PART"; exit 2 ;;
    esac
done
echo "failures: $failures"
exit $((failures > 0))
