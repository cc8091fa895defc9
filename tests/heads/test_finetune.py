"""cli finetune on a tiny random BERT: which weights change, discriminative lrs, gradual unfreezing,
and that the written encoder + head re-featurize and evaluate with the existing commands."""
import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from headstore.cli import main
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.settings.config import TrainConfig
from headstore.heads.apply.finetune import FinetuneConfig, build_optimizer, encoder_blocks, finetune, n_unfrozen
from headstore.heads.settings.config import HeadConfig
from headstore.heads.network.model import StackedMLP
from headstore.heads.training.run import train_head

from .finetune_world import tiny_bert, trained_head_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return trained_head_world(tmp_path_factory.mktemp("ft"), layers=3, epochs=2)


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def _run(world, name, **kw):
    root, model, beir, store, head = world
    out = root / name
    kw = {"keep": "last", **kw}  # the mechanics of training: what the steps did, not a dev-selected state
    summary = finetune(str(head), str(out), FinetuneConfig(device="cpu", batch_size=8, encoder_lr=1e-3, **kw),
                       encoder=str(model), progress=False)
    return out, summary


def test_top_k_changes_only_the_top_layers(world):
    _, model, *_ = world
    out, summary = _run(world, "top1", unfreeze="top-k", top_k=1, max_steps=4)
    before, after = _weights(model), _weights(out / "encoder")
    assert set(before) == set(after)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("encoder.layer.2.") for k in changed), sorted(changed)[:5]
    frozen = [k for k in before if k.startswith(("embeddings.", "encoder.layer.0.", "encoder.layer.1."))]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert summary["steps"] == summary["steps_per_epoch"] == 4  # 27 train pairs (3 of 30 held out), batches of 8
    assert summary["stopped_because"] == "max_steps" and summary["epochs_run"] == 1


def test_all_changes_embeddings_and_every_layer(world):
    _, model, *_ = world
    out, _ = _run(world, "all", unfreeze="all", max_steps=2)
    before, after = _weights(model), _weights(out / "encoder")
    for prefix in ("embeddings.word_embeddings", "encoder.layer.0.", "encoder.layer.2."):
        keys = [k for k in before if k.startswith(prefix)]
        assert any(not torch.equal(before[k], after[k]) for k in keys), prefix


def test_head_changes_and_is_a_train_head_dir(world):
    _, _, _, _, head = world
    out, _ = _run(world, "headcheck", max_steps=1)
    a, b = load_file(str(head / "head.safetensors")), load_file(str(out / "head" / "head.safetensors"))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    assert (out / "head" / "normalizer.safetensors").is_file()


def test_tuned_head_keeps_the_judgements_and_its_eval_splits_seen_unseen(world):
    """The tuned head carries its source head's training judgements (it trained on the same pairs), so the
    tuned encoder's eval splits seen / unseen exactly as the source head's eval does."""
    import polars as pl

    from headstore.heads.training.eval_run import eval_head

    root, _, beir, store, head = world
    out, _ = _run(world, "judged", max_steps=1)
    source = pl.read_parquet(head / "judgements.parquet")
    tuned = pl.read_parquet(out / "head" / "judgements.parquet")
    assert sorted(tuned.rows()) == sorted(source.rows())
    assert json.loads((out / "head" / "config.json").read_text())["judged"] == \
        json.loads((head / "config.json").read_text())["judged"]
    r = CliRunner().invoke(main, ["featurize", "--model", str(out / "encoder"), "--data", str(beir),
                                  "--store", str(root / "store-judged"), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    before, after = {}, {}
    eval_head(str(store), str(head), str(beir), str(root / "eval-judged-0"), items=before, device="cpu")
    eval_head(str(root / "store-judged"), str(out / "head"), str(beir), str(root / "eval-judged-1"), items=after,
              device="cpu")
    assert before["seen"] is not None and after["seen"] == before["seen"]


def test_a_damaged_judgements_file_of_the_source_head_stops_the_run_before_training(world, tmp_path):
    """The source head's judgements.parquet is read again at the end (the tuned head's record): a damaged one is
    one line naming it before any step, not a crash after the run, and nothing is written."""
    import shutil

    _, model, _, _, head = world
    copy = tmp_path / "head"
    shutil.copytree(head, copy)
    (copy / "judgements.parquet").write_bytes(b"not a parquet file")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="judgements.parquet"):
        finetune(str(copy), str(out), FinetuneConfig(device="cpu", batch_size=8, max_steps=1), encoder=str(model),
                 progress=False)
    assert not out.exists() or not any(out.iterdir())


def test_layerwise_lr_decay_param_groups():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                 intermediate_size=32))
    blocks = encoder_blocks(model)
    assert len(blocks) == 4  # 3 layers (top first) + embeddings
    assert blocks[0][0][1] is model.encoder.layer[2].attention.self.query.weight
    head = StackedMLP(1, HeadConfig(hidden=8, out_dim=4, in_dim=16, residual=False))
    opt = build_optimizer(blocks, head, FinetuneConfig(encoder_lr=1e-4, layer_lr_decay=0.5), 3e-3, 0.01)
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    for depth in range(4):
        assert lrs[f"block{depth}"] == pytest.approx(1e-4 * 0.5 ** depth)
        assert lrs[f"block{depth}/no-decay"] == pytest.approx(1e-4 * 0.5 ** depth)
    assert lrs["head"] == 3e-3
    # every encoder parameter but the pooler is in exactly one group
    grouped = [id(p) for g in opt.param_groups if g["name"] != "head" for p in g["params"]]
    assert len(grouped) == len(set(grouped))
    expected = {id(p) for n, p in model.named_parameters() if not n.startswith("pooler.")}
    assert set(grouped) == expected
    assert all(g["weight_decay"] == 0.0 for g in opt.param_groups if g["name"].endswith("no-decay"))


def test_gradual_unfreezes_one_block_per_interval(world):
    cfg = FinetuneConfig(unfreeze="gradual", unfreeze_interval=3)
    assert [n_unfrozen(cfg, s, 4) for s in range(12)] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert n_unfrozen(FinetuneConfig(unfreeze="top-k", top_k=9), 0, 4) == 4
    assert n_unfrozen(FinetuneConfig(unfreeze="all"), 0, 4) == 4
    _, model, *_ = world
    out, summary = _run(world, "gradual", unfreeze="gradual", unfreeze_interval=2, max_steps=4)
    assert [h["unfrozen_blocks"] for h in summary["history"]] == [1, 1, 2, 2]
    before, after = _weights(model), _weights(out / "encoder")
    changed = {k.split(".")[0] + "." + k.split(".")[2] if k.startswith("encoder.") else k.split(".")[0]
               for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"encoder.2", "encoder.1"}  # two blocks trained, layer 0 and embeddings untouched


def test_bad_unfreeze_mode_lists_valid_options():
    with pytest.raises(ValueError, match="gradual"):
        FinetuneConfig(unfreeze="bottom")


def test_finetuned_encoder_featurizes_and_evaluates_with_the_existing_commands(world):
    from transformers import AutoModel

    root, _, beir, store, _ = world
    out, summary = _run(world, "cli", max_steps=2)
    AutoModel.from_pretrained(str(out / "encoder"), use_safetensors=True)  # a plain HF checkpoint
    store2 = root / "store-ft"
    r = CliRunner().invoke(main, ["featurize", "--model", str(out / "encoder"), "--data", str(beir),
                                  "--store", str(store2), "--dtype", "float32"])
    assert r.exit_code == 0, r.output
    s1, s2 = FeatureStore.open(store), FeatureStore.open(store2)
    assert s1.fingerprint != s2.fingerprint
    assert s2.fingerprint == summary["fingerprint"]  # the head's config names exactly this store
    r = CliRunner().invoke(main, ["eval", "--store", str(store2), "--head", str(out / "head"), "--data", str(beir),
                                  "--out", str(root / "eval-ft")])
    assert r.exit_code == 0, r.output
    assert "manhattan_ndcg@10" in json.loads((root / "eval-ft" / "metrics.json").read_text())["head"]
    # the old store is refused for the new head
    r = CliRunner().invoke(main, ["eval", "--store", str(store), "--head", str(out / "head"), "--data", str(beir),
                                  "--out", str(root / "eval-old")])
    assert r.exit_code != 0 and "weights_hash" in r.output


def test_mined_negatives_and_gradient_checkpointing(world, tmp_path):
    root, model, beir, store, _ = world
    head = tmp_path / "head-mined"
    train_head(str(store), str(beir), str(head), HeadConfig(hidden=16, out_dim=8, residual=False),
               TrainConfig(epochs=1, batch_size=8, mined_k=2), progress=False)
    summary = finetune(str(head), str(tmp_path / "ft"), FinetuneConfig(device="cpu", max_steps=2,
                       gradient_checkpointing=True), encoder=str(model), progress=False)
    assert summary["steps"] == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in summary["history"])


def test_wrong_encoder_is_refused(world, tmp_path):
    root, model, beir, store, head = world
    other = tiny_bert(tmp_path / "other", layers=2)
    with pytest.raises(ValueError, match="weights"):
        finetune(str(head), str(tmp_path / "x"), FinetuneConfig(device="cpu"), encoder=str(other), progress=False)


def test_cli_finetune_top_k_with_layer_decay(world):
    root, model, beir, store, head = world
    out = root / "cli-ft"
    r = CliRunner().invoke(main, ["finetune", "--head", str(head), "--out", str(out), "--model", str(model),
                                  "--unfreeze", "top-k", "--top-k", "2", "--layer-lr-decay", "0.8",
                                  "--max-steps", "1", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["config"]["layer_lr_decay"] == 0.8 and summary["unfrozen_at_step"] == {"0": 2}
    r = CliRunner().invoke(main, ["finetune", "--head", str(head), "--out", str(out), "--unfreeze", "bottom"])
    assert r.exit_code != 0 and "top-k" in r.output
