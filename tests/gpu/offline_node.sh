#!/bin/bash
# One bounded call on a GPU node without network access (its own Python, torch and CUDA; nothing can
# be downloaded there): install the carried wheels (.whl/, what the node's Python lacks), record the machine, run make gpu-check's flow,
# then ZeRO-3's host cost per fetch (conf/suite/gpu-zero3-host.yaml) and where a micro-step's GPU
# time goes (tests/gpu/compute_breakdown.py) with what time is left, and
# put the records under $OUT (at most 8 files come back). Every step is bounded: a hang or a
# failure of one step still brings back the others' records and every log.
#   bash tests/gpu/offline_node.sh   (with .whl/ beside it; OUT=DIR, BUDGET_S=seconds)
#   SKIP_GPU_CHECK=1 ZERO3_SUITE=gpu-zero3-layers: only the ZeRO-3 host-cost suite named
set -u
BUDGET_S=${BUDGET_S:-500}        # the whole script, install included
. "$(dirname "$0")/node_common.sh"
install_carried_wheels
{ nvidia-smi -q; nvidia-smi topo -m; } >"$OUT/nvidia-smi.txt" 2>&1
timeout 90 python3 - >>"$OUT/session.log" 2>&1 <<'PY'
import sys, torch, deepspeed, transformers, hydra, importlib.metadata as md
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__,
      "transformers", transformers.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))
PY
tail -1 "$OUT/session.log"

if [ -z "${SKIP_GPU_CHECK:-}" ]; then
log "gpu-check"
timeout -k 10 $(( $(left) - 150 )) python3 -m harness gpu-check out=/tmp/gpu-check history=none confirm_regressions=0 2>&1 | tee "$OUT/gpu-check.log" | grep -vE '^  00-nccl|^ +[0-9]+ +[0-9]+ ' 
log "gpu-check exit ${PIPESTATUS[0]}"
fi

if [ "$(left)" -gt 60 ]; then
  log "gpu-zero3-host ($(left) s left)"
  P=$(timeout 60 python3 -c "from harness.gpu_check import detect, platform_overrides; print(' '.join(platform_overrides(detect(), [])))")
  timeout -k 10 $(( $(left) - 20 )) python3 -m harness bench $P suite=${ZERO3_SUITE:-gpu-zero3-host} out=/tmp/gpu-zero3-host history=none confirm_regressions=0 \
    >"$OUT/gpu-zero3-host.log" 2>&1
  log "gpu-zero3-host exit $?"
fi
if [ -z "${SKIP_BREAKDOWN:-}" ] && [ "$(left)" -gt 45 ]; then
  log "compute breakdown (torch.profiler, llama-440m mb 128)"
  timeout -k 5 $(( $(left) - 10 )) python3 tests/gpu/compute_breakdown.py --out /tmp/gpu-zero3-host/compute_breakdown_mb128.json \
    >"$OUT/compute-breakdown.log" 2>&1
  log "compute breakdown exit $?"
fi
tar -czf "$OUT/records.tar.gz" -C /tmp --exclude='*.pt' --exclude='*.safetensors' gpu-check gpu-zero3-host 2>>"$OUT/session.log"
ls -la "$OUT" | tee -a "$OUT/session.log"
