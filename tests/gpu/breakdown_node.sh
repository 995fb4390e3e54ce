#!/bin/bash
# Where the GPU time of llama-440m's micro-step (mb 128 x seq 128) goes, three ways on one node in one
# bounded call, each under its own timeout, the SM clock and power sampled while it runs
# (tests/gpu/compute_breakdown.py): 1. eager (attention auto), 2. compiled, 3. eager under attention=math.
# What it settles (docs/performance-model.md, "The training stack"):
#   - whether the compiled micro-step's GEMM kernels, 8-9 % slower than the eager one's on an H100
#     (two breakdowns, two H100s), run at lower SM clocks: both on one node, with the clocks;
#   - what of attention=math's +58 ms a micro-step the model's float32 products and scores leave out
#     (they give 40).
# Expected on an H100 (2026-11-27): eager 169.6 ms of kernels a micro-step (111.0 outside GEMMs and
# attention), compiled 93.7 (28.9); math about 58 ms more wall than eager. On an H200 (2026-11-26): eager
# 149.5 (92.5). About a minute each; compiled about two (its compile: 45-52 s).
#   bash tests/gpu/breakdown_node.sh      (carry: .whl; BUDGET_S: the whole script, default 300)
set -u
BUDGET_S=${BUDGET_S:-300}
. "$(dirname "$0")/node_common.sh"
install_carried_wheels
nvidia-smi -q >"$OUT/nvidia-smi.txt" 2>&1
mkdir -p /tmp/breakdown
for what in eager compiled math; do
  case $what in eager) args=""; cap=90 ;; compiled) args="--compile"; cap=150 ;; math) args="--attention math"; cap=90 ;; esac
  bound=$(( $(left) - 15 )); [ "$bound" -gt "$cap" ] && bound=$cap
  if [ "$bound" -lt 30 ]; then log "$what skipped: $(left) s left"; continue; fi
  log "compute breakdown, $what ($(left) s left, bound $bound s)"
  timeout -k 5 "$bound" python3 tests/gpu/compute_breakdown.py $args \
    --out "/tmp/breakdown/compute_breakdown_${what}_mb128.json" >"$OUT/breakdown-$what.log" 2>&1
  log "$what exit $?"
done
tar -czf "$OUT/records.tar.gz" -C /tmp breakdown 2>>"$OUT/session.log"
ls -la "$OUT" | tee -a "$OUT/session.log"
