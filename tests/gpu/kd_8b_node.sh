#!/bin/bash
# Issue 39, item 4, on a GPU node without network access (one H100 80GB or H200 141GB, 16 cores,
# 128 GB of host memory: MemTotal 125.87 GiB), in one bounded call: install the carried wheels (.whl/),
# record the node, then, most valuable first, each step under its own timeout and writing into $OUT:
#   1. gpu-check suite=gpu-check-kd: llama-440m under ZeRO-1 (mb 128 x ga 8) without a teacher and
#      distilled from a TinyLlama-1.1B-shaped one: MFU with and without the teacher, its memory
#      (the whole gpu-check, about 8 minutes with its compiled runs, has the same two runs: FULL=1 runs it
#      instead, and then the 8B step gets what is left);
#   2. gpu-check suite=gpu-8b-<platform>: the paper's shapes under ZeRO-3 with the optimizer partly
#      offloaded to the host (llama-8b and llama-8b-kd on an H200, llama-8b alone on an H100), the
#      host's MemAvailable and the GPU's memory sampled every 2 s beside it (host-mem.log);
# records come back as records.tar.gz, logs and offload-rates.json beside it (8 files).
#   device run: bash tests/gpu/kd_8b_node.sh    (carry: .whl; BUDGET_S: the whole script, default 540;
#   KD=0 skips step 1; ONLY_8B=l8b-kd runs that one of the 8B suite, e.g. after the H200 of 2026-12-04)
#
# Expected (memory model, harness/model/memory.py and offload.py; performance model for throughput):
#   kd   (H100) 426 samples/s against z1's 709 (z1 measured 711, MFU 22.8 %): MFU 13.7 % of the
#        student's FLOPs, 25.2 % with the teacher's forward; peak 36.0 GiB (z1 34.1): the teacher's
#        parameters 2.05 GiB (teacher_mem_gib), its logits 0.98. On an H200 532 samples/s. Since the
#        H200's kd run (446, the distillation loss measured there): 377 on an H100.
#   l8b  (H200) llama-8b seq 512, mb 8 x ga 2, 8 of 16 optimizer sub-groups on the host:
#        GPU 107.5 of 124.5 GiB, host 86.8 of 113.3 (MemAvailable falls by about 83 GiB: the run's
#        runtime is counted at 4).
#   l8b-kd (H200) llama-8b-kd seq 128, mb 32 x ga 2, same split: GPU 97.8 of 124.5, host 86.8.
#   l8b  (H100) llama-8b mb 1 x ga 2, 44 of 66 sub-groups on the host: GPU 64.6 of 70.1, host 103.9 of
#        113.3 (the tightest: 92 % of both). llama-8b-kd does not fit an H100 node (docs/workloads.md).
#   Measured on an H200 (2026-12-04, reference_results/sources/gpu-runs/2026-12-04-h200): kd 446 samples/s (z1 805),
#   l8b 5.68 s a step (the model, with the rates measured there: 5.68); l8b-kd stopped on transformers 5.17 (mended).
#   The model now (those rates, the distillation loss measured by kd): l8b-kd (H200) 5.96 s a step, 10.7 samples/s
#   = compute 1.26 (the loss 0.09 of it) + host wait 0.11 + offload 4.35 + the optimizer step 0.24.
#   Before that run: step time (`python -m harness model` with each run's overrides): l8b (H200) 4.36 s = 0.74 GPU compute
#   + 0.17 waiting on the host + 3.44 optimizer offload (host Adam over 4.19e9 elements 1.57, cast 0.45,
#   parameters up 0.42, gradients' copies outlasting backward 1.01); l8b-kd (H200) 4.64 s (offload 3.27);
#   l8b (H100) 5.04 s (0.11 compute, 0.81 host wait, offload 4.12 over 5.22e9 host elements).
#   The offload's rates are assumptions until offload-rates.json (tests/gpu/offload_rates.py, run here
#   first: DeepSpeedCPUAdam and the cast at 1 and 16 threads, a host triad, pinned and pageable copies)
#   measures them; each rank now runs its share of the node's cores (16 threads), not 1. Each 8B run:
#   about 1-2 minutes (model build, pinning about 40 GiB of host memory, 4 steps); cpu_adam is built
#   once before them (its two C++ files, compiled in parallel: about a minute).
set -u
BUDGET_S=${BUDGET_S:-540}
. "$(dirname "$0")/node_common.sh"
install_carried_wheels
{ nvidia-smi -q; nvidia-smi topo -m; grep -E "MemTotal|MemAvailable" /proc/meminfo; echo "ulimit -l: $(ulimit -l)"; } \
  >"$OUT/nvidia-smi.txt" 2>&1
timeout 90 python3 - >>"$OUT/session.log" 2>&1 <<'PY'
import sys, torch, deepspeed, transformers, importlib.metadata as md
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__,
      "transformers", transformers.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))
PY
tail -1 "$OUT/session.log"
PLATFORM=$(timeout 60 python3 -c "from harness.gpu_check import detect, platform_overrides; print(platform_overrides(detect(), [])[0].split('=')[1])")
log "platform ${PLATFORM:-?}"

if [ -n "${FULL:-}" ]; then KD_SUITE=gpu-check; RESERVE=60; else KD_SUITE=gpu-check-kd; RESERVE=300; fi
if [ "${KD:-1}" = 0 ]; then
  log "gpu-check suite=$KD_SUITE skipped (KD=0)"
else
  log "gpu-check suite=$KD_SUITE ($(left) s left, $RESERVE kept for the 8B suite)"
  timeout -k 10 $(( $(left) - RESERVE )) python3 -m harness gpu-check suite=$KD_SUITE out=/tmp/gpu-check-kd history=none confirm_regressions=0 \
    >"$OUT/gpu-check-kd.log" 2>&1
  log "gpu-check-kd exit $?"
  grep -E "^\| |-> " "$OUT/gpu-check-kd.log" | tail -20
fi

# the offload's mechanisms, for the model (harness/model/offload_time.py), only where the 8B suite keeps its
# time: cpu_adam's build (about a minute, which the suite's own preflight would spend anyway), then ~15 s
if [ "$(left)" -gt 270 ]; then
  log "cpu_adam build and the host's offload rates ($(left) s left)"
  timeout -k 10 150 python3 -m benchmarks.node.ops build cpu_adam --accelerator cuda >>"$OUT/session.log" 2>&1
  timeout -k 10 45 python3 tests/gpu/offload_rates.py --elements 1e8 --out "$OUT/offload-rates.json" >"$OUT/offload-rates.log" 2>&1
  log "offload rates exit $?"
fi
if [ "$(left)" -gt 120 ] && [ -f "conf/suite/gpu-8b-${PLATFORM}.yaml" ]; then
  log "gpu-check suite=gpu-8b-$PLATFORM ($(left) s left)"
  ( while :; do
      echo "$(( $(date +%s) - T0 )) $(awk '/^MemAvailable/{print $2}' /proc/meminfo) kB_available" \
           "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null) MiB_gpu"
      sleep 2
    done ) >"$OUT/host-mem.log" 2>&1 &
  SAMPLER=$!
  timeout -k 10 $(( $(left) - 15 )) python3 -m harness gpu-check suite=gpu-8b-$PLATFORM ${ONLY_8B:+only=[$ONLY_8B]} out=/tmp/gpu-8b history=none confirm_regressions=0 \
    >"$OUT/gpu-8b.log" 2>&1
  log "gpu-8b exit $?"
  kill "$SAMPLER" 2>/dev/null
  grep -E "^\| |-> |refused|host memory" "$OUT/gpu-8b.log" | tail -20
  log "lowest MemAvailable: $(sort -k2 -n "$OUT/host-mem.log" | awk 'NR==1{print $2 " kB at " $1 " s"}')"
fi
tar -czf "$OUT/records.tar.gz" -C /tmp --exclude='*.pt' --exclude='*.safetensors' gpu-check-kd gpu-8b 2>>"$OUT/session.log"
ls -la "$OUT" | tee -a "$OUT/session.log"
