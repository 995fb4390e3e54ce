"""The published runs of other sources (reference_results/sources/published-runs/) and the model's
table of them (harness/model/published_runs.py): the set covers what issue 28 asks, every figure
carries its quote, URL and date, and every cell becomes a configuration of this suite or says why not."""
from __future__ import annotations

import csv
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
