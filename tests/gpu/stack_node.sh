#!/bin/bash
# The training stack on a GPU node without network access, in one bounded call: install the carried
# wheels (.whl/: what the node's image lacks, liger-kernel and torchao among them), record the node,
# then, most valuable first, each step under its own timeout and writing into $OUT as it goes:
#   1. gpu-check suite=gpu-stack: llama-440m ZeRO-1 eager, compiled, FP8 (compiled), Liger; an 8B-shaped
#      4-layer stack compiled in bf16 and FP8; the bare compiled DeepSpeed loop beside z1-compile;
#   2. bench suite=gpu-stack-extra: ZeRO-3 with DeepCompile (its op built first), SDPA backends;
#   3. tests/gpu/compute_breakdown.py --compile: where the compiled micro-step's GPU time goes.
# Records come back as records.tar.gz (logs beside it).
#   bash tests/gpu/stack_node.sh        (carry: .whl; BUDGET_S: the whole script, default 540)
set -u
BUDGET_S=${BUDGET_S:-540}
. "$(dirname "$0")/node_common.sh"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
install_carried_wheels
if ! timeout 60 python3 -c "import torchao.float8" >>"$OUT/session.log" 2>&1; then
  log "torchao 0.18 does not import with this torch: torchao 0.16 instead"
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --force-reinstall .whl/torchao016/*.whl >>"$OUT/session.log" 2>&1
fi
{ nvidia-smi -q; nvidia-smi topo -m; } >"$OUT/nvidia-smi.txt" 2>&1
timeout 90 python3 - >>"$OUT/session.log" 2>&1 <<'PY'
import sys, torch, deepspeed, transformers, triton, importlib.metadata as md
v = lambda d: md.version(d) if d else None
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "deepspeed", deepspeed.__version__, "transformers", transformers.__version__, "triton", triton.__version__,
      "liger", v("liger-kernel"), "torchao", v("torchao"), "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability())
PY
tail -1 "$OUT/session.log"
P=$(timeout 60 python3 -c "from harness.gpu_check import detect, platform_overrides; print(' '.join(platform_overrides(detect(), [])))")

log "gpu-check suite=gpu-stack ($(left) s left)"
timeout -k 10 $(( $(left) - 170 )) python3 -m harness gpu-check suite=gpu-stack out=/tmp/gpu-stack history=none confirm_regressions=0 \
  >"$OUT/gpu-stack.log" 2>&1
log "gpu-stack exit $?"
grep -E "^\| |harness .* throughput|-> " "$OUT/gpu-stack.log" | tail -30

if [ "$(left)" -gt 60 ]; then
  log "bench suite=gpu-stack-extra ($(left) s left)"
  timeout -k 10 $(( $(left) - 45 )) python3 -m harness bench $P suite=gpu-stack-extra out=/tmp/gpu-stack-extra history=none confirm_regressions=0 \
    >"$OUT/gpu-stack-extra.log" 2>&1
  log "gpu-stack-extra exit $?"
  grep -E -- "-> |error" "$OUT/gpu-stack-extra.log" | tail -12
fi
if [ "$(left)" -gt 40 ]; then
  log "compute breakdown, compiled (llama-440m mb 128)"
  mkdir -p /tmp/gpu-stack-extra
  timeout -k 5 $(( $(left) - 12 )) python3 tests/gpu/compute_breakdown.py --compile \
    --out /tmp/gpu-stack-extra/compute_breakdown_compiled_mb128.json >"$OUT/compute-breakdown.log" 2>&1
  log "compute breakdown exit $?"
fi
tar -czf "$OUT/records.tar.gz" -C /tmp --exclude='*.pt' --exclude='*.safetensors' gpu-stack gpu-stack-extra 2>>"$OUT/session.log"
ls -la "$OUT" | tee -a "$OUT/session.log"
