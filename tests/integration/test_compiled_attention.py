"""The SDPA probe on code Inductor really generated: under its C++ wrapper the kernel runs past the
profiler's dispatcher, and the backend is read from the compiled graphs' extern calls
(benchmarks/training/stack.py compiled_sdpa). A real compile on cpu (about 10-20 s on 2 cores)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cpp_wrapper", [False, True])
def test_the_backend_a_compiled_graph_calls_is_named_under_either_wrapper(cpp_wrapper, monkeypatch):
    import torch
    import torch._dynamo
    from torch._inductor import config
    from torch._inductor.codecache import PyCodeCache

    from benchmarks.training.stack import attention_probe

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch._dynamo.reset()
    monkeypatch.setattr(PyCodeCache, "modules", [])   # this graph's wrappers alone, not an earlier test's
    q, k, v = (torch.randn(2, 4, 64, 32, requires_grad=True) for _ in range(3))
    with config.patch(cpp_wrapper=cpp_wrapper, fx_graph_cache=False):
        compiled = torch.compile(attend)
        compiled(q, k, v).sum().backward()   # compiles forward and backward
        found: dict = {}
        with attention_probe(found):
            compiled(q, k, v).sum().backward()
    assert found["attention_used"] == ["flash"]   # PyTorch's CPU flash attention, either way
    assert ("attention_from" in found) == cpp_wrapper, found
    assert len(PyCodeCache.modules) >= 2   # its forward's wrapper and its backward's were read
