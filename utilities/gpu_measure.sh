#!/usr/bin/env bash
# What a GPU session measures for BENCHMARKS.md, in parts that each fit one 10-minute call on the lent
# GPU machine (../shared/gpu/README.md puts TensorFlow there; run its setup.sh first):
#
#   bash utilities/gpu_measure.sh loops            # the alignment's loops per frame, graph-mode steps,
#                                                  # one XLA step's compile (default flags vs parallel)
#   bash utilities/gpu_measure.sh demo xla 540     # train_main.py --demo with XLA forced (and bf16);
#                                                  # its log has the loops timed at start and the plan
#   bash utilities/gpu_measure.sh demo graph 360   # the same without XLA (the loops compiled alone);
#                                                  # demo auto: XLA or not as the hardware plan picks
#   bash utilities/gpu_measure.sh diagnose 200 40  # utilities/diagnose_gpu_bottleneck.py on the demo, 40 batches
#   bash utilities/gpu_measure.sh vocoder 360      # the vocoder's XLA update in float32 and bf16, then
#                                                  # train_vocoder.py as a user gets it (XLA, bf16)
#   bash utilities/gpu_measure.sh first            # for a lease of 15 minutes in all, where sending the
#                                                  # kit takes ~4: the loops per frame (150 s at most),
#                                                  # then the demo as a user gets it (420 s at most)
#   bash utilities/gpu_measure.sh lease 540        # everything one call of 540 s can hold, most wanted
#                                                  # first, each part cut to what is left: the demo as a
#                                                  # user gets it, train_vocoder.py (600 updates), the
#                                                  # vocoder's XLA update in float32 and bf16, the
#                                                  # diagnosis with its profile of the step
#
# Logs go to $OUT (the device tool's folder) or /tmp/gpu-out. Each part is bounded by `timeout`, and a
# part that fails does not stop the next.
here=$(cd "$(dirname "$0")/.." && pwd); cd "$here"
[ -f .gpu/kit/env.sh ] && source .gpu/kit/env.sh
export PYTHONPATH=$here:${PYTHONPATH:-} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
part=${1:-loops}

sample_gpu() {  # utilization and memory once a second, until the caller kills it
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 1 > "$1" 2>/dev/null &
  echo $!
}

case $part in
loops)
  python3 -m myxtts.hardware > "$out/hardware.txt" 2>&1; grep -iE "gpu|precision|xla" "$out/hardware.txt" | head -8
  SECONDS=0; python3 utilities/make_demo_corpus.py --quiet; echo "demo corpus: ${SECONDS}s"
  timeout 200 python3 utilities/benchmark_alignment.py --blocks 1,4,16 --repeats 5 2>&1 | grep -v "^W0\|ptxas\|^I0" | tee "$out/alignment.txt"
  timeout 120 python3 utilities/benchmark_alignment.py --train-step 2>&1 | grep -v "^W0\|ptxas\|^I0" | tee "$out/train_step.txt"
  # One XLA train step of the demo's model (batch 16, the longest bucket, bf16): the first step's time
  # is tracing + compiling. Two processes at once (16 cores): XLA's defaults, and parallel compilation.
  probe="python3 -m myxtts.training.batch_probe --config configs/demo.yaml --batch-size 16 --precision mixed_bfloat16 --xla"
  TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1,compile_module_to_llvm_ir=1,gemm_fusion_autotuner=1,autotuner_util=1 \
    timeout 300 $probe > "$out/compile_default.json" 2> "$out/compile_default.log" &
  XLA_FLAGS="$XLA_FLAGS --xla_gpu_force_compilation_parallelism=16 --xla_gpu_enable_llvm_module_compilation_parallelism=true" \
    timeout 300 $probe > "$out/compile_parallel.json" 2> "$out/compile_parallel.log" &
  wait
  echo "default: $(cat "$out/compile_default.json")"; echo "parallel: $(cat "$out/compile_parallel.json")"
  grep -hoE "[A-Za-z:_ ]{8,60}(took|time)[^\n]{0,40}[0-9.]+ ?(s|ms|sec)" "$out/compile_default.log" | sort | uniq -c | sort -rn | head -20
  gzip -f "$out/compile_default.log" "$out/compile_parallel.log"
  ;;
demo)
  # route: xla or graph forces it; auto leaves it to the hardware plan, as a user gets it
  route=${2:-xla}; limit=${3:-540}; xla=(--set training.enable_xla_compilation=true)
  [ "$route" = graph ] && xla=(--set training.enable_xla_compilation=false); [ "$route" = auto ] && xla=()
  rm -rf "/root/runs/demo_$route"  # a rerun on a warm machine measures a new run, not a resumed or refused one
  smi=$(sample_gpu "$out/demo_${route}_gpu.csv")
  SECONDS=0
  timeout "$limit" python3 train_main.py --demo --output-dir "/root/runs/demo_$route" "${xla[@]}" > "$out/demo_$route.log" 2>&1
  echo "demo ($route) rc=$? after ${SECONDS}s"; kill "$smi" 2>/dev/null
  grep -vE "ptxas|^W0|^I0" "$out/demo_$route.log" | grep -E "^(step|hardware|plan|probe|compile|data|val|train|saved|done|alignment loops|input route|time:)|WER|rror|took|compil" | tail -40
  awk -F', ' '{gsub(/ %/,"",$2); if ($2+0 > 0) {n++; s+=$2}} END {if (n) printf "GPU busy: mean %.0f%% over %d busy seconds\n", s/n, n}' "$out/demo_${route}_gpu.csv"
  ;;
diagnose)
  limit=${2:-200}
  timeout "$limit" python3 utilities/diagnose_gpu_bottleneck.py --config configs/demo.yaml --train-data demo_corpus \
    --num-batches ${3:-40} --json "$out/diagnosis.json" --plot "$out/diagnosis.png" > "$out/diagnosis.txt" 2>&1
  echo "diagnosis rc=$?"; grep -vE "ptxas|^W0|^I0" "$out/diagnosis.txt" | sed -n '/Measurements/,$p' | head -50
  ;;
vocoder)
  limit=${2:-360}; [ -f demo_corpus/manifest.jsonl ] || python3 utilities/make_demo_corpus.py --quiet
  timeout 180 python3 utilities/benchmark_vocoder.py --train --sizes small,base --precisions float32,mixed_bfloat16 --xla \
    --repeats 20 2>&1 | grep -v "^W0\|ptxas\|^I0" | tee "$out/vocoder_step.txt"
  rm -rf /root/runs/vocoder; smi=$(sample_gpu "$out/vocoder_gpu.csv"); SECONDS=0
  timeout "$limit" python3 utilities/train_vocoder.py --train-data demo_corpus --output-dir /root/runs/vocoder \
    --steps 3600 --quality-clips 0 > "$out/vocoder.log" 2>&1   # the GPU image has no DNSMOS or STOI packages
  echo "train_vocoder rc=$? after ${SECONDS}s"; kill "$smi" 2>/dev/null
  tr "\r" "\n" < "$out/vocoder.log" | grep -vE "ptxas|^W0|^I0" | grep -E "^(vocoder|step|first step|a step took|Griffin-Lim.s phase of [0-9])|rror" | tail -24
  ;;
first)
  python3 -m myxtts.hardware > "$out/hardware.txt" 2>&1; grep -iE "gpu|precision|xla" "$out/hardware.txt" | head -8
  [ -f demo_corpus/manifest.jsonl ] || python3 utilities/make_demo_corpus.py --quiet
  timeout 150 python3 utilities/benchmark_alignment.py --blocks 1,16 --repeats 5 2>&1 | grep -v "^W0\|ptxas\|^I0" | tee "$out/alignment.txt"
  bash "$0" demo auto 420
  ;;
lease)
  deadline=$(( $(date +%s) + ${2:-540} )); left() { echo $(( deadline - $(date +%s) )); }
  python3 -m myxtts.hardware > "$out/hardware.txt" 2>&1; grep -iE "gpu|precision|xla|loop" "$out/hardware.txt" | head -10
  SECONDS=0; [ -f demo_corpus/manifest.jsonl ] || python3 utilities/make_demo_corpus.py --quiet; echo "demo corpus: ${SECONDS}s"
  limit=$(( $(left) - 60 )); [ $limit -gt 430 ] && limit=430
  bash "$0" demo auto $limit
  if [ $(left) -gt 120 ]; then  # train_vocoder.py as a user runs it (XLA, bf16): its first update's compile
    limit=$(( $(left) - 60 )); [ $limit -gt 200 ] && limit=200; rm -rf /root/runs/vocoder_lease; SECONDS=0
    timeout $limit python3 utilities/train_vocoder.py --train-data demo_corpus --output-dir /root/runs/vocoder_lease \
      --steps 600 --quality-clips 0 > "$out/vocoder.log" 2>&1
    echo "train_vocoder rc=$? after ${SECONDS}s"
    tr "\r" "\n" < "$out/vocoder.log" | grep -E "^(vocoder|step|first step|a step took|Griffin-Lim.s phase of [0-9])|rror" | tail -16
  fi
  if [ $(left) -gt 90 ]; then
    limit=$(( $(left) - 60 )); [ $limit -gt 110 ] && limit=110
    timeout $limit python3 utilities/benchmark_vocoder.py --train --sizes small --precisions float32,mixed_bfloat16 --xla \
      --repeats 10 2>&1 | grep -v "^W0\|ptxas\|^I0" | tee "$out/vocoder_step.txt" | tail -8
  fi
  [ $(left) -gt 60 ] && bash "$0" diagnose $(( $(left) - 5 )) 20
  echo "lease: $(left) s left of the call"
  ;;
*) echo "unknown part: $part (first, lease, loops, demo, diagnose, vocoder)"; exit 2 ;;
esac
