"""Every bad input through the CLI: one `Error: path:line/row: problem (what to do)` line, exit 2, no
traceback (docs/bad-input.md lists the cases). Each test feeds a damaged file or option to a command."""
import json
import shutil

import polars as pl
import pytest

from headstore.featurize.store.layout import fingerprint_of

from .conftest import FAST, assert_bad_input, cli


def train(w, data, out, *extra):
    return cli("train-head", "--store", w["store"], "--data", data, "--out", out, *FAST, *extra)


# ---- files: empty, header-only, truncated, mis-encoded -------------------------------------------

@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_zero_byte_file(data_world, tmp_path, suffix):
    bad = tmp_path / f"pairs{suffix}"
    bad.write_bytes(b"")
    assert_bad_input(train(data_world, bad, tmp_path / "h"), bad, "empty file (0 bytes)")


@pytest.mark.parametrize("suffix, body", [(".csv", "anchor,positive\n"), (".tsv", "sentence1\tsentence2\tscore\r\n"),
                                          (".jsonl", "\n\n")])
def test_header_only_file(data_world, tmp_path, suffix, body):
    bad = tmp_path / f"pairs{suffix}"
    bad.write_text(body)
    if suffix == ".jsonl":  # no object at all: nothing to detect the format from
        assert_bad_input(train(data_world, bad, tmp_path / "h"), bad, "no JSON objects")
    else:
        assert_bad_input(train(data_world, bad, tmp_path / "h"), bad, "a header but no rows")


def test_header_only_parquet(data_world, tmp_path):
    bad = tmp_path / "pairs.parquet"
    pl.DataFrame({"anchor": [], "positive": []}, schema={"anchor": pl.String, "positive": pl.String}).write_parquet(bad)
    assert_bad_input(train(data_world, bad, tmp_path / "h"), bad, "a header but no rows")


def test_header_only_qrels(data_world, tmp_path):
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")
    assert_bad_input(train(data_world, beir, tmp_path / "h"), beir / "qrels" / "test.tsv", "no judgements")


def test_empty_corpus(data_world, tmp_path):
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    (beir / "corpus.jsonl").write_text("\n")
    assert_bad_input(train(data_world, beir, tmp_path / "h"), beir / "corpus.jsonl", "no documents")


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_truncated_or_foreign_parquet_during_detection(data_world, tmp_path, damage):
    bad = tmp_path / "pairs.parquet"
    if damage == "truncated":
        whole = data_world["pos"].read_bytes()
        bad.write_bytes(whole[: len(whole) // 2])
    else:
        bad.write_text("anchor,positive\na,b\n")  # a CSV with the wrong suffix
    assert_bad_input(train(data_world, bad, tmp_path / "h"), bad, "not a readable Parquet file")


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_invalid_utf8_names_file_and_line(data_world, tmp_path, suffix, sep):
    bad = tmp_path / f"sts{suffix}"
    bad.write_bytes(sep.join(["sentence1", "sentence2", "score"]).encode() + b"\n"
                    + sep.join(["a b", "c d", "1"]).encode() + b"\n"
                    + b"caf\xe9" + sep.encode() + b"x" + sep.encode() + b"2\n")
    assert_bad_input(train(data_world, bad, tmp_path / "h"), f"{bad}:3:", "not valid UTF-8")


def test_nul_in_text_is_refused_with_its_line_and_row(data_world, tmp_path):
    csv = tmp_path / "pairs.csv"
    csv.write_text("anchor,positive\nfine,also fine\nbad\x00text,x\n")
    assert_bad_input(train(data_world, csv, tmp_path / "h"), f"{csv}:3:", "NUL")
    parquet = tmp_path / "pairs.parquet"
    pl.DataFrame({"anchor": ["ok", "a\x00b"], "positive": ["x", "y"]}).write_parquet(parquet)
    assert_bad_input(train(data_world, parquet, tmp_path / "h"), f"{parquet}: row 1:", "NUL")
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    (beir / "queries.jsonl").write_text((beir / "queries.jsonl").read_text() + '{"_id": "qz", "text": "a\\u0000b"}\n')
    n = len((beir / "queries.jsonl").read_text().splitlines())
    assert_bad_input(train(data_world, beir, tmp_path / "h2"), f"{beir / 'queries.jsonl'}:{n}:", "NUL")


def test_huge_qrels_grade_names_its_line(data_world, tmp_path):
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    test = beir / "qrels" / "test.tsv"
    lines = test.read_text().splitlines()
    lines[2] = lines[2].rsplit("\t", 1)[0] + "\t99999999999999999999"
    test.write_text("\n".join(lines) + "\n")
    assert_bad_input(train(data_world, beir, tmp_path / "h"), f"{test}:3:", "out of range")


def test_negative_grades_are_counted_and_read_as_non_relevant(data_world, tmp_path, caplog):
    """A negative grade is non-relevant (gain 0, as trec_eval): the same numbers as grade 0, and a warning."""
    results = {}
    for grade in ("0", "-1"):
        beir = shutil.copytree(data_world["beir"], tmp_path / f"beir{grade}")
        test = beir / "qrels" / "test.tsv"
        lines = test.read_text().splitlines()
        extra = [f"{q}\td{i}\t{grade}" for q, i in (("q30", 0), ("q31", 1), ("q32", 2))]
        test.write_text("\n".join(lines + extra) + "\n")
        r = cli("eval", "--store", data_world["store"], "--head", data_world["head"], "--data", beir,
                "--out", tmp_path / f"eval{grade}")
        assert r.exit_code == 0, r.output
        results[grade] = json.loads((tmp_path / f"eval{grade}" / "metrics.json").read_text())
        if grade == "-1":
            assert "3 judgement(s) with a negative grade, read as non-relevant (line 14, 15, 16)" in caplog.text
    assert results["-1"]["head"] == results["0"]["head"] and results["-1"]["baseline"] == results["0"]["baseline"]


# ---- score scales and split names -------------------------------------------------------------------

def test_scores_outside_0_5_ask_for_score_range(data_world, tmp_path):
    last = assert_bad_input(train(data_world, data_world["sts10"], tmp_path / "h"), data_world["sts10"],
                            "--score-range", "row ")
    assert "neither 0-1 nor 0-5" in last


def test_declared_score_range_is_used_and_checked_row_by_row(data_world, tmp_path):
    r = train(data_world, data_world["sts10"], tmp_path / "h", "--score-range", "0,10", "--loss", "cosent")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "h" / "metrics.json").read_text())["score_range"] == [0, 10]
    scores = pl.read_parquet(data_world["sts05"])["score"]
    first = next(i for i, s in enumerate(scores) if s > 4)
    assert_bad_input(train(data_world, data_world["sts05"], tmp_path / "h2", "--score-range", "0,4"),
                     f"{data_world['sts05']}: row {first}:", "outside the declared range 0,4")


@pytest.mark.parametrize("loss", ["mnr", "triplet"])
def test_0_1_table_with_other_split_names_trains_positive_pair_losses(data_world, tmp_path, loss):
    """A 0-1 table (Train/validation/TEST) is detected, not divided by 5: mnr and triplet get their pairs."""
    r = train(data_world, data_world["sts01"], tmp_path / "h", "--loss", loss)
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "h" / "metrics.json").read_text())
    assert m["score_range"] == [0, 1] and m["dev_made"] == "the dataset's own dev split"
    assert m["n_scored"] == {"dev": 12, "test": 12}


def test_no_positive_pair_left_is_an_error_not_a_zero_division(data_world, tmp_path):
    r = train(data_world, data_world["sts10"], tmp_path / "h", "--score-range", "0,100", "--loss", "mnr")
    assert_bad_input(r, "no train pair has a label >= 0.8", "--score-range")


def test_unknown_split_lists_the_splits_found(data_world, tmp_path):
    bad = tmp_path / "pairs.csv"
    bad.write_text("anchor,positive,split\na,b,train\nc,d,holdout\n")
    last = assert_bad_input(train(data_world, bad, tmp_path / "h"), f"{bad}:3:", "'holdout'")
    assert "'holdout', 'train'" in last and "validation" in last
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    shutil.copy(beir / "qrels" / "test.tsv", beir / "qrels" / "extra.tsv")
    assert_bad_input(train(data_world, beir, tmp_path / "h2"), "extra.tsv", "not recognised")


def test_beir_validation_qrels_are_dev(data_world, tmp_path):
    beir = shutil.copytree(data_world["beir"], tmp_path / "beir")
    (beir / "qrels" / "test.tsv").rename(beir / "qrels" / "Validation.tsv")
    r = train(data_world, beir, tmp_path / "h")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "h" / "metrics.json").read_text())
    assert m["dev_made"] == "the dataset's own dev split" and m["n_scored"] == {"dev": 12}


# ---- options ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("option, value, needle", [
    ("--lr", "nan", "--lr must be a finite number > 0"), ("--lr", "inf", "--lr must be a finite number > 0"),
    ("--patience", "-1", "--patience must be >= 1"), ("--warmup-ratio", "1.5", "--warmup-ratio must be in [0, 1]"),
    ("--grad-clip", "-1", "--grad-clip must be a finite number >= 0"), ("--q", "nan", "--q must be a finite number > 0"),
    ("--q-start", "0", "--q-start must be a finite number > 0"), ("--ood-delta", "-1", "ood delta must be"),
])
def test_bad_training_options(data_world, tmp_path, option, value, needle):
    assert_bad_input(train(data_world, data_world["pos"], tmp_path / "h", option, value), needle, value)
    assert not (tmp_path / "h").exists()


def test_unknown_graded_form_and_ensemble_size_are_usage_errors(data_world, tmp_path):
    r = train(data_world, data_world["sts05"], tmp_path / "h", "--graded", "rank")
    assert r.exit_code == 2 and "pearson" in r.output
    r = cli("export", "--grid", tmp_path, "--ensemble", "0", "--format", "safetensors", "--out", tmp_path / "e")
    assert r.exit_code == 2 and ">= 1" in r.output


def test_select_ood_must_be_another_dataset(data_world, tmp_path):
    r = train(data_world, data_world["sts05"], tmp_path / "h", "--select-ood", data_world["sts05"])
    assert_bad_input(r, "must be another dataset")


def test_score_range_must_be_two_ordered_numbers(data_world, tmp_path):
    r = train(data_world, data_world["sts05"], tmp_path / "h", "--score-range", "5,0")
    assert r.exit_code == 2 and "need finite LO < HI" in r.output


@pytest.mark.parametrize("loss, data", [("l1-energy", "pos"), ("l1-ce", "pos"), ("mnr", "pos"), ("contrastive", "pos"),
                                        ("triplet", "pos"), ("cosent", "sts05")])
def test_a_diverging_head_fails_with_the_step_named(data_world, tmp_path, loss, data):
    r = train(data_world, data_world[data], tmp_path / "h", "--loss", loss, "--lr", "1e30", "--epochs", "2")
    last = assert_bad_input(r, "training stopped", "step", "lower --lr")
    assert "became nan" in last or "became inf" in last
    assert not (tmp_path / "h" / "head.safetensors").exists()


# ---- grid files ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, needles", [
    ('[grid]\nlr = ["fast"]\n', ["lr must be a number", "'fast'", "[grid]"]),
    ("[grid]\n[fixed]\nepochs = 1\n", ["[grid] is empty"]),
    ('[grid]\nloss = ["l1-energy", "nope"]\n', ["loss='nope'", "valid"]),
    ('[grid]\nlr = [1e-3]\n[fixed]\nepochs = 1.5\n', ["[fixed] epochs must be an integer"]),
    ('[grid]\nlr = [-1.0]\n', ["lr must be a finite number > 0"]),
])
def test_bad_grid_files_name_the_file(data_world, tmp_path, text, needles):
    grid = tmp_path / "grid.toml"
    grid.write_text(text)
    r = cli("grid", "--store", data_world["store"], "--data", data_world["pos"], "--grid", grid, "--out", tmp_path / "g")
    assert_bad_input(r, grid, *needles)
    assert not (tmp_path / "g").exists()  # refused before any output


# ---- output paths ----------------------------------------------------------------------------------

def test_out_that_is_a_store_a_file_or_a_head_is_refused(data_world, tmp_path):
    w = data_world
    assert_bad_input(train(w, w["pos"], w["store"]), w["store"], "feature store", "never overwritten")
    assert_bad_input(train(w, w["pos"], w["store"] / "sub"), "is inside the feature store")
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    assert_bad_input(train(w, w["pos"], afile), afile, "is a file", "--overwrite")
    assert afile.read_text() == "mine"
    head = shutil.copytree(w["head"], tmp_path / "head")
    assert_bad_input(train(w, w["pos"], head), head, "already holds another trained head", "--overwrite")
    r = cli("eval", "--store", w["store"], "--head", w["head"], "--data", w["pos"], "--out", head)
    assert_bad_input(r, head, "already holds the output of a trained head")
    grid = tmp_path / "grid.toml"
    grid.write_text("[grid]\nlr = [1e-3]\n")
    r = cli("grid", "--store", w["store"], "--data", w["pos"], "--grid", grid, "--out", head)
    assert_bad_input(r, head, "trained head")
    assert_bad_input(train(w, w["beir"], w["beir"]), w["beir"], "is the input")
    assert_bad_input(cli("eval", "--store", w["store"], "--head", head, "--data", w["pos"], "--out", head / "e"),
                     "inside the input")
    before = (head / "head.safetensors").read_bytes()
    r = train(w, w["pos"], head, "--overwrite", "--seed", "3")
    assert r.exit_code == 0, r.output
    assert (head / "head.safetensors").read_bytes() != before


# ---- damaged heads, foreign features --------------------------------------------------------------

def test_truncated_head_and_broken_config_name_the_file(data_world, tmp_path):
    w = data_world
    head = shutil.copytree(w["head"], tmp_path / "head")
    weights = head / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    r = cli("eval", "--store", w["store"], "--head", head, "--data", w["pos"], "--out", tmp_path / "e")
    assert_bad_input(r, weights, "truncated or damaged")
    head2 = shutil.copytree(w["head"], tmp_path / "head2")
    (head2 / "config.json").write_text('{"train": {"loss": "mnr"')
    r = cli("eval", "--store", w["store"], "--head", head2, "--data", w["pos"], "--out", tmp_path / "e2")
    assert_bad_input(r, head2 / "config.json", "not valid JSON")


@pytest.mark.parametrize("part, value", [("tokenizer_hash", "0" * 64), ("precision", "bf16"), ("dtype", "float16"),
                                         ("layer", -2)])
def test_eval_refuses_features_that_differ_in_any_part(data_world, tmp_path, part, value):
    w = data_world
    store = shutil.copytree(w["store"], tmp_path / "store")
    manifest = json.loads((store / "manifest.json").read_text())
    if part == "layer":
        manifest["arrays"]["features"]["layer"] = value
        manifest["layers"] = [value]
    else:
        manifest[part] = value
    manifest["fingerprint"] = fingerprint_of(manifest)
    (store / "manifest.json").write_text(json.dumps(manifest))
    r = cli("eval", "--store", store, "--head", w["head"], "--data", w["pos"], "--out", tmp_path / "e")
    assert_bad_input(r, w["head"], part, "trained on features that differ")


# ---- the error mechanism itself --------------------------------------------------------------------

def test_debug_shows_the_traceback_and_bugs_keep_theirs(data_world, tmp_path, monkeypatch):
    r = cli("--debug", "train-head", "--store", data_world["store"], "--data", data_world["pos"],
            "--out", tmp_path / "h", "--lr", "nan")
    assert isinstance(r.exception, ValueError) and "lr must be" in str(r.exception)

    def bug(*args, **kwargs):
        raise TypeError("an internal bug")

    monkeypatch.setattr("headstore.heads.training.run.train_head", bug)
    r = train(data_world, data_world["pos"], tmp_path / "h2")
    assert r.exit_code == 1 and isinstance(r.exception, TypeError)  # not dressed up as bad input


def test_a_failed_run_with_overwrite_leaves_the_old_output_as_it_was(data_world, tmp_path):
    head = shutil.copytree(data_world["head"], tmp_path / "head")
    before = {p.name: p.read_bytes() for p in head.iterdir()}
    assert_bad_input(train(data_world, data_world["pos"], head, "--overwrite", "--lr", "1e30", "--epochs", "2"), "step")
    assert {p.name: p.read_bytes() for p in head.iterdir()} == before
