"""The published runs of other sources (reference_results/sources/published-runs/) and the model's
table of them (harness/model/published_runs.py): the set covers what issue 28 asks, every figure
carries its quote, URL and date, and every cell becomes a configuration of this suite or says why not."""
from __future__ import annotations

import csv
import dataclasses
import re

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.config.compose import compose
from harness.errors import HarnessError
from harness.model import published_runs as P


@pytest.fixture(scope="module")
def cells():
    return P.load_cells()


def test_the_set_covers_what_it_must(cells):
    assert len(cells) >= 15 and len({c.source_id for c in cells}) >= 3
    assert min(c.seq_len for c in cells) <= 512 and max(c.seq_len for c in cells) >= 8192
    assert min(c.num_gpus for c in cells) <= 8 and max(c.num_gpus for c in cells) >= 128
    assert {"A100", "H100"} <= {c.gpu_model[:4] for c in cells}
    assert all(c.metric in P.METRICS and c.value > 0 for c in cells)


def test_every_figure_has_its_quote_url_and_date():
    rows = list(csv.DictReader(P.CELLS.read_text(encoding="utf-8").splitlines()))
    for r in rows:
        assert r["quote"].strip(), r["cell_id"]
        assert r["url"].startswith("https://"), r["cell_id"]
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", r["date"]), (r["cell_id"], r["date"])
        number = r["value"].rstrip("0").rstrip(".")
        assert number.replace(",", "") in r["quote"].replace(",", ""), f"{r['cell_id']}: {r['value']} not in its quote"
    assert len({r["cell_id"] for r in rows}) == len(rows)


def test_every_cell_composes_or_says_why_not(cells):
    for c in cells:
        try:
            cfg = compose(P.cell_overrides(c))
        except HarnessError as e:
            assert c.micro_batch is None and "micro-batch" in str(e), (c.cell_id, e)
            continue
        w = cfg.workload
        assert cfg.platform.world_size == c.num_gpus and w.seq_len == c.seq_len and w.micro_batch_size == c.micro_batch
        assert cfg.zero.stage == c.zero_stage
        if c.gelu:   # a GELU MLP of width f as a SwiGLU of 2f/3: the same parameters
            assert abs(3 * w.intermediate_size - 2 * c.ffn_hidden) <= 2


def test_the_table_reports_errors_and_the_issue_targets(cells):
    some = [c for c in cells if c.source_id.startswith("torchtitan")][:2] + [c for c in cells if c.micro_batch is None][:1]
    rows = P.predict_cells(compose, some)
    text = "\n".join(P.format_cells(rows))
    assert "median |error|" in text and "(issue 28)" in text
    assert all((r.predicted is None) == (r.cell.micro_batch is None) for r in rows)
    assert any("the source states no micro-batch" in ln for ln in text.splitlines())


def test_the_table_says_how_the_error_goes_with_the_node_count(cells):
    """Item 3 of issue 28: the topology at scale, checked on the published multi-node cells."""
    some = [c for c in cells if c.micro_batch and c.num_gpus == 8][:1] + [c for c in cells if c.micro_batch and c.num_gpus >= 512][:1]
    rows = P.predict_cells(compose, some)
    bands = P.by_scale(rows)
    assert [b[0] for b in bands] == ["1 node", "33+ nodes"] and all(n == 1 for _, n, _, _ in bands)
    assert all(m == pytest.approx(abs(signed)) for _, _, m, signed in bands)
    assert "by scale: 1 node 1 cells" in "\n".join(P.format_cells(rows))


def test_each_cell_runs_on_the_network_its_source_states(cells):
    """Declared hardware: the stated interconnect becomes the platform's inter-node link (GB/s per
    node per direction); a cell whose source states none keeps the platform's and is marked so."""
    by_id = {c.cell_id: c for c in cells}
    assert P.declared_link(by_id["ibm-a100-7b"]) == ("roce", 50.0)          # "400Gbps inter-node interconnect"
    assert P.declared_link(by_id["ibm-h100-7b"]) == ("roce", 100.0)         # "800Gbps"
    assert P.declared_link(by_id["lf-11"]) == ("roce", 200.0)               # "1600 Gbps node-node (RoCE)"
    assert P.declared_link(by_id["tt-h100-03"]) == ("roce", 400.0)          # "400 Gb/s per GPU", 8 a node
    assert P.declared_link(by_id["ds-azure-01"]) == ("ib", 200.0)           # "200 Gb/s HDR InfiniBand per GPU"
    assert P.declared_link(by_id["yafsdp-07"]) is None
    cfg = compose(P.cell_overrides(by_id["ibm-a100-7b"]))
    assert cfg.platform.inter_node_bw_gbps == 50.0 and cfg.platform.fabric.value == "roce"
    bad = P.Cell(**{**by_id["lf-11"].__dict__, "interconnect": "a fast network"})
    with pytest.raises(HarnessError, match="lf-11: no bandwidth in the stated interconnect 'a fast network'"):
        P.cell_overrides(bad)


def test_a_source_without_a_stated_network_gets_the_link_that_fits_it_as_a_diagnostic_only(cells):
    some = [c for c in cells if c.cell_id in ("yafsdp-01", "yafsdp-04", "ibm-a100-7b")]
    rows = P.predict_cells(compose, some)
    assert [(r.link_gbps, r.link_stated) for r in rows] == [(50.0, True), (200.0, False), (200.0, False)]
    before = [r.predicted for r in rows]
    links = P.implied_links(compose, rows)
    assert [r.predicted for r in rows] == before            # never an input
    (k,) = links                                             # ibm states its network: not tried
    assert k.source_id == "yandex-yafsdp-readme-2024" and k.cells == 2 and k.gbps in dict(P.LINK_LADDER)
    assert k.median_pct <= k.assumed_median_pct and len(k.errors_pct) == 2
    text = "\n".join(P.format_cells(rows) + P.format_implied(links))
    assert "200?" in text and f"at {k.gbps:g} GB/s per node" in text and "no figure above uses it" in text


def test_a_cell_checkpoints_the_layers_and_ops_its_source_states(cells):
    by_id = {c.cell_id: c for c in cells}
    assert P.cell_checkpointing(by_id["yafsdp-05"]) == (8, "full") and P.cell_checkpointing(by_id["yafsdp-07"]) == (4, "full")
    w = compose(P.cell_overrides(by_id["yafsdp-05"])).workload
    assert w.activation_checkpointing and w.checkpoint_every_n_layers == 8
    assert P.cell_checkpointing(by_id["lf-01"]) == (1, "full") and P.cell_checkpointing(by_id["lf-04"]) is None
    assert P.cell_checkpointing(by_id["tt-h100-01"]) == (1, "selective") == P.cell_checkpointing(by_id["tt-a100-01"])
    assert compose(P.cell_overrides(by_id["tt-h100-01"])).workload.checkpoint_policy.value == "selective"
    assert P.cell_checkpointing(by_id["tt-a100-02"]) is None and P.cell_checkpointing(by_id["ibm-a100-13b"]) is None  # n unstated
    odd = dataclasses.replace(by_id["yafsdp-05"], checkpointing="partial: 3 of 80 layers")
    with pytest.raises(HarnessError, match="not every n-th of its 80 layers"):
        P.cell_checkpointing(odd)
    rows = P.predict_cells(compose, [by_id["yafsdp-05"], by_id["tt-h100-01"]])
    text = "\n".join(P.format_cells(rows))
    assert " 1/8 " in text and " sel " in text


def test_a_cell_runs_on_the_gpu_its_source_states(cells):
    """torchtitan's H100: 96 GB at 2.4 TB/s, a peak between the NVL's and the SXM's (the middle taken);
    an A100-40GB: its memory and its own datasheet bandwidth. Others: the platform's part."""
    by_id = {c.cell_id: c for c in cells}
    tt = by_id["tt-h100-01"]
    assert (tt.hbm_tbps, tt.peak_bf16) == (2.4, (835.5, 989.4))
    p = compose(P.cell_overrides(tt)).platform
    assert (p.mem_per_device_gib, p.hbm_gbps, p.peak_tflops["bf16"]) == (96.0, 2400.0, pytest.approx(912.45))
    a40 = compose(P.cell_overrides(by_id["lf-14"])).platform
    assert (a40.mem_per_device_gib, a40.gpu_model, a40.hbm_gbps) == (40.0, "A100-SXM4-40GB", 0.0)
    plain = compose(P.cell_overrides(by_id["ibm-h100-7b"])).platform
    assert (plain.mem_per_device_gib, plain.hbm_gbps, plain.peak_tflops["bf16"]) == (79.6, 0.0, 989.4)
