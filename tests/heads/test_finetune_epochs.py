"""cli finetune trains until dev stops improving (issue 37 section 3): early stopping restores the best epoch's
encoder and head exactly; dev is scored on a fixed corpus subsample holding every judged document of the dev
queries; the negatives cache gives the loss and head gradients of negatives encoded in the step."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.run.local import featurize
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.apply.finetune import FinetuneConfig, finetune, prepare
from headstore.heads.apply.finetune_dev import dev_task
from headstore.heads.apply.finetune_negatives import mined_negatives
from headstore.heads.kinds import load_task
from headstore.heads.settings.config import HeadConfig, TrainConfig
from headstore.heads.training.run import train_head

from .finetune_world import tiny_beir, tiny_bert


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A 2-layer tiny BERT, 60 train queries (6 carved for dev) over 80 documents, a head with 2 mined negatives
    per pair and a constant lr (no warm-up, no decay: runs of different lengths take the same first steps)."""
    root = tmp_path_factory.mktemp("ft-epochs")
    model = tiny_bert(root / "model", layers=2)
    beir = tiny_beir(root / "beir", n_docs=80, n_train=60, n_test=10)
    featurize(FeaturizeConfig(model=str(model), dtype="float32", batch_tokens=2048), [str(beir)], root / "store")
    train_head(str(root / "store"), str(beir), str(root / "head"), HeadConfig(hidden=16, out_dim=8, residual=False),
               TrainConfig(epochs=1, batch_size=8, mined_k=2, schedule="constant"), progress=False)
    return root, model, beir


def _run(world, name, **kw):
    root, model, _ = world
    cfg = FinetuneConfig(device="cpu", batch_size=8, warmup_ratio=0.0, **kw)
    return root / name, finetune(str(root / "head"), str(root / name), cfg, encoder=str(model), progress=False)


def _state(out):
    return load_file(str(out / "encoder" / "model.safetensors")), load_file(str(out / "head" / "head.safetensors"))


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_early_stopping_keeps_the_best_epoch_exactly(world):
    """A rate high enough that the dev figure rises, then falls: the run stops `patience` epochs after its best
    and writes that epoch's encoder and head, bit for bit those of a run that stopped there by itself."""
    out, summary = _run(world, "stop", encoder_lr=3e-2, max_epochs=6, patience=1)
    curve = [c["dev"] for c in summary["dev_curve"]]
    best = summary["best_epoch"]
    assert summary["stopped_because"] == "patience" and best >= 1, curve
    assert summary["epochs_run"] == best + 1 == len(curve) - 1  # one epoch past the best (patience 1), then stop
    assert curve[best] == max(curve) == summary["best_dev"] and curve[-1] <= curve[best]
    assert [c["epoch"] for c in summary["dev_curve"]] == list(range(len(curve)))  # epoch 0: the starting point
    assert summary["steps"] == summary["epochs_run"] * summary["steps_per_epoch"]
    # the same run, stopped at the best epoch by max_epochs: the same batches, dropout and rates up to there
    ref, ref_summary = _run(world, "stop-ref", encoder_lr=3e-2, max_epochs=best, patience=1, keep="last")
    assert [c["dev"] for c in ref_summary["dev_curve"]] == curve[:best + 1]
    assert _equal(_state(out)[0], _state(ref)[0]) and _equal(_state(out)[1], _state(ref)[1])
    # and not the last epoch's state: keep = "last" writes that one
    last, _ = _run(world, "stop-last", encoder_lr=3e-2, max_epochs=6, patience=1, keep="last")
    assert not _equal(_state(out)[0], _state(last)[0])


def test_a_run_that_never_beats_the_start_writes_the_start(world):
    """A rate so high that every epoch is worse on dev: after `patience` epochs it stops and writes the encoder
    and head it started from."""
    root, model, _ = world
    out, summary = _run(world, "worse", encoder_lr=0.1, max_epochs=6, patience=2)
    assert summary["best_epoch"] == 0 and summary["stopped_because"] == "patience" and summary["epochs_run"] == 2
    assert all(c["dev"] < summary["dev_curve"][0]["dev"] for c in summary["dev_curve"][1:])
    encoder, head = _state(out)
    assert _equal(encoder, load_file(str(model / "model.safetensors")))
    assert _equal(head, load_file(str(root / "head" / "head.safetensors")))


def test_dev_subsample_holds_every_judged_document_and_is_fixed(world):
    root, _, beir = world
    store = FeatureStore.open(root / "store")
    task = load_task(str(beir), store)
    full = task.eval_sets["dev"]
    a, b = dev_task(task, dev_docs=20), dev_task(task, dev_docs=20)
    sub = a.eval_sets["dev"]
    assert list(a.eval_sets) == ["dev"] and sub.query_ids == full.query_ids
    judged = {d for q in full.query_ids for d in full.qrels[q]}  # plain reference: every judged document
    assert judged and judged <= set(sub.doc_ids)
    assert len(sub.doc_ids) == len(judged) + 20 and len(set(sub.doc_ids)) == len(sub.doc_ids)
    assert sub.doc_ids == b.eval_sets["dev"].doc_ids  # the same draw every time
    position = {d: i for i, d in enumerate(full.doc_ids)}
    assert [position[d] for d in sub.doc_ids] == sorted(position[d] for d in sub.doc_ids)  # the corpus order
    np.testing.assert_array_equal(sub.doc_rows, full.doc_rows[[position[d] for d in sub.doc_ids]])
    assert dev_task(task, dev_docs=10_000).eval_sets["dev"] is full  # no smaller than the corpus: the corpus
    # two runs of other settings and seeds score dev on the same documents
    _, s1 = _run(world, "dev-a", encoder_lr=1e-3, max_steps=1, dev_docs=20)
    _, s2 = _run(world, "dev-b", encoder_lr=5e-3, max_steps=1, dev_docs=20, seed=3, setup="adapters")
    assert s1["dev_set"] == s2["dev_set"] and s1["dev_set"]["documents"] == len(sub.doc_ids)


def test_negatives_cache_gives_the_loss_of_negatives_encoded_in_the_step(world):
    """At an epoch's first step the cache holds what the encoder makes of the negatives now: the loss and the
    head's gradients equal those of negatives encoded in the step; the encoder gets gradients from the anchors
    and positives only (encoded in the step, the negatives would add their own)."""
    root, model, _ = world
    run = prepare(str(root / "head"), FinetuneConfig(device="cpu", batch_size=8), encoder=str(model))
    trainer = run.trainer
    run.model.eval()  # no dropout: the step's own forward passes repeat exactly
    trainer.set_trainable(trainer.blocks, trainer.unfrozen(0))  # as step 0 does
    trainer.refresh()
    idx = trainer.batches[0]
    rows = trainer.cache.rows[trainer.cache.index[idx]]  # (b, K) the batch's negatives
    assert rows.shape[1] == 2  # the head's mined_k
    torch.testing.assert_close(trainer.cache.rows[trainer.cache.index], mined_negatives(run.src, FinetuneConfig()))

    def loss_and_grads(negatives):
        for p in trainer.trainable:
            p.grad = None
        loss = trainer.batch_loss(idx, negatives)
        loss.backward()
        head = [p.grad.clone() for p in run.head.parameters()]
        encoder = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for b in trainer.blocks for _, p in b]
        return loss.detach(), head, encoder

    cached = loss_and_grads(trainer.cache(idx))
    in_step = loss_and_grads(trainer.encoder(rows.flatten()).unflatten(0, rows.shape))
    torch.testing.assert_close(cached[0], in_step[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(cached[1], in_step[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(a.abs().sum() > 0 for a in cached[2])  # the anchors' and positives' gradients
    assert any(not torch.allclose(a, b) for a, b in zip(cached[2], in_step[2]))  # the negatives' own gradients
