#!/bin/bash
# Issue 38's GPU items left, on a GPU node without network access (one H100 80GB or H200 141GB, 16 cores), in
# one bounded call: install the carried wheels (.whl/), record the node, build DeepCompile's op (its build
# failed on the H100 of 2026-11-27 at the node's `9.0a` arch entry, mended since), then
# bench suite=gpu-compile-host, most valuable first:
#   1. llama-440m ZeRO-3 with DeepCompile at gpu-check's size (mb 128 x ga 8), beside the references' eager
#      ZeRO-3 (H100 370 samples/s, host-bound: ZeRO-3's hooks on the host, which DeepCompile compiles away);
#   2. its 12- and 6-layer shapes at mb 8 x ga 4 compiled (ZeRO-1, then ZeRO-3), under DeepCompile and eager:
#      the compiled host floor (harness/model/params.py compiled_host_floor), fitted at the end by
#      tests/perf/host_floor.py (base + per module x modules, and each stack over eager's);
#   3. where time is left, the compiled ZeRO-1 and eager ZeRO-3 12-layer shapes with DeepSpeed's throughput timer
#      unsynchronised: what its torch.cuda.synchronize() before every forward costs (and the compiled graph break).
# If DeepCompile's op does not build, the suite runs without its DeepCompile runs (the build's log says why).
# Records come back as records.tar.gz, logs beside it.
#   device run: bash tests/gpu/compile_host_node.sh    (carry: .whl; BUDGET_S: the whole script, default 540;
#   RUNS=a,b,...: only those of the suite, e.g. what the H200 of 2026-12-04 left: dc-z3-L6-mb8,c-z3-L12-mb8,c-z3-L6-mb8,z3-deepcompile)
#
# Expected: eager floors as the H200's (replicated 10.4 ms + 0.315 ms a module, sharded 1.9 + 1.56: 45 and
# 175 ms a micro-step at 12 layers); a compiled ZeRO-1 micro-step issues a handful of graphs instead of ~2,000
# kernels, so its floor should fall well below eager's; torch.compile under ZeRO-3 keeps DeepSpeed's hooks
# eager (graph breaks at each module: 43 at 7 sites for llama-tiny on cpu), so its floor should stay near
# eager ZeRO-3's; DeepCompile's is the question.
set -u
BUDGET_S=${BUDGET_S:-540}
. "$(dirname "$0")/node_common.sh"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
install_carried_wheels
{ nvidia-smi -q; nvidia-smi topo -m; } >"$OUT/nvidia-smi.txt" 2>&1
timeout 90 python3 - >>"$OUT/session.log" 2>&1 <<'PY'
import sys, torch, deepspeed, transformers, triton
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "deepspeed", deepspeed.__version__,
      "transformers", transformers.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability())
PY
tail -1 "$OUT/session.log"
P=$(timeout 60 python3 -c "from harness.gpu_check import detect, platform_overrides; print(' '.join(platform_overrides(detect(), [])))")

log "DeepCompile's op ($(left) s left)"
ONLY=""
BUILD_S=$(( $(left) / 3 )); [ "$BUILD_S" -gt 180 ] && BUILD_S=180
if ! timeout -k 10 $BUILD_S python3 -m benchmarks.node.ops build dc --accelerator cuda >"$OUT/dc-build.log" 2>&1; then
  log "DeepCompile's op did not build (dc-build.log): the suite runs without its DeepCompile runs"
  ONLY="only=[c-z1-L12-mb8,c-z1-L6-mb8,c-z3-L12-mb8,c-z3-L6-mb8,e-z3-L12-mb8,e-z3-L6-mb8,e-z1-L12-mb8,e-z1-L6-mb8,c-z1-L12-mb8-unsynced,e-z3-L12-mb8-unsynced]"
fi
if [ -n "${RUNS:-}" ]; then   # the runs asked for, less DeepCompile's where its op did not build
  [ -n "$ONLY" ] && RUNS=$(echo "$RUNS" | tr , '\n' | grep -v -E '^(dc-|z3-deepcompile)' | paste -sd, -)
  ONLY="only=[$RUNS]"
fi
log "bench suite=gpu-compile-host ${ONLY} ($(left) s left)"
timeout -k 10 $(( $(left) - 25 )) python3 -m harness bench $P suite=gpu-compile-host $ONLY out=/tmp/gpu-compile-host \
  history=none confirm_regressions=0 >"$OUT/gpu-compile-host.log" 2>&1
log "gpu-compile-host exit $?"
grep -E -- "-> |error|refused" "$OUT/gpu-compile-host.log" | tail -14
timeout 15 python3 tests/perf/host_floor.py /tmp/gpu-compile-host 2>&1 | tee "$OUT/host-floor.txt"
tar -czf "$OUT/records.tar.gz" -C /tmp --exclude='*.pt' --exclude='*.safetensors' gpu-compile-host 2>>"$OUT/session.log"
ls -la "$OUT" | tee -a "$OUT/session.log"
