#!/usr/bin/env bash
# The GPU checks of issue 40, as one script for a lent GPU machine (the
# device tool: no Java, no pyspark, no network; python3 has CuPy and
# PyTorch CUDA).  Run from the repository root:
#
#   bash scripts/gpu_run.sh [STAGE ...]      (default: build tests lenet kernels)
#
# Stages: build (the Cython extension for this Python), tests (every `gpu`
# test), csrc (the CUDA sources as C and, with nvcc, as PTX), lenet / resnet / lstm (CuPy step against PyTorch CUDA at batch
# 64, 256, 1024), kernels (the GPU kernels against the device copy),
# torch (TorchModel on CUDA against the plain torch loop), inference
# (predict on the GPU against the CPU), executor (the executor task
# functions with a task context naming the GPU, against the CPU), diag
# (where the fixed costs go: benchmarks/diag_gpu.py).
# Results go to $OUT (or ./gpu_out): one JSON per benchmark and one log.
# pyspark's Python sources (no jars) may be carried in .gpucarry/site so
# that the executor modules import; no JVM is started.
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[ -d .gpucarry/site ] && export PYTHONPATH="$PYTHONPATH:$PWD/.gpucarry/site"
PY=${PY:-python3}
LOG="$OUT/gpu_run.log"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build tests lenet kernels)

say() { echo "=== $(date +%T) $*" | tee -a "$LOG"; }
run() {  # run LIMIT_S CMD...: one step, bounded, its output in the log
    local limit=$1; shift
    say "$*"
    local t0=$SECONDS
    timeout "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    say "rc=$rc in $((SECONDS - t0)) s"
    return $rc
}

for stage in "${stages[@]}"; do
    case $stage in
    info)
        { nvidia-smi; $PY -c "import sys, numpy, cupy, torch; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, torch.version.cuda)"; } >>"$LOG" 2>&1 ;;
    build)
        run 240 $PY setup.py build_ext --inplace -j 16 ;;
    tests)
        run 330 $PY -m pytest -q -m gpu -p no:cacheprovider --timeout 90 --junitxml="$OUT/gpu_tests.xml" \
            tests/test_gpu_conv.py tests/test_gpu_executor.py tests/test_nn_layers_new.py tests/test_nn_network.py \
            tests/test_nn_recurrent.py tests/test_nn_step.py tests/test_ops_gpu.py tests/test_sharing_algorithm.py \
            tests/test_torch.py tests/test_device_checks.py ${GPU_TESTS_EXTRA:-} ;;
    csrc)
        run 120 $PY -m pytest -q -p no:cacheprovider tests/test_cuda_sources.py ;;
    lenet|resnet|lstm)
        run 150 $PY benchmarks/bench_lenet.py --gpu --model "$stage" --steps "${STEPS:-200}" --out "$OUT/${stage}_gpu.json" ;;
    kernels)
        run 180 $PY benchmarks/bench_kernels.py --gpu --out "$OUT/kernels_gpu.json" ;;
    diag)
        run 150 $PY benchmarks/diag_gpu.py --out "$OUT/diag_gpu.txt" --sections "${DIAG_SECTIONS:-encode,count,torch,resnet}" ;;
    torch|inference|executor)
        run 200 $PY "benchmarks/bench_gpu_${stage}.py" --out "$OUT/${stage}_gpu.json" ;;
    *)
        say "unknown stage $stage"; exit 2 ;;
    esac
done
say "done"
