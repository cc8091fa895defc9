"""The README's quickstart, run as written on a tiny random BERT and the user's own pairs and unlabeled texts.

The test writes `my-pairs.csv` as the README shows it (its sample rows, then tiny pairs of the tiny model's
words) and the unlabeled texts beside it (the README's sample lines, tiny distractors and some of the
positives), reads the bash block from README.md (between the quickstart markers), points `--model minilm` at
the tiny model and runs each `cli` line through click in a fresh folder; then it runs the Python block and
checks the exported model against headstore's own pipeline."""
import json
import random
import re
import shlex
from pathlib import Path

import numpy as np
import polars as pl
from click.testing import CliRunner

from headstore.cli import main

from .finetune_world import sentence, tiny_bert

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart() -> tuple[str, str, list[str], str]:
    """The README's sample pairs file and unlabeled texts, the quickstart's bash lines and its Python block."""
    text = README.read_text()
    section = text[text.index("<!-- quickstart:begin"):text.index("<!-- quickstart:end -->")]
    sample, texts = re.findall(r"```text\n(.*?)```", text[:text.index("<!-- quickstart:begin")], re.S)[:2]
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return sample, texts, [line for line in bash.splitlines() if line.strip()], python


def write_pairs(path: Path, sample: str, n: int = 60) -> list[str]:
    """The README's sample rows (without its "..." line) and n tiny pairs sharing a first word; the positives."""
    rows = [line for line in sample.splitlines() if line.strip() and line.strip() != "..."]
    assert rows[0] == "anchor,positive"
    rng = random.Random(0)
    anchors = [sentence(rng, 4) + f" {i}" for i in range(n)]
    positives = [a.split()[0] + " " + sentence(rng, 6) + f" {i}" for i, a in enumerate(anchors)]
    path.write_text("\n".join(rows) + "\n")
    with path.open("a") as f:
        pl.DataFrame({"anchor": anchors, "positive": positives}).write_csv(f, include_header=False)
    return positives


def write_texts(path: Path, sample: str, positives: list[str], n: int = 80) -> int:
    """The README's sample texts (without "..."), n tiny distractors and every other positive: how many texts."""
    rng = random.Random(1)
    texts = [line for line in sample.splitlines() if line.strip() and line.strip() != "..."]
    texts += [sentence(rng, 7) + f" d{i}" for i in range(n)] + positives[::2]
    path.write_text("\n".join(texts) + "\n")
    return len(set(texts))


def test_readme_quickstart_runs_on_the_users_pairs(tmp_path, monkeypatch):
    model = tiny_bert(tmp_path / "tiny-model", layers=2)
    monkeypatch.chdir(tmp_path)
    sample, texts, lines, python = quickstart()
    pairs_file = re.search(r"--data (\S+)", lines[0]).group(1)
    texts_file = re.search(r"--unlabeled (\S+)", lines[0]).group(1)
    positives = write_pairs(tmp_path / pairs_file, sample)
    n_texts = write_texts(tmp_path / texts_file, texts, positives)
    assert all(line.startswith("cli ") for line in lines)
    outputs = []
    for line in lines:
        line = line.replace("--model minilm", f"--model {model}")
        r = CliRunner().invoke(main, shlex.split(line)[1:])
        assert r.exit_code == 0, f"{line}\n{r.output}"
        outputs.append(r.output)
    head_dir = tmp_path / re.search(r"--out (\S+)", lines[1]).group(1)
    metrics = json.loads((head_dir / "metrics.json").read_text())
    assert metrics["split"] == "dev" and metrics["dev_made"].startswith("dev = ")  # no split column: dev carved
    assert metrics["evaluation"].startswith("retrieval (positive pairs + unlabeled texts)")
    assert metrics["unlabeled"]["texts"] == n_texts  # of which 31 are positives (one document each): every other
    assert metrics["unlabeled"]["also_positives"] == 30 + 1  # tiny positive and the README's "Open Settings > ..."
    assert {"distractors", "impostors", "anchor"} == set(metrics["unlabeled"]["roles"])
    assert "baseline" in outputs[1] and f"unlabeled: {n_texts} texts" in outputs[1]  # beside the head: both said
    assert "rank" in outputs[-1] and "energy" in outputs[-1]  # search printed its table
    namespace: dict = {}
    exec(compile(python, "README.md quickstart", "exec"), namespace)
    model_st, pipe = namespace["model"], namespace["pipe"]
    query, docs = namespace["query"], namespace["docs"]
    np.testing.assert_allclose(model_st.encode(query + docs), pipe.encode(query + docs), atol=2e-3)  # float16 store
    sim = model_st.similarity(model_st.encode(query), model_st.encode(docs)).numpy()
    assert np.argsort(-sim[0]).tolist() == np.argsort(pipe.score(query, docs)[0]).tolist()
