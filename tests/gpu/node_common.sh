# Sourced by the one-call scripts of a GPU node without network access (offline_node.sh, stack_node.sh,
# kd_8b_node.sh): $OUT, the clock against BUDGET_S (set it before sourcing), log, and the carried
# wheels (.whl/, made by `make node-wheels`: what the node's own Python lacks) installed into the node's python3, or into
# /tmp/site on PYTHONPATH where its environment refuses them.
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/session.log"; }
export PYTHONUNBUFFERED=1

install_carried_wheels() {
  log "install carried wheels"
  if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl >>"$OUT/session.log" 2>&1; then
    log "pip into python3's environment failed; --target /tmp/site on PYTHONPATH instead"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$OUT/session.log" 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
}
