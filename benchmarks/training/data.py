"""Batches for the training benchmark: seeded synthetic tokens, or a local corpus.

The corpus path is read through `datasets` (text, JSON lines or parquet files on local disk)
and tokenized with a local `tokenizer.json`; nothing is ever downloaded.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import torch

from contract.spec import DataSpec

_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def synthetic_batches(vocab_size: int, micro_batch_size: int, grad_acc_steps: int, seq_len: int,
                      seed: int, rank: int) -> list[torch.Tensor]:
    """One optimizer step's samples for this rank (C = micro_batch_size x grad_acc_steps), drawn
    as one block and split into micro-batches, so every split of the same C (and every ZeRO stage)
    trains on the same tokens: the tuner's loss-parity check compares such runs step by step."""
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    samples = torch.randint(0, vocab_size, (micro_batch_size * grad_acc_steps, seq_len), generator=gen)
    return list(samples.split(micro_batch_size))


def corpus_batches(data: DataSpec, vocab_size: int, micro_batch_size: int, seq_len: int,
                   rank: int, world_size: int) -> list[torch.Tensor]:
    """Tokenize the corpus, pack it into seq_len windows, give rank r every world_size-th one."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    from tokenizers import Tokenizer

    path = Path(data.corpus_path)
    builder = _BUILDERS.get(path.suffix)
    if builder is None:
        raise ValueError(f"data.corpus_path={str(path)!r}: unsupported suffix; valid: {sorted(_BUILDERS)}")
    tokenizer = Tokenizer.from_file(str(data.tokenizer_path))
    if tokenizer.get_vocab_size() > vocab_size:
        raise ValueError(f"tokenizer {data.tokenizer_path} has {tokenizer.get_vocab_size()} tokens, "
                         f"more than the model's vocab_size={vocab_size}")
    field = "text" if builder == "text" else data.text_field
    table = datasets.load_dataset(builder, data_files=str(path), split="train")
    if field not in table.column_names:
        raise ValueError(f"data.text_field={field!r} not in corpus columns {table.column_names}")
    ids: list[int] = []
    for enc in tokenizer.encode_batch([t for t in table[field] if t]):
        ids.extend(enc.ids)
    windows = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    mine = windows[rank::world_size]
    if len(mine) < micro_batch_size:
        raise ValueError(f"corpus {path} gives {len(windows)} windows of {seq_len} tokens; rank {rank} "
                         f"needs at least micro_batch_size={micro_batch_size}")
    usable = len(mine) - len(mine) % micro_batch_size
    stacked = torch.tensor(mine[:usable], dtype=torch.long)
    return list(stacked.split(micro_batch_size))


def cycle(batches: list[torch.Tensor], device: torch.device) -> Iterator[torch.Tensor]:
    on_device = [b.to(device) for b in batches]
    while True:
        yield from on_device
