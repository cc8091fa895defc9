"""Continued MLM pre-training on a tiny random BERT: output, learning, resume, headless models."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, BertConfig, BertForMaskedLM, BertModel, BertTokenizerFast

from headstore.featurize.encoder.config import AdaptConfig
from headstore.featurize.tuning.adapt import CHECKPOINT, adapt, lr_at
from headstore.featurize.encoder.model import weights_hash
from headstore.featurize.tuning.mlm_eval import mlm_loss, pseudo_perplexity
from headstore.featurize.tuning.mlm_head import HEAD_FILE, load_mlm_model, masked_lm_loss

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cell", "protein", "gene", "binds",
         "to", "a", "in", "of", "and", "mouse", "human", "is", "expressed", "tumor", "brain",
         "blood", "with", "we", "found", "un", "##bind", "##ing", "##s", "."]
SENTENCES = ["the protein binds to the gene in the mouse brain .",
             "we found a tumor in human blood .",
             "the gene is expressed in the cell and the tumor ."]


def save_tiny_model(folder: Path, with_head: bool = True, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    BertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(str(folder))
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    model = BertForMaskedLM(config) if with_head else BertModel(config)
    model.save_pretrained(str(folder))
    return folder


def safetensors_sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    for f in sorted(folder.glob("*.safetensors")):
        digest.update(f.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(SENTENCES * 20) + "\n")
    return path


def small_config(model: Path, **overrides) -> AdaptConfig:
    base = dict(model=str(model), max_length=16, batch_size=8, lr=1e-3, warmup_ratio=0.1,
                max_steps=6, save_every=2, seed=0, device="cpu")
    return AdaptConfig(**{**base, **overrides})


def test_lr_schedule_by_hand():
    assert [round(lr_at(s, 10, 2, 1.0), 4) for s in range(10)] == \
        [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]


def test_output_loads_and_weights_hash_changes(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    summary = adapt(small_config(model_dir), [corpus], out)
    assert summary["finished"] and summary["steps"] == 6 and summary["mlm_head"] == "pretrained"
    encoder = AutoModel.from_pretrained(str(out), use_safetensors=True)
    assert type(encoder).__name__ == "BertModel"
    assert safetensors_sha256(out) != safetensors_sha256(model_dir)
    assert weights_hash(out) != weights_hash(model_dir)  # what the feature store records
    # the saved encoder is the trained one, not the input one
    source = load_file(str(model_dir / "model.safetensors"))
    saved = load_file(str(out / "model.safetensors"))
    key = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(saved[key], source["bert." + key])
    meta = json.loads((out / "adapt.json").read_text())
    assert meta["config"]["max_steps"] == 6 and meta["mlm_head_newly_initialised"] is False
    assert meta["n_texts"] == 60 and len(meta["losses"]) == 1
    assert (out / "tokenizer_config.json").is_file() and (out / HEAD_FILE).is_file()
    # the adapted head comes back with the encoder
    _, status = load_mlm_model(out)
    assert status == "adapted"


def test_mlm_loss_falls_on_repeated_corpus(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    texts = corpus.read_text().splitlines()
    before = mlm_loss(model_dir, texts, max_length=16, seed=5, n_masks=2, progress=False)
    summary = adapt(small_config(model_dir, max_steps=40, save_every=100, lr=1e-2), [corpus], out)
    after = mlm_loss(out, texts, max_length=16, seed=5, n_masks=2, progress=False)
    assert before["n_predicted"] == after["n_predicted"]  # the same masks scored
    assert after["mlm_loss"] < before["mlm_loss"] - 0.7, (before, after)  # ln(30) = 3.4 at start
    assert summary["last_loss_mean10"] < summary["first_loss"]
    ppl_before = pseudo_perplexity(model_dir, texts, max_texts=6, progress=False)
    ppl_after = pseudo_perplexity(out, texts, max_texts=6, progress=False)
    assert ppl_after["pseudo_perplexity"] < ppl_before["pseudo_perplexity"]
    assert ppl_before["n_tokens"] == sum(len(s.split()) for s in (SENTENCES * 2)[:6])


def test_resume_after_interruption_matches_uninterrupted_run(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "tiny")
    config = small_config(model_dir, save_every=100)
    whole = adapt(config, [corpus], tmp_path / "whole")
    part = adapt(config, [corpus], tmp_path / "parts", stop_after_steps=3)
    assert not part["finished"] and part["steps"] == 3
    assert not (tmp_path / "parts" / "model.safetensors").exists()  # no final model yet
    state = json.loads((tmp_path / "parts" / CHECKPOINT / "state.json").read_text())
    assert state["step"] == 3
    rest = adapt(config, [corpus], tmp_path / "parts")
    assert rest["resumed_from_step"] == 3 and rest["steps"] == 6 and rest["finished"]
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "parts" / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert whole["losses"][0]["loss"] == pytest.approx(rest["losses"][0]["loss"], rel=1e-5)


def test_longer_max_steps_continues_and_other_changes_refuse(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    adapt(small_config(model_dir, max_steps=4), [corpus], out)
    longer = adapt(small_config(model_dir, max_steps=7), [corpus], out)
    assert longer["resumed_from_step"] == 4 and longer["steps"] == 7
    with pytest.raises(ValueError, match=r"different config \(lr: 0.001 -> 0.0001\)"):
        adapt(small_config(model_dir, max_steps=8, lr=1e-4), [corpus], out)
    other = tmp_path / "other.txt"
    other.write_text("the cell .\n" * 30)
    with pytest.raises(ValueError, match="different text"):
        adapt(small_config(model_dir, max_steps=8), [other], out)


def test_model_without_mlm_head_gets_tied_head(tmp_path, corpus, caplog):
    model_dir = save_tiny_model(tmp_path / "headless", with_head=False)
    model, status = load_mlm_model(model_dir, seed=3)
    assert status == "initialised"
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    again, _ = load_mlm_model(model_dir, seed=3)  # the fresh head is a function of the seed
    torch.testing.assert_close(model.cls.predictions.transform.dense.weight,
                               again.cls.predictions.transform.dense.weight)
    out = tmp_path / "out"
    with caplog.at_level("WARNING"):
        summary = adapt(small_config(model_dir), [corpus], out)
    assert "NO masked-language-model head" in caplog.text
    assert summary["mlm_head"] == "initialised" and summary["mlm_head_newly_initialised"]
    assert json.loads((out / "adapt.json").read_text())["mlm_head_newly_initialised"] is True
    # the source's pooler (absent from the MLM model) is carried into the output
    source = load_file(str(model_dir / "model.safetensors"))
    saved = load_file(str(out / "model.safetensors"))
    torch.testing.assert_close(saved["pooler.dense.weight"], source["pooler.dense.weight"])
    report = mlm_loss(model_dir, SENTENCES, max_length=16, progress=False)
    assert report["mlm_head"] == "initialised" and "not the encoder" in report["note"]


def test_head_only_baseline_keeps_encoder(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "headless", with_head=False)
    out = tmp_path / "out"
    adapt(small_config(model_dir, train_encoder=False), [corpus], out)
    source = load_file(str(model_dir / "model.safetensors"))
    saved = load_file(str(out / "model.safetensors"))
    for key, value in source.items():
        torch.testing.assert_close(saved[key], value)
    head = load_file(str(out / HEAD_FILE))
    assert not torch.equal(head["cls.predictions.transform.dense.weight"],
                           load_mlm_model(model_dir)[0].cls.predictions.transform.dense.weight)


def test_bad_inputs(tmp_path, corpus):
    model_dir = save_tiny_model(tmp_path / "tiny")
    with pytest.raises(ValueError, match="no such file"):
        adapt(small_config(model_dir), [tmp_path / "missing.txt"], tmp_path / "out")
    with pytest.raises(ValueError, match="model's own folder"):
        adapt(small_config(model_dir), [corpus], model_dir)
    with pytest.raises(ValueError, match="device must be"):
        AdaptConfig(device="tpu")


def test_masked_lm_loss_equals_full_forward_loss():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64)
    model = BertForMaskedLM(config).eval()
    ids = torch.randint(5, 50, (4, 12))
    labels = torch.where(torch.rand(4, 12) < 0.3, ids, torch.full_like(ids, -100))
    attention = torch.ones_like(ids)
    attention[2, 8:] = 0
    labels[2, 8:] = -100
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        ours = masked_lm_loss(model, ids, attention, labels)
    torch.testing.assert_close(ours, reference)


def test_fresh_head_gets_its_own_learning_rate(tmp_path):
    from headstore.featurize.tuning.adapt import _optimizer

    model, _ = load_mlm_model(save_tiny_model(tmp_path / "headless", with_head=False))
    config = AdaptConfig(lr=1e-4, fresh_head_lr=1e-2)
    head = {id(p) for p in model.cls.parameters()} - {id(model.bert.embeddings.word_embeddings.weight)}
    for fresh in (True, False):
        groups = _optimizer(model, config, fresh_head=fresh).param_groups
        for group in groups:
            in_head = {id(p) in head for p in group["params"]}
            if fresh:
                assert len(in_head) == 1  # a group is all head or all encoder
            expected = 100.0 if (fresh and in_head == {True}) else 1.0
            assert group["lr_scale"] == pytest.approx(expected)
        assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_cli_command_runs_and_resumes(tmp_path, corpus):
    from click.testing import CliRunner
    from headstore.featurize.tuning.adapt_cli import adapt_command

    model_dir = save_tiny_model(tmp_path / "tiny")
    args = ["--data", str(corpus), "--model", str(model_dir), "--out", str(tmp_path / "out"),
            "--max-length", "16", "--batch-size", "8", "--device", "cpu"]
    first = CliRunner().invoke(adapt_command, args + ["--max-steps", "3", "--stop-after-steps", "2"])
    assert first.exit_code == 0, first.output
    assert "rerun the same command to resume" in first.output
    second = CliRunner().invoke(adapt_command, args + ["--max-steps", "3"])
    assert second.exit_code == 0, second.output
    assert json.loads((tmp_path / "out" / "adapt.json").read_text())["resumed_from_step"] == 2
    from headstore.cli import main  # bad input is shown by the cli group: one line, exit 2

    bad = CliRunner().invoke(main, ["adapt", *args, "--max-steps", "3", "--lr", "0.5"])
    assert bad.exit_code == 2 and "different config" in bad.output


def test_adapt_then_featurize_changes_the_store_fingerprint(tmp_path, corpus):
    """Adapted and base features never mix: the adapted encoder's store has another fingerprint, and
    featurizing it into the base encoder's store is refused."""
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize_texts
    from headstore.featurize.store.reader import FeatureStore
    from headstore.featurize.store.layout import StoreError

    model_dir = save_tiny_model(tmp_path / "tiny")
    out = tmp_path / "adapted"
    adapt(small_config(model_dir), [corpus], out)
    texts = SENTENCES
    featurize_texts(FeaturizeConfig(model=str(model_dir), dtype="float32"), texts, tmp_path / "base-store")
    featurize_texts(FeaturizeConfig(model=str(out), dtype="float32"), texts, tmp_path / "adapted-store")
    base, adapted = FeatureStore.open(tmp_path / "base-store"), FeatureStore.open(tmp_path / "adapted-store")
    assert base.manifest["weights_hash"] != adapted.manifest["weights_hash"]
    assert base.fingerprint != adapted.fingerprint
    with pytest.raises(StoreError, match="fingerprint"):
        featurize_texts(FeaturizeConfig(model=str(out), dtype="float32"), texts + ["a new text ."],
                        tmp_path / "base-store")


def test_whole_word_run_keeps_the_sentence_transformers_files(tmp_path, corpus):
    from headstore.featurize.tuning.checkpoint import copy_sidecars

    model_dir = save_tiny_model(tmp_path / "tiny")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    (model_dir / "1_Pooling").mkdir()
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    out = tmp_path / "out"
    summary = adapt(small_config(model_dir, whole_word=True), [corpus], out)
    assert summary["finished"] and summary["last_loss_mean10"] == summary["last_loss_mean10"]  # not NaN
    for name in ("modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
        assert (out / name).read_text() == (model_dir / name).read_text()
    assert not (out / "2_Normalize").exists()  # named in modules.json, but the source has no folder
    other = tmp_path / "other"
    other.mkdir()
    assert copy_sidecars(out, other, extra=(HEAD_FILE, "absent.json")) == [
        "modules.json", "sentence_bert_config.json", HEAD_FILE, "1_Pooling"]
