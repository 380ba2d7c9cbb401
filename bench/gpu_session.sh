#!/usr/bin/env bash
# Every GPU check in one command: the CUDA tests, bench/gpu_check.py, the cold first batch of each
# loader (bench/first_batch.py, a fresh process each), then bench/gpu_train.py.
#
#   bash bench/gpu_session.sh            # on a CUDA machine, from the repository root
#
# Logs and the figures' JSON go to $OUT (default /tmp/raypipe-gpu). STEPS picks the steps (default
# "cuda_tests gpu_check first_batch gpu_train"; gpu_train_block128 also runs raypipe with 128-row blocks;
# scaling runs bench/cluster_paths.py --scaling on the machine's cores, 1, 2 and 4 CPU nodes of 3 CPUs, Ray tasks;
# scaling_nodes the same on the default path there, node workers, --scaling-path nodes);
# GPU_TRAIN_ARGS passes options to gpu_train. Each step has its own time limit and a failure does not
# stop the next one; the exit status is the number of failed steps.
#
# Where the machine lacks Ray and simplejpeg and has no package index, put a bundle in .devcarry/
# (bench/devcarry_build.sh builds it; the device tool's run needs carry [".devcarry"]) and it is
# installed into /tmp/site first: ray.tar.xz (the ray package), wheels/*.whl (what else is missing),
# optionally _jpegregion.*.so, _warp.*.so, _resample.*.so, _colorops.*.so and _affine.*.so built for that Python, photos/
# (the sample photos, copied in if the package there lacks some).
set -u
OUT=${OUT:-/tmp/raypipe-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 RAYPIPE_NO_PROGRESS=1
failed=0
step() {  # step NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, count a failure
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T), limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$OUT/$name.log"
    echo "=== $name: exit $rc"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

if ! python3 -c "import ray, simplejpeg" 2>/dev/null && [ -f .devcarry/ray.tar.xz ]; then
    t0=$(date +%s)
    rm -rf /tmp/site && mkdir -p /tmp/site && tar -xJf .devcarry/ray.tar.xz -C /tmp/site &&
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .devcarry/wheels/*.whl ||
        { echo "installing the carried bundle failed"; exit 99; }
    cp .devcarry/_jpegregion.*.so .devcarry/_warp.*.so .devcarry/_resample.*.so .devcarry/_colorops.*.so raypipe/kernels/ 2>/dev/null || true
    cp .devcarry/_affine.*.so raypipe/device/ 2>/dev/null || true
    export PYTHONPATH=/tmp/site:$PWD
    echo "carried bundle installed in $(($(date +%s) - t0)) s"
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

# sample data is made from the photos in raypipe/sample_photos; copy carried ones where that copy lacks some
python3 - <<'PY'
import pathlib, shutil
from raypipe.sample_data import PHOTO_DIR, PHOTOS
missing = [p for p in PHOTOS if not (PHOTO_DIR / p).exists()]
for p in missing:
    shutil.copy(pathlib.Path(".devcarry/photos") / p, PHOTO_DIR / p)
print("sample photos copied in:", missing or "none needed")
PY
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv |
    tee "$OUT/nvidia-smi.csv"
python3 -c "import torch, ray, timm, numpy; print('torch', torch.__version__, 'ray', ray.__version__,
'timm', timm.__version__, 'numpy', numpy.__version__)
from raypipe.kernels import decode; print('partial-decode extension:', decode._load_region_decoder() is not None)"

wants() { [[ " ${STEPS:-cuda_tests gpu_check first_batch gpu_train} " == *" $1 "* ]]; }
# every test file that has a needs_cuda test (conftest skips those without a GPU), and the device loader's
wants cuda_tests && step cuda_tests 180 python3 -m pytest -q -p no:cacheprovider tests/device/test_device_loader.py \
    $(grep -rl --include="test_*.py" needs_cuda tests)
wants gpu_check && step gpu_check 120 python3 bench/gpu_check.py
DATA=/tmp/raypipe-gpu-data
if wants first_batch || wants gpu_train || wants gpu_train_block128 || wants scaling || wants scaling_nodes; then
    python3 -c "from raypipe.sample_data import write_sample_data as w; import os
w('$DATA', classes=12, per_class=1667, workers=os.cpu_count())" && echo "sample data: $DATA"
fi
# Each loader's first batch of 256 on the GPU, from a fresh process (its imports done first), twice in
# turn for timm and the drop-in; the path that waits for Ray last, so no Ray runs beside the others.
wants first_batch && step first_batch 150 bash -c 'for loader in timm dropin timm dropin feeder; do
    python3 bench/first_batch.py "$0" --loader "$loader" --device cuda -b 256 || exit 1; done' "$DATA"
# shellcheck disable=SC2086  # GPU_TRAIN_ARGS is a list of options
wants gpu_train && step gpu_train 330 python3 bench/gpu_train.py --data $DATA --json "$OUT/gpu_train.json" ${GPU_TRAIN_ARGS:-}
# 128-row chunks for 256-image batches (the consumer packs two chunks per batch; auto_chunk_rows gives 256)
wants gpu_train_block128 && step gpu_train_block128 150 python3 bench/gpu_train.py --data $DATA --augments rrc \
    --feeds raypipe raypipe-data --chunk-rows 128 --json "$OUT/gpu_train_block128.json" ${GPU_TRAIN_ARGS:-}
# Simulated CPU nodes of 3 CPUs (ray.cluster_utils) feeding a trainer node, on this machine's 16 cores:
# images/s per augmentation CPU at 4 nodes against 1 node's.
wants scaling && step scaling 300 python3 bench/cluster_paths.py $DATA --scaling 1 2 4 --node-cpus 3 --epochs 3 \
    --json "$OUT/scaling.json"
wants scaling_nodes && step scaling_nodes 300 python3 bench/cluster_paths.py $DATA --scaling 1 2 4 --node-cpus 3 \
    --epochs 3 --scaling-path nodes --json "$OUT/scaling_nodes.json"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a "$OUT/nvidia-smi.csv"
echo "failed steps: $failed"
exit "$failed"
