"""Fine-tuning a head trained on a prompted store (issue 32 item 6): the encoder is given each row's text under
the prompt featurize gave it, pooled without the prompt where the model's Pooling says so, so at step 0 (before
any update) it reproduces the store's rows."""
import json
import shlex

import numpy as np
import pytest
import torch

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.apply.finetune_negatives import RowEncoder
from headstore.heads.apply.row_inputs import sentence_embeddings
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .conftest import cli
from .finetune_world import tiny_beir, tiny_bert

PROMPTS = {"query": "alpha beta ", "document": "omega "}  # words of the tiny vocabulary: real prompt tokens


def _sentence_model(folder):
    """A tiny BERT without dropout (train mode = eval mode at step 0), laid out as a sentence-transformers
    model whose mean Pooling leaves the prompt out (include_prompt: false)."""
    tiny_bert(folder, layers=2)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode": "mean", "include_prompt": False}))
    return folder


@pytest.fixture(scope="module")
def prompted(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft-prompts")
    model = _sentence_model(root / "model")
    beir = tiny_beir(root / "beir", n_docs=40, n_train=20, n_test=8)
    store = root / "store"
    featurize(FeaturizeConfig(model=str(model), dtype="float32", query_prompt=PROMPTS["query"],
                              document_prompt=PROMPTS["document"]), [str(beir)], store)
    assert FeatureStore.open(store).prompts == PROMPTS
    head = root / "head"
    train_head(str(store), str(beir), str(head), HeadConfig(hidden=16), TrainConfig(epochs=1, batch_size=8, mined_k=2),
               progress=False)
    return root, model, store, head


def test_step_zero_embeddings_are_the_stores_rows(prompted, monkeypatch):
    """Every text the encoder makes before its first update (dev's queries and documents, the negatives cache,
    step 0's anchors and positives) is the store's row."""
    root, model, store, head = prompted
    seen = []  # (path, store rows, what the encoder made of them) of every encoder call before the first update

    def recorded(path, method):
        def call(self, rows):
            out = method(self, rows)
            if self.version == 0:
                seen.append((path, np.asarray(rows).reshape(-1), out.detach().clone()))
            return out
        return call

    for path in ("__call__", "frozen"):  # with gradients (a training batch), without (dev, the negatives cache)
        monkeypatch.setattr(RowEncoder, path, recorded(path, getattr(RowEncoder, path)))
    summary = finetune(str(head), str(root / "ft"), FinetuneConfig(device="cpu", batch_size=8, max_steps=1, mined_k=2),
                       encoder=str(model), progress=False)
    features = FeatureStore.open(store)
    assert [p for p, *_ in seen].count("__call__") == 2 and [p for p, *_ in seen].count("frozen") >= 3
    for _, rows, made in seen:
        np.testing.assert_allclose(made.numpy(), features.features(rows), rtol=1e-5, atol=1e-5)
    # the command finetune.json gives to featurize with the new encoder makes the store the new head accepts
    args = shlex.split(summary["next"][0])[1:]
    assert args[args.index("--query-prompt") + 1] == PROMPTS["query"]
    args[args.index("STORE2")] = str(root / "store2")
    r = cli(*args)  # the store's dtype and prompts are in it
    assert r.exit_code == 0, r.output
    new_head = json.loads((root / "ft" / "head" / "config.json").read_text())
    assert FeatureStore.open(root / "store2").fingerprint == new_head["store_fingerprint"]


def test_the_bare_texts_would_differ_from_the_rows(prompted):
    """The check above can fail: the texts without their prompts give other embeddings than the store's."""
    root, model, store, head = prompted
    features = FeatureStore.open(store)
    rows = features.texts.sort("row")["row"].to_list()[:6]
    texts = features.texts.sort("row")["text"].to_list()[:6]
    from headstore.featurize.encoder.pooling import Pooler
    from headstore.featurize.encoder.sentence import SentenceSpec
    from transformers import AutoModel, AutoTokenizer

    encoder, tokenizer = AutoModel.from_pretrained(model).eval(), AutoTokenizer.from_pretrained(model)
    pooler = Pooler.of(SentenceSpec.from_parts(features.manifest), model)
    with torch.no_grad():
        bare = sentence_embeddings(encoder, tokenizer, texts, 32, pooler, -1, torch.device("cpu"), False)
    assert not np.allclose(bare.numpy(), features.features(np.asarray(rows)), atol=1e-3)
