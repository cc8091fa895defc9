"""A head on taps (featurize --taps) is a head: train-head reads arrays of several widths side by side, eval scores
it again, the Pipeline computes the taps of new texts (equal to the store's), and a sentence-transformers export
is refused in one line (safetensors works)."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import headstore
from headstore.cli import main
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .finetune_world import tiny_beir, tiny_bert

ARRAY = "features+tap_mlp_1+tap_attn_2"  # of widths d, d_ff and d: one input, read side by side


@pytest.fixture(scope="module")
def tapped(tmp_path_factory):
    root = tmp_path_factory.mktemp("taps")
    model, beir = tiny_bert(root / "model", layers=2), tiny_beir(root / "beir", n_docs=40, n_train=20, n_test=8)
    featurize(FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=2048, taps=True), [str(beir)],
              root / "store")
    head = root / "head"
    train_head(str(root / "store"), str(beir), str(head), HeadConfig(hidden=16, residual=False, out_dim=16,
                                                                      mix_mode="concat"),
               TrainConfig(epochs=1, batch_size=8, mined_k=2, normalize="standardize"), array=ARRAY, progress=False)
    return root, beir, head


def test_a_tap_head_reads_the_arrays_side_by_side(tapped):
    root, _, head_dir = tapped
    store = FeatureStore.open(root / "store")
    head = headstore.Head.load(head_dir)
    widths = [store.array(a).shape[1] for a in ARRAY.split("+")]
    assert len(set(widths)) > 1 and head.in_dim == sum(widths)
    assert head.head_config.mix == 1 and head.array == ARRAY


def test_the_pipeline_computes_the_taps_of_new_texts(tapped):
    root, _, head_dir = tapped
    store = FeatureStore.open(root / "store")
    texts = store.texts["text"].to_list()[:12]
    pipe = headstore.Pipeline.from_head(str(head_dir))
    assert pipe.taps == [("mlp", 1), ("attn", 2)]
    rows = store.rows_for(store.row_ids(texts))
    stored = np.concatenate([store.features(rows, a) for a in ARRAY.split("+")], axis=1)
    np.testing.assert_allclose(pipe.features(texts, batch_size=5), stored, atol=1e-5, rtol=1e-5)
    head = headstore.Head.load(head_dir)
    np.testing.assert_allclose(pipe.encode(texts), head.embed(stored), atol=1e-4, rtol=1e-4)


def test_eval_and_export_of_a_tap_head(tapped, tmp_path):
    root, beir, head_dir = tapped
    runner = CliRunner()
    r = runner.invoke(main, ["eval", "--store", str(root / "store"), "--head", str(head_dir), "--data", str(beir),
                             "--out", str(tmp_path / "eval")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["export", "--head", str(head_dir), "--format", "sentence-transformers",
                             "--out", str(tmp_path / "st")])
    assert r.exit_code != 0 and "export refused" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["export", "--head", str(head_dir), "--format", "safetensors", "--out", str(tmp_path / "sf")])
    assert r.exit_code == 0, r.output


def test_a_scalar_mix_of_arrays_of_several_widths_is_refused(tapped, tmp_path):
    root, beir, _ = tapped
    with pytest.raises(ValueError, match="--mix-mode concat"):
        train_head(str(root / "store"), str(beir), str(tmp_path / "h"), HeadConfig(hidden=16, residual=False),
                   TrainConfig(epochs=1, batch_size=8, mined_k=2), array=ARRAY, progress=False)


def test_a_residual_tap_head_starts_at_the_first_array(tapped, tmp_path):
    """--out-dim the first array's width: f(x) = x_first + g(x), g's last layer zero at the start, so the head's
    first output is the (normalised) first array exactly; any other --out-dim is refused naming the width."""
    import torch

    from headstore.heads.network.model import StackedMLP

    root, beir, _ = tapped
    store = FeatureStore.open(root / "store")
    widths = [store.array(a).shape[1] for a in ARRAY.split("+")]
    cfg = HeadConfig(depth=1, out_dim=widths[0], mix_mode="concat", in_dim=sum(widths))
    x = torch.randn(5, sum(widths))
    assert torch.equal(StackedMLP(1, cfg)(x)[0], x[:, :widths[0]])
    with pytest.raises(ValueError, match=f"--out-dim {widths[0]}"):
        train_head(str(root / "store"), str(beir), str(tmp_path / "h"), HeadConfig(depth=1, mix_mode="concat"),
                   TrainConfig(epochs=1, batch_size=8, mined_k=2), array=ARRAY, progress=False)


def test_select_taps_ranks_every_tap_but_the_features_own(tapped, tmp_path):
    import json

    root, beir, _ = tapped
    out = tmp_path / "sel.json"
    r = CliRunner().invoke(main, ["select-taps", "--store", str(root / "store"), "--data", str(beir), "--keep", "2",
                                  "--epochs", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    store = FeatureStore.open(root / "store")
    taps = [a for a in store.arrays if a.startswith("tap_")]
    assert sorted(result["ranking"]) == sorted(set(taps) - {"tap_block_2"})  # tap_block_2 is `features` itself
    assert result["array"].startswith("features+") and len(result["array"].split("+")) <= 3
    assert f"--array {result['array']}" in r.output
    r = CliRunner().invoke(main, ["select-taps", "--store", str(root / "store"), "--data", str(beir), "--keep", "0"])
    assert r.exit_code != 0 and "keep" in r.output and "Traceback" not in r.output
    assert len(result["train_pearson_by_epoch"]) == 1 and result["settings"]["lr"] == 0.1
    r = CliRunner().invoke(main, ["select-taps", "--store", str(root / "store"), "--data", str(beir), "--lr", "1e30"])
    assert r.exit_code != 0 and "did not fit at --lr 1e+30" in r.output and "Traceback" not in r.output, r.output


def test_index_and_search_with_a_tap_head(tapped, tmp_path):
    """`cli index` embeds the corpus from the stored taps; `cli search` computes a new query's taps (Pipeline):
    a stored document's own text as the query finds that document among the first three."""
    import json

    pytest.importorskip("faiss")
    root, beir, head_dir = tapped
    runner = CliRunner()
    r = runner.invoke(main, ["index", "--store", str(root / "store"), "--head", str(head_dir), "--data", str(beir),
                             "--out", str(tmp_path / "index")])
    assert r.exit_code == 0, r.output
    doc = json.loads((beir / "corpus.jsonl").read_text().splitlines()[3])
    r = runner.invoke(main, ["search", "--index", str(tmp_path / "index"), "--query", f"{doc['title']} {doc['text']}",
                             "--k", "3", "--out", str(tmp_path / "hits.json")])
    assert r.exit_code == 0, r.output
    assert doc["_id"] in r.output


def test_array_dropout_drops_whole_arrays_but_the_first():
    """In training each array but the first is zeroed whole or kept scaled by 1 / (1 - p), per text; the first
    never; off in eval. A loop over the arrays' bounds is the reference."""
    import torch

    from headstore.heads.network.model import StackedMLP

    cfg = HeadConfig(depth=1, out_dim=4, mix_mode="concat", in_dim=4 + 6 + 3, array_widths="4,6,3", array_dropout=0.5)
    model = StackedMLP(1, cfg).train()
    x = torch.rand(1, 200, 13) + 0.5
    torch.manual_seed(0)
    dropped = model.dropped_arrays(x)
    bounds = [0, 4, 10, 13]
    assert torch.equal(dropped[..., :4], x[..., :4])
    for a, b in zip(bounds[1:-1], bounds[2:]):
        part = dropped[..., a:b] / x[..., a:b]  # 0 or 2 on every column of the array, the same across it
        assert torch.allclose(part, part[..., :1].expand_as(part))
        assert set(part[..., 0].flatten().round().tolist()) == {0.0, 2.0}
    model.eval()
    assert torch.equal(model(x), StackedMLP(1, cfg).eval()(x))  # eval: no dropping (and the same start)
    with pytest.raises(ValueError, match="several arrays"):
        StackedMLP(1, HeadConfig(depth=1, in_dim=4, array_dropout=0.3))


def test_dropout_masks_are_each_heads_own_and_the_same_every_run():
    """Array and hidden dropout draw each head's masks from its own seeded generator: head h of a stack drops what a
    one-head stack of its seed drops, a fresh stack of the same seeds drops the same again, whatever the global RNG."""
    import torch

    from headstore.heads.network.model import StackedMLP

    cfg = HeadConfig(depth=2, hidden=8, out_dim=4, mix_mode="concat", in_dim=13, array_widths="4,6,3",
                     residual=False, array_dropout=0.5, dropout=0.3)  # (a residual head's start ignores its input)
    x = torch.rand(200, 13) + 0.5
    seeds = [3, 7, 11]
    torch.manual_seed(0)
    one = StackedMLP(3, cfg, seeds=seeds).train()
    stacked = [one(x), one(x)]  # two steps of one stack: new masks each
    torch.manual_seed(1)
    again = StackedMLP(3, cfg, seeds=seeds).train()
    assert not torch.equal(stacked[0], stacked[1])
    assert all(torch.equal(a, b) for a, b in zip(stacked, [again(x), again(x)]))
    model = StackedMLP(3, cfg, seeds=seeds).train()
    first = model(x)
    rest = model.select_heads([2, 0])  # a stack that dropped head 1 goes on with the others' streams
    for h, seed in enumerate(seeds):
        alone = StackedMLP(1, cfg, seeds=[seed]).train()
        torch.testing.assert_close(alone(x)[0], first[h])  # (a batched matmul may round apart from a single one)
        torch.testing.assert_close(alone(x)[0], stacked[1][h])
    torch.testing.assert_close(rest(x), stacked[1][[2, 0]])
