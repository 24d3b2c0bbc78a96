#!/usr/bin/env bash
# The GPU evidence of docs/benchmarks/ (the *-gpu-*.md files), in parts that each fit one device command:
#
#   bash tools/gpu_session.sh PART... [--out DIR] [--pack]
#
#   tests       pytest -m gpu (every config in bf16, FSDP/ZeRO-3 kill+resume, bf16 vs fp32, offload memory)
#   strategies  every config on one GPU: BERT-base shape, 384 tokens, batch 32, bf16, fixed length; report + planner check
#   speed       two epochs of SQuAD v1.1 (all 87,599 questions) with the BERT-base shape; then the fixed-length MFU run
#   ablation    each speed feature flipped alone, BERT-base shape on 384-token SQuAD windows, two runs each
#   accuracy    MiniLM (all-MiniLM-L6-v2) fine-tuned 2 epochs on SQuAD minus its last 40 articles, scored on those
#   hf          transformers' run_qa_no_trainer.py on the same model, data and hyper-parameters (tools/hf_example.sh)
#   profile     --profile of the fixed-length BERT-base step: the top kernels and host operators
#   zeroprofile the same under ZeRO-2 and single at batch 32 (the strategy table's step)
#   compiled    the two epochs compiled whole, then by layer (--torch_compile_regional), then with CUDA graphs
#   mfu         the fixed-length run's levers past --torch_compile: CUDA graphs, and batch 128 compiled and with graphs
#               (MFU_RUNS picks among graphs compiled-b128 graphs-b128 autotune-b128: max-autotune at batch 128)
#   fixed       the fixed-length run alone, eager then with --torch_compile
#   overhead    qa_train's step against tools/bare_loop.py's on MiniLM: how much of a host-bound step is ours
#   vshf        transformers' run_qa_no_trainer.py, then qa_train with its defaults, on the same BERT-base work
#               (VS_PAIRS pairs, A B A B; VS_SIDES=qa reruns qa_train's side alone, VS_SIDES=hf the example's;
#               VS_QA2_FLAGS adds a qa_train run with those flags; VS_STEPS, default 1500); training samples/s and
#               whole-process wall of each
#   twoepochs   the two epochs compiled, with an empty compile cache, then again with it warm (TWOEPOCHS=warm: the
#               second alone; TWOEPOCHS_FLAGS=best: with the flags of hostlevers' fastest run on this machine)
#   hostlevers  the two epochs' host-bound step (compiled, grouped batches of 64) 600 steps at a time: compiled,
#               with CUDA graphs, each again with --pad_to_multiple_of 32 (11 widths an epoch instead of 41);
#               HOSTLEVERS picks among those and graphs-regional-m32 (graphs over layers compiled one by one)
#   cprofile    --profile of the compiled fixed-length step at batch 128, with its kernels grouped by kind
#   gprofile    the same of the two epochs' step (compiled, length-grouped batches of 64, dynamic padding), after
#               130 steps, when most padded widths have been met; GPROFILE_FLAGS adds flags (e.g. CUDA graphs;
#               best: hostlevers' fastest)
#   startup     each import's seconds, then a short launch with every line stamped: where a run's start goes
#
# DEADLINE_S=N stops the parts still running N seconds from the start (a device command has 10 minutes) and
# skips the rest; DEADLINE_AT=<epoch seconds> does the same at a fixed moment, stamped before .device/setup.sh
# (whose install took 40 s on a cold machine and let a part outrun the command's limit). TESTS_K reruns some
# tests, STRATEGIES some configs (STRATEGY_REPEATS=2 runs each twice, all configs once before the second round),
# ABLATION_REPEATS=1 halves the ablation.
# Results: runs/gpu/<run>/ and, per part, a summary in --out. --pack leaves in --out only session.log, speed.txt,
# vshf.txt and results.tar.gz holding the rest: a device command returns at most 8 files from $OUT. It packs after
# every part, so a command killed mid-part still returns the parts before it.
#
# Needs: .device/ from `bash ../shared/device/prepare.sh --with-data --with-minilm` (SQuAD train set, MiniLM),
# set up with `bash .device/setup.sh && . .device/env.sh`. DRY=1 runs every part a few steps on CPU data
# sizes, to check the commands before spending GPU time.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-runs/gpu}
parts=() inner= pack=0
while (($#)); do
  case $1 in
    --out) OUT_DIR=$2; shift 2 ;; --inner) inner=$2; shift 2 ;; --pack) pack=1; shift ;; *) parts+=("$1"); shift ;;
  esac
done
mkdir -p "$OUT_DIR"
RUNS=${RUNS:-runs/gpu}
DATA=${DATA:-/tmp/squad}
MINILM=.device/minilm
BASE=qa_train/assets/bert-base-shape
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export QA_TRAIN_CACHE=${QA_TRAIN_CACHE:-/tmp/qa_train_cache}

# A dry run shrinks every run (the flags go last, so they win) and runs on CPU.
small=() small_eval=() bench_small=() cpu=() strategy_steps=60 ablation_steps=100 ablation_repeats=${ABLATION_REPEATS:-2}
if [[ ${DRY:-0} == 1 ]]; then
  # No warm-up: the accuracy runs' 500 steps would be refused as longer than 3.
  small=(--max_train_samples 300 --max_train_steps 3 --per_device_train_batch_size 4 --num_warmup_steps 0)
  small_eval=(--max_eval_samples 40 --per_device_eval_batch_size 8)  # only where the run evaluates: --no_eval refuses them
  bench_small=(--max_train_samples 300 --per_device_train_batch_size 2 --max_seq_length 128 --doc_stride 32
               --throughput_warmup_steps 0)
  cpu=(--cpu) strategy_steps=2 ablation_steps=2 ablation_repeats=1
  # Without native bf16 (AVX-512 BF16 or AMX) a CPU's compiled bf16 matrix products crawl: >15 min for 3 steps.
  grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo || { small+=(--mixed_precision no); bench_small+=(--mixed_precision no); }
fi

log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT_DIR/session.log"; }

data() {
  [[ -f $DATA/train-full.json && -f $DATA/train.json && -f $DATA/dev.json ]] && return
  mkdir -p "$DATA"
  # Through a temporary name: a part stopped by its deadline must not leave a half file the next one trusts.
  xz -dc .device/squad-train-v1.1-reconstructed.json.xz > "$DATA/.train-full.json.tmp"
  mv "$DATA/.train-full.json.tmp" "$DATA/train-full.json"
  $PY tools/squad_split.py .device/squad-train-v1.1-reconstructed.json.xz --holdout_articles 40 --out_dir "$DATA"
}

summary() {  # the figures of one run, from its metrics.json
  $PY - "$@" <<'PY'
import json, sys
for d in sys.argv[1:]:
    m = json.load(open(f"{d}/metrics.json"))
    keys = ("train_runtime_s", "train_steps", "num_train_features", "train_samples_per_second", "train_tokens_per_second",
            "train_padded_tokens_per_second", "mfu", "tflops_per_device", "compile_time_s", "compiled_graphs",
            "compile_cache_hits", "compile_cache_misses",
            "train_loss", "exact_match", "f1", "eval_runtime_s", "total_runtime_s", "startup_s", "startup_launch_s",
            "startup_process_s", "startup_build_s")
    print(d, {k: m.get(k) for k in keys}, "peak GiB", m["peak_memory_gb"]["max"], "device", m.get("device"))
PY
}

cpu_adam() {  # DeepSpeed JIT-builds its CPU Adam for the offload configs at first use (~1 min): not inside a timed run
  [[ ${DRY:-0} == 1 ]] || $PY -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
    > /dev/null 2>&1 || log "CPU Adam build failed (offload runs will try again)"
}

part_tests() {  # TESTS_K: a pytest -k expression, to rerun some
  log "tests"
  [[ -z ${TESTS_K:-} || ${TESTS_K} == *offload* ]] && cpu_adam  # a rerun of tests without offload needs no CPU Adam
  local k=() n=()
  [[ -n ${TESTS_K:-} ]] && k=(-k "$TESTS_K")
  $PY -c "import xdist" 2>/dev/null && n=(-n 4)  # four at once where pytest-xdist is installed
  # The out-of-memory test fills the GPU before it fails: alone, after the others, so none of theirs fails with it.
  timeout ${TESTS_TIMEOUT_S:-360} $PY -m pytest -m "gpu and not oom_alone" tests/integration/test_gpu.py tests/unit/test_monitor.py \
    "${n[@]}" -v -rA -p no:cacheprovider "${k[@]}" 2>&1 | tee "$OUT_DIR/pytest-gpu.log" \
    | grep -E "PASSED|FAILED|ERROR|answers equal|graph\(s\) compiled|weight difference|loss gap|CUDA peak|passed|failed" || true
  timeout 120 $PY -m pytest -m "gpu and oom_alone" tests/integration/test_gpu.py -v -rA -p no:cacheprovider "${k[@]}" 2>&1 \
    | tee -a "$OUT_DIR/pytest-gpu.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" || true
}

part_strategies() {
  log "strategies"
  data
  cpu_adam
  # shellcheck disable=SC2086 # STRATEGIES: a space-separated subset of the configs, to rerun some
  $PY -m qa_train.cli bench "${cpu[@]}" --configs ${STRATEGIES:-single ddp fsdp zero1 zero2 zero3 zero2_offload zero3_offload} \
    --timeout_s 240 --num_processes 1 --max_train_steps $strategy_steps --repeats "${STRATEGY_REPEATS:-1}" \
    --output_dir "$RUNS/strategies" -- \
    --config_name $BASE --tokenizer_name $MINILM --train_file "$DATA/train.json" \
    --max_train_samples 3000 --no_eval --max_seq_length 384 --doc_stride 128 --pad_to_max_length \
    --per_device_train_batch_size 32 --learning_rate 3e-5 --mixed_precision bf16 --throughput_warmup_steps 20 \
    "${bench_small[@]}" 2>&1 | tail -n 30 || true
  cp "$RUNS/strategies/report/report.md" "$OUT_DIR/strategies-report.md" 2>/dev/null || true
  $PY -m qa_train.cli plan --check "$RUNS"/strategies/*-p1-r1 2>&1 | tee "$OUT_DIR/plan-check.txt" | tail -n 20 || true
}

speed_flags=(--config_name $BASE --tokenizer_name $MINILM --max_seq_length 384 --doc_stride 128
             --learning_rate 5e-5 --mixed_precision bf16 --save_final_model false --report_to none
             --logging_steps 100 --disable_tqdm --overwrite_output_dir)

single() {  # one single-GPU BERT-base run into $RUNS/$1, its figures appended to speed.txt
  local name=$1; shift
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file accelerate_configs/single.yaml -- "${speed_flags[@]}" "$@" \
    --output_dir "$RUNS/$name" "${small[@]}" > "$OUT_DIR/$name.log" 2>&1 || true
  tail -n 5 "$OUT_DIR/$name.log"
  keep "$name"
  summary "$RUNS/$name" | tee -a "$OUT_DIR/speed.txt"
}

keep() {  # a run's metrics.json and train log beside the part's summaries
  for f in metrics.json train_log.jsonl; do cp "$RUNS/$1/$f" "$OUT_DIR/$1-$f" 2>/dev/null || true; done
}

speed_runs() {  # the two speed runs; $1 names them, the rest (e.g. --torch_compile) goes to both
  epochs_run "$@"
  fixed_run "$@"
}

epochs_run() {  # two epochs of the full training set; $1 names the run, the rest goes to it
  local suffix=$1; shift
  log "speed$suffix: two epochs of SQuAD v1.1, BERT-base shape $*"
  single "speed-2ep$suffix" --train_file "$DATA/train-full.json" --no_eval --num_train_epochs 2 \
    --per_device_train_batch_size 64 --group_by_length "$@"
}

fixed_run() {  # the fixed-length (MFU) run alone; $1 names it, the rest goes to it
  local suffix=$1; shift
  log "speed$suffix: fixed length (MFU), BERT-base shape $*"
  single "speed-fixed$suffix" --train_file "$DATA/train.json" --max_train_samples 20000 --no_eval \
    --pad_to_max_length --per_device_train_batch_size 64 --max_train_steps 150 --throughput_warmup_steps 20 "$@"
}

part_fixed() {  # only the fixed-length runs, eager then compiled: the MFU figure in a short command
  data
  fixed_run ""
  fixed_run -compiled --torch_compile
}

part_speed() {
  data
  speed_runs ""
}

profile_run() {  # $1 the config, $2 the batch, $3 a name suffix, the rest more flags: --profile of a BERT-base step
  local config=$1 batch=$2 name="profile-$1-$2${3:-}"; shift 3 || shift $#  # (fixed length unless they say), into $name.txt
  log "profile: $config, BERT-base shape, batch $batch, fixed length unless $*"
  data
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file "accelerate_configs/$config.yaml" --num_processes 1 -- \
    "${speed_flags[@]}" --train_file "$DATA/train.json" --max_train_samples 8000 --no_eval --pad_to_max_length \
    --per_device_train_batch_size "$batch" --max_train_steps 30 --throughput_warmup_steps 10 --profile "$@" \
    --output_dir "$RUNS/$name" "${small[@]}" 2>&1 | tail -n 90 | tee "$OUT_DIR/$name.txt"
  $PY tools/kernel_breakdown.py "$RUNS/$name/profile" 2>&1 | tee -a "$OUT_DIR/$name.txt" || true
  # The trace itself, for Perfetto: the host's timeline between kernels is where a host-bound step goes.
  cp "$RUNS/$name"/profile/*rank0*.pt.trace.json "$OUT_DIR/$name.pt.trace.json" 2>/dev/null || true
}

part_profile() {  # where a fixed-length BERT-base step spends its time
  profile_run single 64 ""
}

part_cprofile() {  # the compiled fixed-length step (the MFU target's), at the batch that measured best
  profile_run single 128 -compiled --torch_compile
}

part_gprofile() {  # the two epochs' step compiled (length-grouped batch 64, dynamic padding): host-bound, 42 ms a step
  # Past 130 steps most of the ~41 padded widths have been met once, so the profiled steps are the steady ones
  # (one early profiled step took 237 ms against 56-66: a new width's cuDNN plans, or a full garbage collection).
  local flags=(${GPROFILE_FLAGS:-}) tag=${GPROFILE_TAG:-}
  if [[ ${GPROFILE_FLAGS:-} == best ]]; then  # the step hostlevers found fastest: where its time still goes
    read -ra flags <<< "$(best_lever)"
    tag=-best
    log "gprofile: hostlevers' fastest is ${flags[*]}"
  fi
  profile_run single 64 "-grouped$tag" --torch_compile --pad_to_max_length false --group_by_length \
    --max_train_samples 12000 --max_train_steps 140 --throughput_warmup_steps 130 "${flags[@]}"
}

part_startup() {  # the 24-30 s between `qa-train launch` and a run's first line on the H100: each import, each process
  log "startup: imports in one process, then a short launch stamped line by line"
  $PY -X importtime -c "import qa_train.__main__, qa_train.run" 2> "$OUT_DIR/importtime.txt" || true
  $PY - <<'PY' 2>&1 | tee -a "$OUT_DIR/startup.txt"
import importlib, time
t = time.perf_counter()
for step in ("torch", "cuda", "accelerate", "deepspeed", "transformers.models.bert.modeling_bert", "qa_train.run"):
    if step == "cuda":
        import torch
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
    else:
        importlib.import_module(step)
    print(f"startup: {step:<40} +{time.perf_counter() - t:6.2f} s")
    t = time.perf_counter()
PY
  local t0=$EPOCHREALTIME
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file accelerate_configs/single.yaml -- \
    --config_name qa_train/assets/tiny-bert --tokenizer_name qa_train/assets/tiny-bert \
    --train_file qa_train/assets/demo/train.json --max_seq_length 192 --doc_stride 64 --max_train_steps 2 --no_eval \
    --report_to none --disable_tqdm --overwrite_output_dir --output_dir "$RUNS/startup" 2>&1 \
    | while IFS= read -r line; do
        awk -v s="$t0" -v e="$EPOCHREALTIME" -v l="${line:0:160}" 'BEGIN { printf "%7.2f %s\n", e - s, l }'
      done | tee -a "$OUT_DIR/startup.txt"
}

part_zeroprofile() {  # ZeRO-1/2 ran 3.7-4x slower than single on one GPU: where does its step go?
  profile_run zero2 32 ""
  profile_run single 32 ""
}

part_compiled() {  # the two epochs (the 90 s target) with the levers the profile points at
  data
  epochs_run -compiled --torch_compile  # the fixed path compiled is the fixed part's
  epochs_run -regional --torch_compile_regional  # a cold compile of one layer, not of the whole model
  # The dynamic-padding step is the launch-bound one; with graphs it records one per padded length (48 at 384/8).
  epochs_run -graphs --torch_compile_mode reduce-overhead
}

part_mfu() {  # the fixed-length run (the 40% MFU target) past --torch_compile at batch 64 (29.9% on 11-25)
  data
  local run
  for run in ${MFU_RUNS:-graphs compiled-b128 graphs-b128}; do
    case $run in
      # CUDA graphs: the launches of a step replayed at once
      graphs) fixed_run -graphs --torch_compile_mode reduce-overhead ;;
      # BERT-base's matrix products are small (768 wide): a larger batch gives the tensor cores longer ones.
      compiled-b128) fixed_run -compiled-b128 --torch_compile --per_device_train_batch_size 128 ;;
      graphs-b128) fixed_run -graphs-b128 --torch_compile_mode reduce-overhead --per_device_train_batch_size 128 ;;
      # Inductor's matrix-product kernels tuned per shape against cuBLAS, able to take the pointwise work after
      # them (bias, GELU) into their epilogue; and CUDA graphs. Minutes of tuning when cold.
      autotune-b128) fixed_run -autotune-b128 --torch_compile_mode max-autotune --per_device_train_batch_size 128 ;;
      *) log "mfu: no run named $run" ;;
    esac
  done
}

part_overhead() {  # qa_train's step against the bare step (tools/bare_loop.py), MiniLM at 32 x 384: the harness's share
  log "overhead: MiniLM 32 x 384, bare loop then qa_train"
  data
  local steps=300 batch=32 length=384 warmup=20
  [[ ${DRY:-0} == 1 ]] && steps=3 batch=2 length=128 warmup=1
  $PY tools/bare_loop.py --model $MINILM --batch $batch --length $length --steps $steps --warmup $warmup 2>&1 \
    | tee -a "$OUT_DIR/overhead.txt"
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file accelerate_configs/single.yaml -- --model_name_or_path $MINILM \
    --train_file "$DATA/train.json" --max_train_samples 12000 --no_eval --pad_to_max_length \
    --max_seq_length $length --doc_stride $((length / 4)) --per_device_train_batch_size $batch \
    --max_train_steps $((steps + warmup)) --throughput_warmup_steps $warmup --mixed_precision bf16 --report_to none \
    --save_final_model false --disable_tqdm --overwrite_output_dir --output_dir "$RUNS/overhead" 2>&1 \
    | grep -E "throughput|step time" | tee -a "$OUT_DIR/overhead.txt"
}

part_ablation() {  # ~11 min with two repeats: a 540 s deadline leaves the last points one run each
  log "ablation"
  data
  # 384 tokens: at the ablation's own 192 every shuffled batch of 32 pads to 192, so dynamic padding changed
  # nothing; repeats, interleaved, since single runs of identical work lay far apart (docs/benchmarks/2026-11-26-gpu-h200.md).
  $PY -m qa_train.cli bench "${cpu[@]}" --ablation --timeout_s 180 --max_train_steps $ablation_steps \
    --repeats $ablation_repeats --output_dir "$RUNS/ablation" -- \
    --config_name $BASE --tokenizer_name $MINILM --train_file "$DATA/train.json" \
    --max_train_samples 20000 --no_eval --max_seq_length 384 --doc_stride 128 --per_device_train_batch_size 32 \
    --learning_rate 3e-5 --throughput_warmup_steps 20 "${bench_small[@]}" 2>&1 | tail -n 30 || true
  cp "$RUNS/ablation/report/report.md" "$OUT_DIR/ablation-report.md" 2>/dev/null || true
}

# The hyper-parameters both accuracy runs share (transformers' example has no clipping: none here either).
ACC_HP=(--max_seq_length 384 --doc_stride 128 --per_device_train_batch_size 32 --learning_rate 1e-4
        --num_train_epochs 2 --num_warmup_steps 500 --weight_decay 0.01 --seed 42)

part_accuracy() {
  log "accuracy: MiniLM, 2 epochs, last 40 articles held out"
  data
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file accelerate_configs/single.yaml -- --model_name_or_path $MINILM \
    --train_file "$DATA/train.json" --validation_file "$DATA/dev.json" "${ACC_HP[@]}" --max_grad_norm 0 \
    --mixed_precision bf16 --eval_strategy epoch --report_to tensorboard --logging_steps 100 --disable_tqdm \
    --per_device_eval_batch_size 64 --overwrite_output_dir --output_dir "$RUNS/minilm" "${small[@]}" "${small_eval[@]}" \
    2>&1 | tail -n 8
  summary "$RUNS/minilm" | tee -a "$OUT_DIR/accuracy.txt"
  cp "$RUNS/minilm/metrics.json" "$OUT_DIR/minilm-metrics.json"
  cp "$RUNS/minilm/train_log.jsonl" "$OUT_DIR/minilm-train_log.jsonl"
}

part_hf() {
  log "hf: transformers' run_qa_no_trainer.py, same model, data and hyper-parameters"
  data
  for split in train dev; do bash tools/hf_example.sh --flatten "$DATA/$split.json" "$DATA/flat-$split.json"; done
  local hp=("${ACC_HP[@]}")
  [[ ${DRY:-0} == 1 ]] && hp+=(--max_train_steps 3 --per_device_train_batch_size 4)
  bash tools/hf_example.sh --model_name_or_path $MINILM --train_file "$DATA/flat-train.json" \
    --validation_file "$DATA/flat-dev.json" "${hp[@]}" --per_device_eval_batch_size 64 \
    --output_dir "$RUNS/hf-minilm" 2>&1 | tee "$OUT_DIR/hf.log" | grep -vE "it/s|s/it" | tail -n 15
}

part_twoepochs() {  # the 90 s target: compiled, cold (empty caches) then warm (same machine, same caches)
  data
  local cache=/tmp/qa_train_inductor run
  # Inductor's FX graph and autotuning caches, and Triton's kernels (by default under ~/.triton), in one place:
  # the cold run empties and fills it, the warm one reads it. TWOEPOCHS=warm runs the second alone (a later
  # command on the same machine). The whole model by default: by layer, the grouped step ran no faster than eager,
  # its host time spread over 14 compiled calls (docs/benchmarks/2026-11-26-gpu-h100.md). TWOEPOCHS_FLAGS="--torch_compile_mode
  # reduce-overhead" adds CUDA graphs (one per padded width).
  export TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton TORCH_LOGS=recompiles
  local flags=(${TWOEPOCHS_FLAGS:---torch_compile}) tag=${TWOEPOCHS_TAG:-compiled}
  if [[ ${TWOEPOCHS_FLAGS:-} == best ]]; then  # hostlevers' winner, measured just before on this machine
    read -ra flags <<< "$(best_lever)"
    tag=best
    log "twoepochs: hostlevers' fastest is ${flags[*]}"
  fi
  for run in ${TWOEPOCHS:-cold warm}; do
    [[ $run == cold ]] && rm -rf "$cache"
    [[ $run == warm && ! -d $cache ]] && run=cold-again  # a fresh machine: nothing to be warm with
    epochs_run "-$tag-$run" "${flags[@]}"
    echo "recompiles: $(grep -c "Recompiling function" "$OUT_DIR/speed-2ep-$tag-$run.log")" | tee -a "$OUT_DIR/speed.txt"
  done
}

part_hostlevers() {  # the 42 ms step whose GPU work is 26 ms (2026-11-27-gpu-h100.md): what takes the host off it
  data
  # One compile cache for the part (and a later twoepochs): the first run fills it, the graph runs add their mode's.
  export TORCHINDUCTOR_CACHE_DIR=/tmp/qa_train_inductor TRITON_CACHE_DIR=/tmp/qa_train_inductor/triton
  export TORCH_LOGS=recompiles,perf_hints,cudagraphs  # recompiles, CUDA graphs skipped, each graph recorded
  local steps=600 run flags
  [[ ${DRY:-0} == 1 ]] && steps=3
  mkdir -p "$RUNS" && : > "$RUNS/levers.tsv"
  # HOSTLEVERS picks runs; graphs-regional-m32 asks whether compiling one layer (a shorter cold compile on the
  # CPU) keeps the graphs' step: 14 graphs replayed a step instead of one.
  for run in ${HOSTLEVERS:-compiled graphs graphs-m32 compiled-m32}; do
    case $run in
      compiled) flags=(--torch_compile) ;;
      graphs) flags=(--torch_compile_mode reduce-overhead) ;;
      graphs-m32) flags=(--torch_compile_mode reduce-overhead --pad_to_multiple_of 32) ;;
      compiled-m32) flags=(--torch_compile --pad_to_multiple_of 32) ;;
      graphs-regional-m32) flags=(--torch_compile_mode reduce-overhead --torch_compile_regional --pad_to_multiple_of 32) ;;
      *) log "hostlevers: no run '$run'"; return 2 ;;
    esac
    log "hostlevers: $run, ${flags[*]}"
    printf '%s\t%s\n' "levers-$run" "${flags[*]}" >> "$RUNS/levers.tsv"
    # The steady rate past 100 steps (32 of the 41 widths met by then) and the whole loop, recordings included.
    single "levers-$run" --train_file "$DATA/train-full.json" --no_eval --per_device_train_batch_size 64 \
      --group_by_length --max_train_steps $steps --throughput_warmup_steps 100 "${flags[@]}"
    echo "levers-$run: recompiles $(grep -c "Recompiling function" "$OUT_DIR/levers-$run.log"), graphs recorded" \
      "$(grep -c "Recording cudagraph" "$OUT_DIR/levers-$run.log"), skips $(grep -ci "skipping cudagraphs" \
      "$OUT_DIR/levers-$run.log")" | tee -a "$OUT_DIR/speed.txt"
  done
}

best_lever() {  # the flags of hostlevers' fastest steady run on this machine; --torch_compile without one
  $PY - "$RUNS" <<'PY'
import json, sys
from pathlib import Path
runs, best = Path(sys.argv[1]), (0.0, "--torch_compile")
table = runs / "levers.tsv"
for line in table.read_text().splitlines() if table.exists() else []:
    name, flags = line.split("\t")
    metrics = runs / name / "metrics.json"
    if metrics.exists():
        rate = json.loads(metrics.read_text()).get("train_samples_per_second") or 0.0
        best = max(best, (rate, flags))
print(best[1])
PY
}

flat() {  # the example's flat layout of the split, once
  for split in train dev; do
    [[ -f $DATA/flat-$split.json ]] || bash tools/hf_example.sh --flatten "$DATA/$split.json" "$DATA/flat-$split.json"
  done
}

part_vshf() {  # transformers' example and qa_train on the same work, one after the other, VS_PAIRS times
  data
  flat
  local steps=${VS_STEPS:-1500} batch=32 evals=2000 extra=() i samples
  local qa_extra=()
  if [[ ${DRY:-0} == 1 ]]; then
    steps=3 batch=4 evals=20 extra=(--max_seq_length 128 --doc_stride 32)
    grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo || { export MIXED_PRECISION=no; qa_extra=(--mixed_precision no); }
  fi
  samples=$((steps * batch))  # one pass over the windows: neither side's loader starts a second epoch
  # The same windows, batch, learning rate, steps and seed; each side's own defaults for everything else.
  local hp=(--max_seq_length 384 --doc_stride 128 --per_device_train_batch_size $batch --learning_rate 3e-5
            --seed 42 --max_train_steps $steps --max_train_samples $samples --max_eval_samples $evals
            --per_device_eval_batch_size 64 --config_name $BASE --tokenizer_name $MINILM "${extra[@]}")
  for ((i = 1; i <= ${VS_PAIRS:-1}; i++)); do
    if [[ ${VS_SIDES:-hf qa} == *hf* ]]; then
      log "vshf $i: transformers' run_qa_no_trainer.py (accelerate launch --mixed_precision bf16)"
      bash tools/hf_example.sh --train_file "$DATA/flat-train.json" --validation_file "$DATA/flat-dev.json" \
        "${hp[@]}" --output_dir "$RUNS/vs-hf-$i" > "$OUT_DIR/vs-hf-$i.log" 2>&1 || log "vs-hf-$i failed"
      grep -E "^hf_example:|Evaluation metrics" "$OUT_DIR/vs-hf-$i.log" | tee -a "$OUT_DIR/vshf.txt" || true
    fi
    [[ " ${VS_SIDES:-hf qa} " == *" qa "* ]] && vs_qa "vs-qa-$i" "qa_train"
    # What the speed flags add over the defaults, on the same work.
    local qa2=${VS_QA2_FLAGS:-}
    [[ $qa2 == *best* ]] && qa2=${qa2/best/$(best_lever)}  # hostlevers' winner, if it ran on this machine
    # shellcheck disable=SC2086 # VS_QA2_FLAGS: several flags
    [[ -z $qa2 ]] || vs_qa "vs-qa2-$i" "qa_train (2)" $qa2
  done
}

vs_qa() {  # one qa_train side of vshf's pair into $RUNS/$1, named $2 in vshf.txt; the rest: its own flags
  local name=$1 label=$2 t0=$EPOCHREALTIME; shift 2  # hp and qa_extra: part_vshf's
  log "vshf: $label ${*:-with its defaults}"
  $PY -m qa_train.cli launch "${cpu[@]}" --config_file accelerate_configs/single.yaml -- --train_file "$DATA/train.json" \
    --validation_file "$DATA/dev.json" "${hp[@]}" "${qa_extra[@]}" --report_to none "$@" --output_dir "$RUNS/$name" \
    --overwrite_output_dir > "$OUT_DIR/$name.log" 2>&1 || log "$name failed"
  awk -v s="$t0" -v e="$EPOCHREALTIME" -v l="$label" 'BEGIN { printf "%s: wall_s=%.1f\n", l, e - s }' | tee -a "$OUT_DIR/vshf.txt"
  keep "$name"
  summary "$RUNS/$name" | tee -a "$OUT_DIR/vshf.txt" || true
}

if [[ -n $inner ]]; then "part_$inner"; exit; fi

preflight() {  # what a part needs and the device cannot make: missing, the session stops before any GPU time
  local part
  for part in "${parts[@]}"; do
    declare -F "part_$part" > /dev/null || { echo "gpu_session: no part '$part' (see the list at the top of $0)" >&2; return 2; }
    if [[ $part == hf || ( $part == vshf && ${VS_SIDES:-hf qa} == *hf* ) ]]; then
      bash tools/hf_example.sh --check || return 2
    fi
  done
  [[ -f .device/squad-train-v1.1-reconstructed.json.xz && -d $MINILM ]] || {
    echo "gpu_session: no .device/ data or MiniLM: bash ../shared/device/prepare.sh --with-data --with-minilm" >&2; return 2; }
}

pack_out() {  # everything but the three summaries into results.tar.gz, which grows part by part
  (cd "$OUT_DIR" && find . -maxdepth 1 -type f ! -name session.log ! -name speed.txt ! -name vshf.txt \
    ! -name results.tar.gz ! -name '.packed*' -printf '%P\n' | sort > .packed
   [[ -s .packed ]] || { rm -f .packed; return 0; }
   [[ -f results.tar.gz ]] && gzip -dc results.tar.gz > .packed.tar || rm -f .packed.tar
   tar rf .packed.tar -T .packed && gzip -c .packed.tar > .packed.tar.gz && mv .packed.tar.gz results.tar.gz \
     && xargs rm -f < .packed && rm -f .packed .packed.tar)
}

preflight
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee -a "$OUT_DIR/session.log" || true
# DEADLINE_AT (epoch seconds) or DEADLINE_S (from now): stop every part by then, so that one device command
# returns with its files.
if [[ -n ${DEADLINE_AT:-} ]]; then deadline=$((SECONDS + DEADLINE_AT - $(date +%s))); else deadline=$((SECONDS + ${DEADLINE_S:-100000})); fi
for part in "${parts[@]}"; do
  start=$SECONDS left=$((deadline - SECONDS))
  ((left > 20)) || { log "$part skipped: no time left"; continue; }
  timeout "$left" bash "$0" --inner "$part" --out "$OUT_DIR" || log "$part failed or stopped ($?)"
  log "$part took $((SECONDS - start)) s"
  if ((pack)); then pack_out; fi  # not `((pack)) && ...`: the script's status would be 1 without --pack
done
