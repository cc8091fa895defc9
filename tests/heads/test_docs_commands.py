"""The guides' command blocks, run as written on a tiny random BERT and tiny BEIR folders.

Each block is read from its page under docs/ (the first ```bash block under the named heading), `$D` and
`--model minilm` are pointed at the tiny datasets and model, and each `cli` line runs through click in a
fresh folder; a ```python block under the same heading runs after it. The README's own quickstart is
tests/heads/test_readme_quickstart.py; the main job's commands are run by examples/end_to_end.sh."""
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from headstore.cli import main

from .finetune_world import tiny_beir, tiny_bert

DOCS = Path(__file__).resolve().parents[2] / "docs"


def blocks_under(page: str, heading: str) -> tuple[list[str], str | None]:
    """The cli lines of the first bash block under `heading` of docs/<page> (continuations joined), and the
    python block that follows it in the same section, if any."""
    text = (DOCS / page).read_text()
    section = text[text.index(heading):]
    section = section[:section.find("\n## ", 1)] if "\n## " in section[1:] else section
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    python = re.search(r"```python\n(.*?)```", section, re.S)
    return [line for line in bash.splitlines() if line.strip()], python.group(1) if python else None


def run_lines(lines: list[str], data: Path, model: Path) -> list[str]:
    assert lines[0] == "D=../shared/datasets" and all(line.startswith("cli ") for line in lines[1:])
    outputs = []
    for line in lines[1:]:
        line = line.replace("$D", str(data)).replace("--model minilm", f"--model {model}")
        r = CliRunner().invoke(main, shlex.split(line, comments=True)[1:])
        assert r.exit_code == 0, f"{line}\n{r.output}"
        outputs.append(r.output)
    return outputs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs-world")
    model = tiny_bert(root / "tiny-model", layers=2)
    tiny_beir(root / "datasets" / "scifact", n_docs=40, n_train=20, n_test=8)
    tiny_beir(root / "datasets" / "cranfield", seed=1, n_docs=30, n_train=0, n_test=8)
    return root, model


def test_own_data_retrieval_benchmark_block(world, tmp_path, monkeypatch):
    root, model = world
    monkeypatch.chdir(tmp_path)
    lines, _ = blocks_under("guide/own-data.md", "## A retrieval benchmark")
    outputs = run_lines(lines, root / "datasets", model)
    assert "baseline" in outputs[-1]  # eval printed the frozen baseline beside the head
    assert (tmp_path / "runs" / "scifact-on-cranfield" / "metrics.json").is_file()


def test_export_and_search_block(world, tmp_path, monkeypatch):
    root, model = world
    monkeypatch.chdir(tmp_path)
    lines, python = blocks_under("guide/export-search.md", "## From a benchmark to a search")
    outputs = run_lines(lines, root / "datasets", model)
    assert "rank" in outputs[-1] and "score" in outputs[-1]  # search printed its table (fused with BM25, which the
    # head kept on its dev: docs/memory.md#lexical-fusion)
    namespace: dict = {}
    exec(compile(python, "docs/guide/export-search.md", "exec"), namespace)
    model_st, pipe = namespace["model"], namespace["pipe"]
    query, docs = namespace["query"], namespace["docs"]
    np.testing.assert_allclose(model_st.encode(query + docs), pipe.encode(query + docs), atol=2e-3)  # float16 store


def test_tuning_block(world, tmp_path, monkeypatch):
    root, model = world
    monkeypatch.chdir(tmp_path)
    lines, _ = blocks_under("guide/tuning.md", "# Tuning the encoder")
    lines = [line for line in lines if not line.startswith("#")]  # the block's comment line
    # a store names a local encoder by its folder name only: finetune is given the tiny model's folder
    lines = [f"{line} --model {model}" if line.startswith("cli finetune") else line for line in lines]
    outputs = run_lines(lines, root / "datasets", model)
    assert "baseline" in outputs[-1]  # eval of the adapters encoder's store printed the frozen baseline beside it
    assert (tmp_path / "tuned" / "adapters" / "encoder" / "headstore_adapters.safetensors").is_file()
    assert (tmp_path / "tuned" / "lora" / "encoder" / "config.json").is_file()  # merged: a stock model folder
