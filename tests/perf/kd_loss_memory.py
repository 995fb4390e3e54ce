"""What the distillation loss costs in memory and time at llama-8b-kd's vocabulary: `make perf`.

    .venv/bin/python tests/perf/kd_loss_memory.py [--tokens 2048] [--vocab 128256] [--repeats 2]

Each variant runs in a fresh process (so that peak RSS is its own): bf16 student and teacher
logits of [1, tokens, vocab] are made, then the loss's forward and backward run. Printed per
variant: the peak RSS added on top of the logits themselves, and the median forward + backward time.
  blocked  benchmarks.training.distill.distillation_loss as the runs use it (blocks of <= 2^26 elements,
           each recomputed in backward)
  whole    the same function with one block (no recomputation): every float32 intermediate of the
           whole [tokens, vocab] kept for backward
Target: the blocked loss adds well under half of what the whole one adds. Exit 0 whatever the figures.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, resource, statistics, sys, time
import torch
sys.path.insert(0, {repo!r})
from benchmarks.training.distill import CHUNK_ELEMENTS, distillation_loss
torch.set_num_threads(2)
tokens, vocab, whole, repeats = {tokens}, {vocab}, {whole}, {repeats}
gen = torch.Generator().manual_seed(0)
s = torch.randn(1, tokens, vocab, generator=gen).bfloat16().requires_grad_(True)
t = torch.randn(1, tokens, vocab, generator=gen).bfloat16()
y = torch.randint(0, vocab, (1, tokens), generator=gen)
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = rss()
times = []
for _ in range(repeats):
    start = time.perf_counter()
    out = distillation_loss(s, t, y, 0.5, 2.0, chunk_elements=10**15 if whole else CHUNK_ELEMENTS)
    out.loss.backward()
    times.append(time.perf_counter() - start)
    s.grad = None
print(json.dumps({{"added_gib": (rss() - base) / 2**30, "logits_gib": 2 * s.numel() * 2 / 2**30,
                  "time_s": statistics.median(times), "loss": float(out.loss)}}))
"""


def measure(tokens: int, vocab: int, whole: bool, repeats: int) -> dict:
    code = CHILD.format(repo=str(REPO_ROOT), tokens=tokens, vocab=vocab, whole=whole, repeats=repeats)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"distillation loss, {args.tokens} tokens x vocab {args.vocab}, bf16 logits "
          f"(student + teacher {2 * args.tokens * args.vocab * 2 / 2**30:.2f} GiB), forward + backward")
    results = {}
    for name, whole in (("blocked", False), ("whole", True)):
        r = results[name] = measure(args.tokens, args.vocab, whole, args.repeats)
        if "error" in r:
            print(f"  {name:8s} failed: {r['error']}")
            continue
        print(f"  {name:8s} adds {r['added_gib']:.2f} GiB peak RSS   {r['time_s']:.2f} s   loss {r['loss']:.6f}")
    b, w = results["blocked"], results["whole"]
    if "error" not in b and "error" not in w:
        ratio = b["added_gib"] / w["added_gib"] if w["added_gib"] > 0 else float("nan")
        verdict = "ok" if ratio < 0.5 else "MISS"
        print(f"  blocked / whole memory added: {ratio:.2f} (target < 0.5: {verdict}); "
              f"time {b['time_s'] / w['time_s']:.2f}x; same loss: {abs(b['loss'] - w['loss']) < 1e-4 * abs(w['loss'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
