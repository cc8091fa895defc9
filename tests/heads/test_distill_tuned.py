"""`cli distill --teacher FINETUNE_OUT`: a tuned encoder with its head as the teacher (heads.experiments.distill.tuned).

A tiny BERT tuned by `cli finetune`; its scores must come from the tuned encoder's own store of the same texts: the
store the distillation builds (said with its size and an estimate first) holds, for every text, what `cli featurize
--model FINETUNE_OUT/encoder` gives, and the cached targets equal the tuned head's energies on those features."""
from __future__ import annotations

import json

import numpy as np
import pytest

from headstore.featurize.store.reader import FeatureStore
from headstore.heads.apply.finetune import FinetuneConfig, finetune
from headstore.heads.artefacts.head import Head

from .conftest import assert_bad_input, cli
from .finetune_world import trained_head_world

STUDENT = ("--depth", "1", "--hidden", "16", "--epochs", "2", "--batch-size", "8", "--teacher-k", "5", "--random-k",
           "3", "--search-k", "10", "--unlabeled-anchors", "20")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root, model, beir, store, head = trained_head_world(tmp_path_factory.mktemp("distill-tuned"), layers=2, epochs=1)
    out = root / "finetuned"
    finetune(str(head), str(out), FinetuneConfig(device="cpu", batch_size=8, encoder_lr=1e-3, keep="last",
                                                 max_steps=3), encoder=str(model), progress=False)
    return {"root": root, "beir": beir, "store": store, "ft": out}


def test_a_tuned_encoder_teacher_scores_from_its_own_store(tuned, tmp_path):
    root, ft = tuned["root"], tuned["ft"]
    args = ["distill", "--store", tuned["store"], "--data", tuned["beir"], "--teacher", ft, *STUDENT]
    r = cli(*args, "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert "are not in it" in r.output and "encoding them with the tuned encoder" in r.output  # said before building
    head = Head.load(ft / "head")
    built = FeatureStore.open(ft / f"store-{head.store_fingerprint[:12]}")  # the default place, keyed
    assert built.fingerprint == head.store_fingerprint
    reference = root / "store-reference"  # the tuned encoder's store made by the existing command
    r2 = cli("featurize", "--model", ft / "encoder", "--data", tuned["beir"], "--store", reference, "--dtype", "float32")
    assert r2.exit_code == 0, r2.output
    ref = FeatureStore.open(reference)
    assert ref.fingerprint == built.fingerprint
    student = FeatureStore.open(tuned["store"])
    cache, = (tmp_path / "a").glob("teacher-targets-*.npz")
    with np.load(cache) as z:
        rows = np.unique(np.concatenate([z["anchors"], z["candidates"].ravel()]))
        ids = student.texts["text_id"].to_numpy()[rows]
        feats = ref.features(ref.rows_for(ids))  # the tuned encoder's features of those texts
        np.testing.assert_allclose(built.features(built.rows_for(ids)), feats, atol=1e-5)
        energy = head.energy(feats[np.searchsorted(rows, z["anchors"])], feats)
        want = np.take_along_axis(energy, np.searchsorted(rows, z["candidates"]), axis=1)
        np.testing.assert_allclose(z["energies"][z["valid"]], want[z["valid"]], rtol=1e-4, atol=1e-4)
        frozen = np.take_along_axis(student.features(rows)[np.searchsorted(rows, z["anchors"])] @
                                    student.features(rows).T, np.searchsorted(rows, z["candidates"]), axis=1)
        assert not np.allclose(-frozen[z["valid"]], z["energies"][z["valid"]], atol=1e-2)  # not the student's
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["teacher"]["head"][metrics["teacher"]["primary"]] == pytest.approx(
        _eval(reference, ft / "head", tuned["beir"], tmp_path / "eval"), abs=1e-6)  # teacher = its own store's eval
    r = cli(*args, "--out", tmp_path / "b")  # a second run: the store holds every text now
    assert r.exit_code == 0 and "are not in it" not in r.output, r.output


def _eval(store, head, data, out) -> float:
    r = cli("eval", "--store", store, "--head", head, "--data", data, "--out", out)
    assert r.exit_code == 0, r.output
    m = json.loads((out / "metrics.json").read_text())
    return m["head"][m["primary"]]


def test_a_teacher_store_of_another_encoder_is_refused(tuned, tmp_path):
    base = ["distill", "--store", tuned["store"], "--data", tuned["beir"], *STUDENT]
    assert_bad_input(cli(*base, "--teacher", tuned["ft"], "--teacher-store", tuned["store"], "--out", tmp_path / "a"),
                     "--teacher-store", "not the tuned encoder's")
    head_teacher = tuned["root"] / "head"  # a head over the student's store takes no teacher store
    assert_bad_input(cli(*base, "--teacher", head_teacher, "--teacher-store", tuned["store"], "--out", tmp_path / "b"),
                     "--teacher-store", "only for a tuned-encoder teacher")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("teacher_store_first", [False, True])
def test_a_student_store_of_several_layers_builds_the_teacher_store_with_the_heads_layers(tuned, tmp_path,
                                                                                        teacher_store_first):
    """The texts the teacher store lacks are encoded with the settings that make the teacher head's fingerprint: the
    teacher store's own where it exists, else the head's layers, never the student store's several layers."""
    ft, head = tuned["ft"], Head.load(tuned["ft"] / "head")
    extra = tmp_path / "extra.txt"
    extra.write_text("alpha omega river 101\nstone tree kappa 102\nsigma zeta 103\n")
    student, teacher_store = tmp_path / "student", tmp_path / "teacher-store"
    model = json.loads((tuned["store"] / "config.json").read_text())["model"]
    r = cli("featurize", "--model", model, "--data", tuned["beir"], "--unlabeled", extra, "--store", student,
            "--layers", "-1,-2", "--dtype", "float32")
    assert r.exit_code == 0, r.output
    if teacher_store_first:  # the tuned encoder's store of the task's texts, without the extra ones
        r = cli("featurize", "--model", ft / "encoder", "--data", tuned["beir"], "--store", teacher_store,
                "--dtype", "float32")
        assert r.exit_code == 0, r.output
    r = cli("distill", "--store", student, "--data", tuned["beir"], "--unlabeled", extra, "--teacher", ft,
            "--teacher-store", teacher_store, "--array", "features+features_layer-2", "--mix-mode", "concat",
            "--no-residual", "--anchor-weight", "1", *STUDENT, "--out", tmp_path / "out")
    assert r.exit_code == 2 and "--anchor-weight 0" in r.output  # an anchor asked for: a concat head has no one input
    assert "are not in it" in r.output  # the teacher store was completed first, said with its cost
    r = cli("distill", "--store", student, "--data", tuned["beir"], "--unlabeled", extra, "--teacher", ft,
            "--teacher-store", teacher_store, "--array", "features+features_layer-2", "--mix-mode", "concat",
            "--no-residual", "--anchor-weight", "0", *STUDENT, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    built = FeatureStore.open(teacher_store)
    assert built.fingerprint == head.store_fingerprint and built.manifest["layers"] == [-1]
    assert len(built.find_rows(np.asarray(FeatureStore.open(student).texts["text_id"]))) == built.n_texts


def test_a_student_store_of_another_dtype_builds_the_teacher_store_with_the_heads_settings(tuned, tmp_path):
    """Issue 54, item 8: every fingerprint setting of a new teacher store comes from the store the teacher head was
    trained on (float32 here), not from the student store (float16: featurize's default)."""
    ft, head = tuned["ft"], Head.load(tuned["ft"] / "head")
    student, teacher_store = tmp_path / "student", tmp_path / "teacher-store"
    model = json.loads((tuned["store"] / "config.json").read_text())["model"]
    r = cli("featurize", "--model", model, "--data", tuned["beir"], "--store", student, "--dtype", "float16")
    assert r.exit_code == 0, r.output
    r = cli("distill", "--store", student, "--data", tuned["beir"], "--teacher", ft, "--teacher-store", teacher_store,
            *STUDENT, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    built = FeatureStore.open(teacher_store)
    assert built.fingerprint == head.store_fingerprint and built.manifest["dtype"] == "float32"


def test_a_teacher_store_that_would_not_match_is_refused_before_encoding(tuned, tmp_path):
    """Issue 54, item 8: settings that cannot make the teacher head's fingerprint (here its encoder's weights moved
    since it was tuned) are refused in one line before any text is encoded, and no store is left at the default
    path (which made every rerun fail)."""
    import shutil

    from safetensors.torch import load_file, save_file

    ft = tmp_path / "ft"
    shutil.copytree(tuned["ft"], ft, ignore=shutil.ignore_patterns("store-*"))  # no teacher store made yet
    config = json.loads((ft / "head" / "config.json").read_text())
    (ft / "head" / "config.json").write_text(json.dumps({**config, "encoder_dir": str(ft / "encoder")}))
    weights = load_file(str(ft / "encoder" / "model.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0
    save_file(weights, str(ft / "encoder" / "model.safetensors"))
    args = ["distill", "--store", tuned["store"], "--data", tuned["beir"], "--teacher", ft, *STUDENT]
    r = cli(*args, "--out", tmp_path / "out")
    assert_bad_input(r, "weights_hash", "nothing encoded", "--teacher-store")
    assert "are not in it" not in r.output
    assert not list(ft.glob("store-*")) and not (tmp_path / "out").exists()
