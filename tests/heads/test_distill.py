"""Distillation (`cli distill`, heads.experiments.distill.run): a teacher's energies over candidate sets moved into one
head on the same frozen features.

The known answer: a teacher that is itself a head on the store's features, and a BEIR folder whose every
judgement is that teacher's own top-2 documents, so the teacher is perfect on dev and test and a student that
learns its energies learns the task; a student of the teacher's shape can reproduce it exactly."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from headstore.data.text_id import doc_text
from headstore.featurize.store.reader import FeatureStore
from headstore.heads.artefacts.head import Head
from headstore.heads.scoring.losses.distill import embedding_mse_loss, kl_distill_loss, margin_mse_loss, teacher_spread
from headstore.heads.settings.config import HeadConfig

from .conftest import assert_bad_input, cli

SHAPE = ("--depth", "1", "--hidden", "16")
FAST = (*SHAPE, "--epochs", "100", "--lr", "1e-2", "--weight-decay", "0", "--batch-size", "16", "--patience", "100",
        "--no-guard", "--teacher-k", "20", "--random-k", "20", "--search-k", "40", "--unlabeled-anchors", "60",
        "--temperature", "0.3", "--pair-weight", "0")  # the teacher alone: the known answer is the teacher's


# --- the losses against plain loops ---------------------------------------------------------------------
def _plain_kl(Es, Et, valid, T):
    total = 0.0
    for s_row, t_row, ok in zip(Es, Et, valid):
        s = [-e / T for e, v in zip(s_row, ok) if v]
        t = [-e / T for e, v in zip(t_row, ok) if v]
        zs, zt = math.log(sum(math.exp(x) for x in s)), math.log(sum(math.exp(x) for x in t))
        total += sum(math.exp(b - zt) * ((b - zt) - (a - zs)) for a, b in zip(s, t))
    return total / len(Es) * T * T


def _plain_margin(Es, Et, valid):
    total = 0.0
    for s_row, t_row, ok in zip(Es, Et, valid):
        idx = [j for j, v in enumerate(ok) if v]
        best = min(idx, key=lambda j: t_row[j])
        others = [j for j in idx if j != best]
        total += sum(((s_row[j] - s_row[best]) - (t_row[j] - t_row[best])) ** 2 for j in others) / len(others)
    return total / len(Es)


@pytest.mark.parametrize("T", [0.5, 1.0, 3.0])
def test_kl_and_margin_mse_equal_plain_loops(T):
    gen = torch.Generator().manual_seed(0)
    H, B, C = 3, 5, 7
    Es, Et = torch.rand(H, B, C, generator=gen) * 4, torch.rand(B, C, generator=gen) * 4
    valid = torch.rand(B, C, generator=gen) > 0.3
    valid[:, :2] = True  # every anchor keeps two candidates
    got_kl = kl_distill_loss(Es, Et, valid, temperature=T)
    got_mm = margin_mse_loss(Es, Et, valid)
    for h in range(H):
        s, t, v = Es[h].tolist(), Et.tolist(), valid.tolist()
        assert got_kl[h].item() == pytest.approx(_plain_kl(s, t, v, T), rel=1e-5)
        assert got_mm[h].item() == pytest.approx(_plain_margin(s, t, v), rel=1e-5)
    same = kl_distill_loss(Et.expand(H, -1, -1), Et, valid, temperature=T)
    assert torch.allclose(same, torch.zeros(H), atol=1e-6)  # the teacher itself: no loss
    shifted = margin_mse_loss(Et + 2.5, Et, valid)  # margins ignore a shift of every energy
    assert torch.allclose(shifted, torch.zeros(1), atol=1e-5)


def test_embedding_mse_equals_a_plain_loop_and_is_free_of_the_teachers_scale():
    gen = torch.Generator().manual_seed(1)
    H, B, d = 2, 6, 4
    Zs, Zt = torch.randn(H, B, d, generator=gen), torch.randn(B, d, generator=gen) * 3
    t = Zt.tolist()
    mean = [sum(row[k] for row in t) / B for k in range(d)]
    spread = sum((row[k] - mean[k]) ** 2 for row in t for k in range(d)) / B  # a plain loop's variance
    assert teacher_spread(Zt) == pytest.approx(spread, rel=1e-6)
    got = embedding_mse_loss(Zs, Zt, spread=spread)
    for h in range(H):
        err = sum((a - b) ** 2 for ra, rb in zip(Zs[h].tolist(), t) for a, b in zip(ra, rb)) / B
        assert got[h].item() == pytest.approx(err / spread, rel=1e-5)
    assert torch.allclose(embedding_mse_loss(Zt.expand(H, -1, -1), Zt, spread=spread), torch.zeros(H))  # the teacher
    scaled = embedding_mse_loss(Zs * 10, Zt * 10, spread=teacher_spread(Zt * 10))  # the same fit at 10x the scale
    assert torch.allclose(scaled, got, rtol=1e-5)


def test_embedding_mse_of_one_anchor_is_on_the_scale_of_a_full_batch():
    """Issue 54 item 1: the normaliser is the teacher's variance over the training set, not over the batch, so a
    batch of one anchor (no variance of its own: the old loss was ~1e13) gives a loss and gradient of the order of
    a batch of 64."""
    gen = torch.Generator().manual_seed(2)
    Zt = torch.randn(200, 8, generator=gen) * 0.5  # (U, d) the teacher's outputs of every anchor
    spread = teacher_spread(Zt)
    Zs = (Zt + 0.3 * torch.randn(200, 8, generator=gen)).unsqueeze(0).requires_grad_(True)  # (1, U, d)
    full = embedding_mse_loss(Zs[:, :64], Zt[:64], spread=spread)
    one = embedding_mse_loss(Zs[:, 64:65], Zt[64:65], spread=spread)
    g_full, = torch.autograd.grad(full.sum(), Zs)
    g_one, = torch.autograd.grad(one.sum(), Zs)
    assert 0.1 < one.item() / full.item() < 10, (one.item(), full.item())
    assert g_one.norm() < 10 * g_full.norm() * 64 ** 0.5  # one row's gradient: at most that row's share, x 10
    with pytest.raises(ValueError, match="no variance"):
        embedding_mse_loss(Zs, Zt, spread=0.0)


def test_an_epoch_never_ends_in_a_batch_of_one():
    from headstore.heads.training.batches import epoch_batches, n_batches

    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    for n, b in [(65, 64), (129, 64), (64, 64), (66, 64), (1, 64), (5, 2), (3, 2), (2, 2)]:
        blocks = epoch_batches(gens, n, b)
        sizes = [blk.shape[1] for blk in blocks]
        assert sum(sizes) == n and len(blocks) == n_batches(n, b)
        assert min(sizes) >= min(2, n), (n, b, sizes)  # a remainder of one row joins the batch before it
        for h in range(3):  # every pair once per head
            assert sorted(torch.cat(list(blk[h] for blk in blocks)).tolist()) == list(range(n))


def test_kl_needs_a_positive_temperature():
    with pytest.raises(ValueError, match="temperature"):
        kl_distill_loss(torch.zeros(1, 1, 2), torch.zeros(1, 2), temperature=0.0)


# --- the known answer -------------------------------------------------------------------------------------
def _features(store: FeatureStore, texts: list[str], role: str) -> np.ndarray:
    return store.features(store.rows_for(store.row_ids(texts, role)))


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def taught(world, tmp_path_factory):
    """(teacher dir, a BEIR folder judged by the teacher's own top-2, features of its queries and documents)."""
    root = tmp_path_factory.mktemp("distill")
    teacher_dir = world.random_head("distill-teacher", HeadConfig(hidden=16, depth=1), seed=5)
    teacher = Head.load(teacher_dir)
    store = FeatureStore.open(world.store)
    docs, queries = _read_jsonl(world.beir / "corpus.jsonl"), _read_jsonl(world.beir / "queries.jsonl")
    fd = _features(store, [doc_text(d["title"], d["text"]) for d in docs], "document")
    fq = _features(store, [q["text"] for q in queries], "query")
    top = np.argsort(teacher.energy(fq, fd), axis=1, kind="stable")[:, :2]
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (beir / name).write_text((world.beir / name).read_text())
    splits = {"train": range(0, 20), "dev": range(20, 30), "test": range(30, 40)}
    for split, qs in splits.items():
        lines = "".join(f"{queries[q]['_id']}\t{docs[j]['_id']}\t1\n" for q in qs for j in top[q])
        (beir / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    return {"teacher": teacher_dir, "beir": beir, "fq": fq, "fd": fd, "test": list(splits["test"])}


def _distil(world, taught, out, *extra):
    r = cli("distill", "--store", world.store, "--data", taught["beir"], "--teacher", taught["teacher"], "--out", out,
            *FAST, *extra)
    assert r.exit_code == 0, r.output
    return json.loads((out / "metrics.json").read_text()), r.output


def _fidelity(head_dir, taught) -> float:
    """Mean Spearman, over the test queries, of a head's energies against the teacher's over the corpus."""
    teacher, head = Head.load(taught["teacher"]), Head.load(head_dir)
    fq = taught["fq"][taught["test"]]
    want, got = teacher.energy(fq, taught["fd"]), head.energy(fq, taught["fd"])
    return float(np.mean([spearmanr(w, g).statistic for w, g in zip(want, got)]))


@pytest.mark.parametrize("loss", ["kl", "margin-mse", "embedding-mse"])
def test_a_student_reaches_a_teacher_of_its_own_shape(world, taught, tmp_path, loss):
    metrics, output = _distil(world, taught, tmp_path / loss, "--distill-loss", loss)
    primary = metrics["primary"]
    teacher, student = metrics["teacher"]["head"][primary], metrics["head"][primary]
    frozen = metrics["baseline"][metrics["baseline_primary"]]
    assert teacher > 0.99  # the judgements are its own top-2
    assert student > frozen + 0.1, (frozen, student, teacher)  # most of the way from frozen (0.70) to 1
    frozen_fid = float(np.mean([spearmanr(-(q @ taught["fd"].T), e).statistic for q, e in zip(
        taught["fq"][taught["test"]], Head.load(taught["teacher"]).energy(taught["fq"][taught["test"]], taught["fd"]))]))
    fidelity = _fidelity(tmp_path / loss, taught)  # test queries, never anchors: ~0.9 (frozen: ~0.47)
    assert fidelity > max(0.85, frozen_fid + 0.3), (fidelity, frozen_fid)
    for column in ("frozen", "teacher", "distilled"):
        assert column in output
    assert metrics["distill"]["anchors"]["unlabeled_from"] == "the corpus documents"
    r = cli("eval", "--store", world.store, "--head", tmp_path / loss, "--data", taught["beir"], "--out",
            tmp_path / f"eval-{loss}")
    assert r.exit_code == 0, r.output  # a head like any other


# --- resume and bad input -----------------------------------------------------------------------------------
RESUME = (*SHAPE, "--epochs", "150", "--batch-size", "4", "--teacher-k", "10", "--random-k", "5", "--search-k", "20",
          "--unlabeled-anchors", "60", "--pair-weight", "0")


def test_a_distillation_killed_and_run_again_gives_the_same_head(world, taught, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    args = ["distill", "--store", world.store, "--data", taught["beir"], "--teacher", taught["teacher"], *RESUME]
    whole = tmp_path / "whole"
    r = cli(*args, "--out", whole)
    assert r.exit_code == 0, r.output
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "headstore.cli", *map(str, args), "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(killed.glob("teacher-targets-*.npz")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(killed.glob("teacher-targets-*.npz")) and not (killed / "head.safetensors").exists()  # mid-training
    r = cli(*args, "--out", killed)
    assert r.exit_code == 0, r.output
    assert "reused" in r.output
    again, first = Head.load(killed), Head.load(whole)
    for (name, a), (_, b) in zip(sorted(again.model.state_dict().items()), sorted(first.model.state_dict().items())):
        assert torch.equal(a, b), name  # bit for bit
    assert torch.equal(again.normalizer.center, first.normalizer.center)
    # a damaged cache: one line saying what to do, nothing written
    cache, = killed.glob("teacher-targets-*.npz")
    cache.write_bytes(b"not an npz")
    assert_bad_input(cli(*args, "--out", killed, "--overwrite"), cache.name, "delete the file")


def test_bad_teachers_and_settings_are_refused_in_one_line(world, taught, tmp_path):
    import shutil

    from headstore.heads.artefacts.head import EnsembleHead

    base = ["distill", "--store", world.store, "--data", taught["beir"], *SHAPE, "--epochs", "1"]
    other = tmp_path / "other-store-teacher"
    shutil.copytree(taught["teacher"], other)
    config = json.loads((other / "config.json").read_text())
    config["store_fingerprint"] = "0" * 64  # trained over another store
    (other / "config.json").write_text(json.dumps(config))
    assert_bad_input(cli(*base, "--teacher", other, "--out", tmp_path / "a"), "another store", "fingerprint")
    one = EnsembleHead([Head.load(taught["teacher"])]).save(tmp_path / "ensemble-of-one")
    assert_bad_input(cli(*base, "--teacher", one, "--out", tmp_path / "b"), "an ensemble of one")
    for value in ("0", "-1"):
        assert_bad_input(cli(*base, "--teacher", taught["teacher"], "--temperature", value, "--out", tmp_path / "c"),
                         "--temperature", "> 0")
    assert_bad_input(cli(*base, "--teacher", taught["teacher"], "--distill-loss", "kl+kl", "--out", tmp_path / "d"),
                     "--distill-loss", "kl+margin-mse")
    narrow = cli(*base, "--teacher", taught["teacher"], "--distill-loss", "embedding-mse", "--no-residual",
                 "--out-dim", "8", "--out", tmp_path / "e")  # a student of another width than the teacher's
    assert_bad_input(narrow, "embedding-mse needs the same width", "--out-dim")
    for path in ("a", "b", "c", "d", "e"):
        assert not (tmp_path / path).exists()  # nothing written


def test_an_ensemble_teacher_with_the_pairs_own_loss_and_the_cache_keyed_by_what_made_it(world, taught, tmp_path):
    from headstore.heads.artefacts.head import EnsembleHead

    members = [Head.load(world.random_head(f"distill-member-{i}", HeadConfig(hidden=16), seed=10 + i)) for i in range(2)]
    ens = EnsembleHead(members).save(tmp_path / "ensemble")
    args = ["distill", "--store", world.store, "--data", taught["beir"], "--teacher", ens, *SHAPE, "--epochs", "2",
            "--pair-weight", "0.5", "--distill-loss", "kl+margin-mse", "--teacher-k", "5", "--random-k", "3",
            "--search-k", "10", "--unlabeled-anchors", "10"]
    out = tmp_path / "out"
    r = cli(*args, "--out", out)
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["teacher"]["parameters"] == sum(p.numel() for m in members for p in m.model.parameters())
    assert metrics["distill"]["anchors"] == {"task_anchors": 20, "unlabeled_anchors": 10, "corpus": 60,
                                             "unlabeled_from": "the corpus documents", "unlabeled_available": 60,
                                             "unlabeled_held_out": 0}
    cache, = out.glob("teacher-targets-*.npz")
    with np.load(cache) as z:  # the teacher's energies, as Head.energy gives them, at the cached rows
        store = FeatureStore.open(world.store)
        feats = store.features(np.unique(np.concatenate([z["anchors"], z["candidates"].ravel()])))
        rows = np.unique(np.concatenate([z["anchors"], z["candidates"].ravel()]))
        a, c = np.searchsorted(rows, z["anchors"]), np.searchsorted(rows, z["candidates"])
        energy = EnsembleHead.load_dir(ens).energy(feats[a], feats)  # (U, rows)
        want = np.take_along_axis(energy, c, axis=1)
        np.testing.assert_allclose(z["energies"][z["valid"]], want[z["valid"]], rtol=1e-5, atol=1e-5)
        assert (z["candidates"] != z["anchors"][:, None])[z["valid"]].all()  # never its own candidate
    r = cli(*args, "--temperature", "2", "--out", out, "--overwrite")  # trains otherwise: the same targets
    assert r.exit_code == 0 and "reused" in r.output, r.output
    r = cli(*args[:-1], "12", "--out", out, "--overwrite")  # other anchors: other targets, beside the first
    assert r.exit_code == 0 and "made" in r.output, r.output
    assert "1 in " in r.output and "of another key" in r.output  # the other targets: said, not reused
    assert len(list(out.glob("teacher-targets-*.npz"))) == 2


# --- the columns beside the student: best single head, out of domain, cost ----------------------------------
def test_the_single_head_the_transfer_sets_and_the_cost_beside_the_student(data_world, tmp_path):
    """An ensemble teacher of two STS heads: the best single column is its member with the best dev figure, and
    every out-of-domain figure equals `cli eval --exclude-overlap` of that head (an independent pipeline)."""
    import polars as pl

    from headstore.heads.artefacts.head import EnsembleHead

    store, sts, pos = data_world["store"], data_world["sts05"], data_world["pos"]
    members = []
    for i, lr in enumerate(("1e-2", "1e-4")):
        r = cli("train-head", "--store", store, "--data", sts, "--out", tmp_path / f"m{i}", "--hidden", "16",
                "--epochs", "3", "--lr", lr, "--no-guard", "--seed", str(i))
        assert r.exit_code == 0, r.output
        members.append(Head.load(tmp_path / f"m{i}"))
    teacher = EnsembleHead(members).save(tmp_path / "teacher")
    out = tmp_path / "out"
    r = cli("distill", "--store", store, "--data", sts, "--teacher", teacher, "--out", out, "--transfer", pos,
            "--hidden", "16", "--epochs", "2", "--teacher-k", "5", "--random-k", "3", "--search-k", "10")
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    frame = pl.read_parquet(sts)  # dev as a table of its own, scored by cli eval as its test split
    dev_only = tmp_path / "dev.parquet"
    frame.filter(pl.col("split") == "dev").with_columns(pl.lit("test").alias("split")).write_parquet(dev_only)

    def evaluated(head, data, *extra):
        e = tmp_path / f"eval-{len(list(tmp_path.glob('eval-*')))}"
        r = cli("eval", "--store", store, "--head", head, "--data", data, "--out", e, *extra)
        assert r.exit_code == 0, r.output
        return json.loads((e / "metrics.json").read_text())

    dev = [evaluated(tmp_path / f"m{i}", dev_only) for i in range(2)]
    best = max(range(2), key=lambda i: dev[i]["head"][dev[i]["primary"]])
    assert metrics["single"]["ref"] == str(tmp_path / "teacher" / f"member-{best + 1}")  # the saved ensemble's copy
    assert metrics["single"]["dev"][metrics["single"]["primary"]] == pytest.approx(
        dev[best]["head"][dev[best]["primary"]], abs=1e-6)
    name = metrics["distill"]["transfer"] and next(iter(metrics["distill"]["transfer"]))
    for column, head in (("distill", out), ("teacher", teacher), ("single", tmp_path / f"m{best}")):
        want = evaluated(head, pos, "--exclude-overlap", sts)
        assert metrics[column]["transfer"][name] == pytest.approx(want["head"][want["primary"]], abs=1e-6), column
    assert metrics["frozen"]["transfer"][name] == pytest.approx(want["baseline"][want["baseline_primary"]], abs=1e-6)
    assert metrics["teacher"]["parameters"] == sum(p.numel() for m in members for p in m.model.parameters())
    assert metrics["single"]["parameters"] == sum(p.numel() for p in members[best].model.parameters())
    for block in ("frozen", "single", "teacher", "distill"):
        assert metrics[block]["seconds_per_1000"] > 0
    for words in ("best single", f"{name} (out of domain)", "s / 1,000 queries"):
        assert words in r.output


def test_unlabeled_texts_that_dev_or_test_items_score_are_never_anchors_nor_candidates(data_world, tmp_path):
    """An STS table's --unlabeled file holding two dev and one test sentence (second column: the first column's are
    left out as anchors when joined) and ten other stored texts: the three are counted (when joined) and never an
    anchor or a candidate of the cached targets; the ten are all drawn."""
    import polars as pl

    store, sts = data_world["store"], data_world["sts05"]
    frame = pl.read_parquet(sts)
    held = [*frame.filter(pl.col("split") == "dev")["sentence2"][:2], frame.filter(pl.col("split") == "test")
            ["sentence2"][0]]
    others = list(dict.fromkeys(pl.read_parquet(data_world["pos"])["positive"]))[:10]
    unlabeled = tmp_path / "unlabeled.parquet"
    pl.DataFrame({"text": [*held, *others]}).write_parquet(unlabeled)
    r = cli("train-head", "--store", store, "--data", sts, "--out", tmp_path / "teacher", "--hidden", "16",
            "--epochs", "2", "--no-guard")
    assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    r = cli("distill", "--store", store, "--data", sts, "--teacher", tmp_path / "teacher", "--out", out,
            "--unlabeled", unlabeled, "--hidden", "16", "--epochs", "1", "--teacher-k", "5", "--random-k", "3",
            "--search-k", "10", "--unlabeled-anchors", "100")
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    anchors = metrics["distill"]["anchors"]
    assert (metrics["unlabeled"]["also_dev_test"], anchors["unlabeled_anchors"]) == (3, 10), metrics["unlabeled"]
    fs = FeatureStore.open(store)
    dev_test = frame.filter(pl.col("split") != "train")
    scored = fs.rows_for(fs.row_ids([*dev_test["sentence1"], *dev_test["sentence2"]], "document"))
    cache, = out.glob("teacher-targets-*.npz")
    with np.load(cache) as z:
        assert not np.isin(z["anchors"], scored).any()
        assert not np.isin(z["candidates"][z["valid"]], scored).any()
        assert np.isin(fs.rows_for(fs.row_ids(others, "document")), z["anchors"]).all()


def test_a_corpus_holding_a_dev_or_test_query_never_gives_it_as_an_anchor():
    """A BEIR corpus that holds its own queries' texts (one store row for both, as in a store without prompts): the
    dev and test queries' rows are left out of the unlabeled anchors and counted; train queries and the other
    documents stay."""
    from types import SimpleNamespace

    from headstore.heads.kinds.ranking import IRSplit
    from headstore.heads.training.distill_targets import anchor_and_corpus_rows

    corpus = np.arange(100, 120)
    split = lambda rows: IRSplit([str(r) for r in rows], np.array(rows), [], corpus, {})  # noqa: E731
    task = SimpleNamespace(name="t", kind="ir", train=SimpleNamespace(anchor=np.array([100, 1]), positive=np.array(
        [105, 106])), corpus_rows=corpus, unlabeled=None, eval_sets={"dev": split([101, 2]), "test": split([102, 3])})
    anchors, got_corpus, note = anchor_and_corpus_rows(task, 50, 0)
    assert sorted(anchors) == [1, 100, *range(103, 120)]  # the train query (twice a row: once); 101, 102 left out
    assert note["unlabeled_held_out"] == 2 and note["unlabeled_anchors"] == 17
    assert np.array_equal(got_corpus, corpus)


def test_a_teacher_pass_stopped_part_way_goes_on_from_its_last_chunk(world, taught, tmp_path, monkeypatch):
    """make_targets keeps each finished chunk: a pass killed after two chunks, run again, computes only the rest
    and gives the targets of a pass never stopped (each chunk's random candidates its own stream)."""
    from headstore.heads.training import distill_targets as dt

    monkeypatch.setattr(dt, "CHUNK", 7)
    teacher = Head.load(taught["teacher"])
    X = torch.as_tensor(np.concatenate([taught["fq"], taught["fd"]]))
    anchors, corpus = np.arange(len(taught["fq"])), len(taught["fq"]) + np.arange(len(taught["fd"]))
    settings = {"teacher_k": 5, "random_k": 4, "search_k": 10, "unlabeled_anchors": 0, "sample_seed": 3}

    class Counting(dt.HeadTeacher):
        calls, fail_after = 0, None

        def energies(self, a, c):
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise KeyboardInterrupt  # the kill
            type(self).calls += 1
            return super().energies(a, c)

    whole = dt.make_targets(dt.HeadTeacher(teacher, X), X, anchors, corpus, settings, progress=False)
    parts = tmp_path / "parts"
    Counting.fail_after = 4  # two chunks of two teacher calls each
    with pytest.raises(KeyboardInterrupt):
        dt.make_targets(Counting(teacher, X), X, anchors, corpus, settings, progress=False, parts_dir=parts)
    assert len(list(parts.glob("chunk-*.npz"))) == 2
    Counting.calls, Counting.fail_after = 0, None
    again = dt.make_targets(Counting(teacher, X), X, anchors, corpus, settings, progress=False, parts_dir=parts)
    n_chunks = -(-len(anchors) // 7)
    assert Counting.calls == 2 * (n_chunks - 2)  # only the chunks not kept
    for name in ("anchors", "candidates", "energies", "valid"):
        np.testing.assert_array_equal(getattr(again, name), getattr(whole, name), err_msg=name)


def test_a_student_started_from_its_own_teacher_stays_there(world, taught, tmp_path):
    """--student-init single with the teacher as the single head: the student starts equal to its teacher, so its
    distillation loss is 0 up to float rounding (a known answer) and, at a learning rate too small for AdamW's
    rounding-noise steps to add up, its weights come out where they started, its normaliser the teacher's."""
    out = tmp_path / "fixed"
    metrics, output = _distil(world, taught, out, "--single", taught["teacher"], "--student-init", "single",
                              "--distill-loss", "kl+margin-mse", "--epochs", "2", "--lr", "1e-7")
    assert metrics["history"][0]["loss"] < 1e-6, metrics["history"][0]
    start, end = Head.load(taught["teacher"]), Head.load(out)
    for (name, a), (_, b) in zip(sorted(start.model.state_dict().items()), sorted(end.model.state_dict().items())):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4, msg=name)
    assert torch.equal(start.normalizer.center, end.normalizer.center)
    assert metrics["head"][metrics["primary"]] == pytest.approx(metrics["teacher"]["head"][metrics["primary"]])
    bad = cli("distill", "--store", world.store, "--data", taught["beir"], "--teacher", taught["teacher"],
              "--student-init", "single", *SHAPE, "--epochs", "1", "--out", tmp_path / "none")
    assert_bad_input(bad, "--student-init single", "--single")


def test_the_targets_key_holds_the_texts_its_rows_stand_for():
    """Issue 54, item 5's audit: a store made again with the same fingerprint can hold other texts at the same
    rows; the targets cache is keyed by the texts, not only the row numbers."""
    from types import SimpleNamespace

    import numpy as np
    import polars as pl

    from headstore.heads.training.distill_targets import targets_key

    def key(ids):
        store = SimpleNamespace(fingerprint="fp", texts=pl.DataFrame({"text_id": ids}))
        return targets_key("teacher", store, ("features", "features"), np.array([0, 2]), np.array([1, 2, 3]),
                           {"teacher_k": 5})
    assert key(["t0", "t1", "t2", "t3"]) == key(["t0", "t1", "t2", "t3"])
    assert key(["t0", "t1", "t2", "t3"]) != key(["t0", "t1", "t9", "t3"])  # row 2 holds another text now
