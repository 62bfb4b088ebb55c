#!/usr/bin/env bash
# The accelerator's figures in one run (about 5 minutes on one GPU), every benchmark on --device:
#   1. bench_recurrent.py --preset gpu: ResetRNN (every backend, GRU and LSTM; B=64, T=64,
#      H=512, a reset every 200 steps on average) against cuDNN nn.GRU / nn.LSTM without resets;
#   2. bench_prefetch.py: ChunkPrefetcher moving uint8 chunks [16, 64, 1, 64, 64] to the device
#      (pinned memory), the trainer's wait fraction; NCCL learners when there are 2+ GPUs;
#   3. the main job (seqchunk ppo, run as python -m torchrl_seqchunk.recipes ppo) for 20,480 frames on the device.
# Prints every RATIO line; writes under --out: <bench>.log (its output), <bench>.err,
# ratios.csv (bench, name, value), report.md (device, commit, ratios, main job) and the CSVs
# of the benchmarks.
#
#   bash benchmarks/gpu.sh                         # --device cuda --out runs/gpu
#   bash benchmarks/gpu.sh --device cpu --quick    # the same code paths in under a minute
set -u -o pipefail

DEVICE=cuda QUICK=0 OUT=runs/gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (use --device DEV, --quick, --out DIR)" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# the CUDA devices torch sees, and the name of the device measured
read -r GPUS NAME < <("$PYTHON" -c "
import os, sys, torch
device = torch.device(sys.argv[1])
name = torch.cuda.get_device_name(device) if device.type == 'cuda' and torch.cuda.is_available() else f'{device} ({os.cpu_count()} CPU cores)'
print(torch.cuda.device_count(), name)" "$DEVICE")
case "$DEVICE" in
  cuda*) if [ "$GPUS" -eq 0 ]; then echo "gpu.sh: --device $DEVICE but torch sees no CUDA device" >&2; exit 2; fi ;;
esac

if [ "$QUICK" -eq 1 ]; then
  RECURRENT=(--quick)
  PREFETCH=(--quick)
  FRAMES=256
else
  RECURRENT=(--preset gpu --rounds 20)
  PREFETCH=()
  FRAMES=20480
fi
case "$DEVICE" in cuda*) [ "$GPUS" -gt 1 ] && PREFETCH+=(--ddp-ranks "$GPUS") ;; esac

FAILED=()
run() {  # run NAME SCRIPT ARGS... (or NAME -m MODULE ARGS...): its output to NAME.log (and the terminal's RATIO lines)
  local name="$1"; shift
  echo "== $name: $*"
  if (cd "$ROOT" && "$PYTHON" "$@") >"$OUT/$name.log" 2>"$OUT/$name.err"; then
    grep '^RATIO ' "$OUT/$name.log"
  else
    echo "gpu.sh: $name failed, see $OUT/$name.err:" >&2
    tail -n 5 "$OUT/$name.err" >&2
    FAILED+=("$name")
  fi
}

START=$(date +%s)
run recurrent benchmarks/bench_recurrent.py --device "$DEVICE" "${RECURRENT[@]}"
run prefetch benchmarks/bench_prefetch.py --device "$DEVICE" --out "$OUT/prefetch" "${PREFETCH[@]}"
run main_job -m torchrl_seqchunk.recipes ppo --device "$DEVICE" --total-frames "$FRAMES" --runs-dir "$OUT" \
  --name main_job --overwrite --no-progress
# the main job's frames per second, from its metrics (last row: frames, wall_s)
if [ -f "$OUT/main_job/metrics.csv" ]; then
  "$PYTHON" - "$OUT/main_job/metrics.csv" >>"$OUT/main_job.log" <<'EOF'
import csv, sys
last = list(csv.DictReader(open(sys.argv[1])))[-1]
print(f"main_job_fps {int(last['frames']) / float(last['wall_s']):.1f} frames/s over {last['frames']} frames")
EOF
  grep '^main_job_fps' "$OUT/main_job.log"
fi
ELAPSED=$(( $(date +%s) - START ))

{ echo "bench,name,value"
  for name in recurrent prefetch main_job; do
    [ -f "$OUT/$name.log" ] && awk -v b="$name" '$1 == "RATIO" {print b "," $2 "," $3}
                                                  $1 == "main_job_fps" {print b ",main_job_fps," $2}' "$OUT/$name.log"
  done; } >"$OUT/ratios.csv"
{ echo "# Accelerator figures"
  echo
  echo "- device: $NAME (--device $DEVICE, $GPUS CUDA device(s) seen)"
  echo "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- budget: $([ "$QUICK" -eq 1 ] && echo quick || echo full), $ELAPSED s; main job $FRAMES frames"
  echo "- failed: ${FAILED[*]:-none}"
  echo
  echo "| bench | figure | value |"
  echo "| --- | --- | --- |"
  tail -n +2 "$OUT/ratios.csv" | awk -F, '{print "| " $1 " | " $2 " | " $3 " |"}'; } >"$OUT/report.md"
echo "wrote $OUT/report.md and $OUT/ratios.csv ($ELAPSED s)"
[ ${#FAILED[@]} -eq 0 ]
