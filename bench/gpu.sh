#!/usr/bin/env bash
# The GPU check, in one go on a single GPU (about 6 minutes on an H200):
#   - every rendered project below trains on CUDA (bf16, fp16 + GradScaler, compile, DDP);
#   - no host sync inside train_one_epoch (torch.cuda.set_sync_debug_mode("error"));
#   - throughput of eager fp32 against bf16 + channels_last + torch.compile, for the built-in
#     ResNet and torchvision's ResNet-18/50 at CIFAR (32 px) and ImageNet (224 px) sizes.
# Projects are rendered into build/gpu by bench/render_gpu_projects.sh (needs copier), so the
# GPU machine needs only python3 with torch, torchvision and tqdm.
# Results: $OUT (default build/gpu-results)/gpu.log and throughput.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-results}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
exec > >(tee "$OUT/gpu.log") 2>&1
P=build/gpu
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"

failures=0
check() {  # name, command...
    local name=$1; shift
    echo "=== $name"
    if ! "$@"; then echo "FAILED: $name"; failures=$((failures + 1)); fi
}
common=(--synthetic-size 20000 --batch-size 256 --workers 8)

check "default (bf16) trains on CUDA" \
    bash -c "cd $P/default && $PY train.py ${common[*]} --epochs 2 --out-dir $OUT/default"
check "fp16 + GradScaler + LAMB + 1cycle + EMA + channels_last" \
    bash -c "cd $P/fp16 && $PY train.py ${common[*]} --epochs 2 --channels-last --out-dir $OUT/fp16"
check "DDP project under torchrun on every GPU (nccl)" \
    bash -c "cd $P/ddp && $PY -m torch.distributed.run --standalone --nproc-per-node=gpu train.py ${common[*]} --epochs 2 --out-dir $OUT/ddp"
for project in default ddp; do
    check "no host sync inside train_one_epoch ($project)" \
        $PY bench/sync_check.py "$P/$project" "${common[@]}" --epochs 1 --log-interval 100000 \
        --ema --clip-grad 1 --out-dir "$OUT/sync-$project"
done

echo "model,image_size,setting,samples_per_s" > "$OUT/throughput.csv"
speed() {  # model, image size, synthetic size, batch, setting name, flags...
    local model=$1 size=$2 n=$3 batch=$4 name=$5; shift 5
    local log="$OUT/speed-$model-$size-$name.log"
    (cd $P/default && $PY train.py --model "$model" --image-size "$size" --synthetic-size "$n" \
        --batch-size "$batch" --workers 8 --epochs 2 --fresh --out-dir "$OUT/s" "$@") \
        > "$log" 2>&1 || { echo "FAILED: speed $model $size $name"; failures=$((failures + 1)); }
    # The second epoch: compilation and warm-up are over.
    local s
    s=$(grep "^epoch 2/2" "$log" | sed -E 's/.* ([0-9]+) samples\/s.*/\1/')
    echo "$model,$size,$name,$s" | tee -a "$OUT/throughput.csv"
}
for model in resnet_small resnet18; do
    speed $model 32 50000 512 eager-fp32 --amp off --no-channels-last --no-compile
    speed $model 32 50000 512 bf16-cl-compile --amp bf16 --channels-last --compile
done
for model in resnet18 resnet50; do
    speed $model 224 4000 128 eager-fp32 --amp off --no-channels-last --no-compile
    speed $model 224 4000 128 bf16-cl-compile --amp bf16 --channels-last --compile
done
echo "failures: $failures"
exit $((failures > 0))
