"""Bad input of issue 22 through the CLI (docs/bad-input.md): a texts part overwritten in place, a NUL
inside a `.txt` line, an empty path option, a NaN class label. Each: exit 2, one `Error:` line naming
the file, row or option at fault, no traceback."""
import math
import shutil

import click
import polars as pl
import pytest

from headstore.cli import main
from headstore.data.labels import read_labels_counted
from headstore.data.options import NonEmptyPath

from .conftest import FAST, assert_bad_input, cli


def train(w, data, out, *extra, store=None):
    return cli("train-head", "--store", store or w["store"], "--data", data, "--out", out, *FAST, *extra)


# ---- a committed texts part overwritten with other bytes of the same size -------------------------

def test_train_head_names_a_texts_part_overwritten_in_place(data_world, tmp_path):
    store = shutil.copytree(data_world["store"], tmp_path / "store")
    part = sorted((store / "texts").glob("part-*.parquet"))[0]
    data = bytearray(part.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 64] = bytes(b ^ 0x5A for b in data[middle: middle + 64])
    part.write_bytes(bytes(data))  # same size: only the sha256 tells
    last = assert_bad_input(train(data_world, data_world["pos"], tmp_path / "h", store=store),
                            f"Error: {part}: sha256 differs from the one committed")
    assert f"cli store verify {store}" in last and "featurize the texts again" in last
    assert not (tmp_path / "h" / "head.safetensors").exists()


# ---- a NUL character inside a line of a plain-text corpus -----------------------------------------

@pytest.mark.parametrize("suffix", [".txt", ".parquet"])
def test_featurize_refuses_a_nul_in_a_text_corpus_naming_line_or_row(data_world, tmp_path, suffix):
    corpus = tmp_path / f"corpus{suffix}"
    lines = ["a first passage", "", "a sec\x00ond passage", "a third"]
    if suffix == ".txt":
        corpus.write_text("\n".join(lines) + "\n")
        where = f"{corpus}:3: contains a NUL character"
    else:
        pl.DataFrame({"text": lines}).write_parquet(corpus)
        where = f"{corpus}: row 2: text contains a NUL character"
    result = cli("featurize", "--model", data_world["model"], "--data", corpus, "--format", "text",
                 "--store", tmp_path / "s", "--device", "cpu")
    assert_bad_input(result, where, "remove it")
    assert not (tmp_path / "s").exists()


# ---- an empty path ---------------------------------------------------------------------------------

PATH_OPTIONS = {"--data", "--store", "--out", "--head", "--grid", "--index", "--model", "--queries",
                "--config", "--transfer", "--ood", "--in-domain", "--base-store", "--exclude-overlap",
                "--select-ood", "--task-a", "--task-b"}


def path_params(group=main, prefix=()):
    """(command words, parameter) for every path option and argument of every command."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from path_params(command, (*prefix, name))
            continue
        for param in command.params:
            if isinstance(param.type, NonEmptyPath):
                yield (*prefix, name), param
            else:  # a path option that forgot its type would take '' as the current folder
                assert not set(param.opts) & PATH_OPTIONS, (name, param.opts)


def test_every_path_option_is_typed_and_all_names_are_seen():
    seen = {opt for _, param in path_params() for opt in param.opts}
    assert PATH_OPTIONS <= seen, PATH_OPTIONS - seen
    assert any(words[0] == "store" for words, _ in path_params())  # the store commands' PATH


@pytest.mark.parametrize("words, param", [pytest.param(w, p, id=" ".join(w) + " " + p.human_readable_name)
                                          for w, p in path_params()])
def test_an_empty_path_is_refused_naming_the_option(words, param):
    args = [*words, param.opts[0], ""] if isinstance(param, click.Option) else [*words, ""]
    name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
    assert_bad_input(cli(*args), f"'{name}'", "the path is empty")


def test_empty_data_and_store_are_refused_before_anything_is_read(data_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the folder '' would have meant
    (tmp_path / "a.txt").write_text("a passage\n")
    r = cli("featurize", "--model", data_world["model"], "--data", "", "--store", tmp_path / "s")
    assert_bad_input(r, "'--data'", "the path is empty")
    r = cli("featurize", "--model", data_world["model"], "--data", tmp_path / "a.txt", "--store", "")
    assert_bad_input(r, "'--store'", "the path is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# ---- a NaN in a numeric class-label column ---------------------------------------------------------

@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_a_nan_class_label_names_its_row(data_world, tmp_path, suffix):
    texts = pl.read_parquet(data_world["sts05"])["sentence1"].to_list()[:40]
    labels = [float(i % 3) for i in range(40)]
    labels[7] = math.nan if suffix == ".parquet" else None  # CSV: an empty cell in a float column
    frame = pl.DataFrame({"text": texts, "label": labels,
                          "split": ["train"] * 24 + ["dev"] * 8 + ["test"] * 8})
    data = tmp_path / f"labels{suffix}"
    frame.write_parquet(data) if suffix == ".parquet" else frame.write_csv(data)
    where, problem = ((f"{data}: row 7:", "label 'label' is missing (null or NaN)") if suffix == ".parquet"
                      else (f"{data}:9:", "label 'label' is missing"))  # CSV: read as text, the cell empty
    assert_bad_input(train(data_world, data, tmp_path / "h", "--format", "labels"), where, problem)
    labels[7] = 1.5
    pl.DataFrame({**frame.to_dict(), "label": labels}).write_parquet(tmp_path / "half.parquet")
    assert_bad_input(train(data_world, tmp_path / "half.parquet", tmp_path / "h", "--format", "labels"),
                     f"{tmp_path / 'half.parquet'}: row 7:", "is 1.5: not a class")
    labels[7] = 2.0  # whole numbers in a float column are class ids, as integers are
    pl.DataFrame({**frame.to_dict(), "label": labels}).write_parquet(tmp_path / "whole.parquet")
    read, _ = read_labels_counted(tmp_path / "whole.parquet")
    assert sorted(read["label"].unique().to_list()) == ["0", "1", "2"]
