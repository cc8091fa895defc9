"""`cli compare`'s picture keeps its legend and titles inside the figure, with one out-of-domain panel or several
(an STS-B table has one panel and ten setups: its legend once ran off both sides)."""
from pathlib import Path

import pytest
from headstore.heads.experiments.grid import plots
from headstore.heads.experiments.compare.setups import SETUPS
from matplotlib.backends.backend_agg import FigureCanvasAgg


def _rows(ood: list[str]) -> list[dict]:
    """Every setup of the registry, with its own label, the reference first (its difference is None)."""
    datasets = ["in-domain", *ood]
    rows = []
    for i, (name, setup) in enumerate(sorted(SETUPS.items(), key=lambda kv: kv[0] != "frozen-head")):
        diff = None if i == 0 else {"diff": -0.07 + 0.01 * i, "ci": [-0.075 + 0.01 * i, -0.065 + 0.01 * i]}
        rows.append({"setup": name, "label": setup.label,
                     "datasets": {d: {"metric": "spearman_cosine", "vs_frozen_head": diff} for d in datasets}})
    return rows


@pytest.mark.parametrize("ood", [["semeval-sts-2012-2016"], ["cranfield", "cacm"]])
def test_legend_and_titles_inside_the_figure(tmp_path: Path, monkeypatch, ood):
    figures = []
    monkeypatch.setattr(plots, "atomic_write_figure", lambda fig, path, **kw: figures.append(fig))
    plots.plot_gain_vs_change(_rows(ood), tmp_path / "compare.png")
    fig = figures[0]
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.bbox
    artists = [*fig.legends, *(ax.title for ax in fig.axes)]
    for artist in artists:
        extent = artist.get_window_extent(renderer)
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, (artist, extent, box)
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, (artist, extent, box)
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in fig.axes:  # the legend sits below the panels, not over them
        assert legend.y1 <= ax.get_tightbbox(renderer).y0 + 1
