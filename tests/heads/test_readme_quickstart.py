"""The README's quick start, run as written on a tiny random BERT and a tiny BEIR folder named scifact.

Its bash block is read from README.md (between the quickstart markers), `minilm` and `$D` are pointed
at the tiny model and datasets, and each `cli` line runs through click; then its Python block runs."""
import re
import shlex
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from headstore.cli import main

from .finetune_world import tiny_beir, tiny_bert

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart_blocks() -> tuple[list[str], str]:
    text = README.read_text()
    section = text[text.index("<!-- quickstart:begin"):text.index("<!-- quickstart:end -->")]
    bash = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return [line for line in bash.splitlines() if line.strip()], python


def test_readme_quickstart_runs_on_a_tiny_model(tmp_path, monkeypatch, capsys):
    model = tiny_bert(tmp_path / "tiny-model", layers=2)
    data = tmp_path / "datasets"
    tiny_beir(data / "scifact", n_docs=40, n_train=20, n_test=8)
    monkeypatch.chdir(tmp_path)
    lines, python = quickstart_blocks()
    assert lines[0].startswith("D=") and all(line.startswith("cli ") for line in lines[1:])
    outputs = []
    for line in lines[1:]:
        line = line.replace("$D", str(data)).replace("--model minilm", f"--model {model}")
        r = CliRunner().invoke(main, shlex.split(line)[1:])
        assert r.exit_code == 0, f"{line}\n{r.output}"
        outputs.append(r.output)
    assert "rank" in outputs[-1] and "energy" in outputs[-1]  # search printed its table
    python = python.replace('"runs/', f'"{tmp_path}/runs/')
    namespace: dict = {}
    exec(compile(python, "README.md quickstart", "exec"), namespace)
    model_st, pipe = namespace["model"], namespace["pipe"]
    query, docs = namespace["query"], namespace["docs"]
    np.testing.assert_allclose(model_st.encode(query + docs), pipe.encode(query + docs), atol=2e-3)  # float16 store
    sim = model_st.similarity(model_st.encode(query), model_st.encode(docs)).numpy()
    assert np.argsort(-sim[0]).tolist() == np.argsort(pipe.score(query, docs)[0]).tolist()
