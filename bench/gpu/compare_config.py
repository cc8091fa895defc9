"""The config bench/gpu/compare.sh runs: a shipped `cli compare` TOML with its dataset paths pointed at another
datasets root (the copies carried to the GPU box), and for a rehearsal a few settings overridden.

    python bench/gpu/compare_config.py examples/compare.toml --data .gpu/datasets [--overrides FILE] > run.toml
    python bench/gpu/compare_config.py --tiny-model DIR --like minilm   # the rehearsal's tiny encoder
    python bench/gpu/compare_config.py --families run.toml   # its tuned families: adapted finetuned ...

Every string value that starts with `../shared/datasets/` (the shipped configs' paths, relative to the
repository root) is rewritten to DATA/...; `--overrides` is a TOML file whose [section] keys replace or add
the config's (a key set to the string "unset" is removed). The shipped file itself is never edited.
`--tiny-model DIR` writes a 2-layer BERT with MiniLM's tokenizer and width (so every [head] setting of the
shipped configs fits) and random weights: the CPU rehearsal's encoder, seconds where MiniLM takes hours.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

SHIPPED_ROOT = "../shared/datasets/"


def rewrite_paths(value, data: str):
    """`value` with every SHIPPED_ROOT-prefixed string (also inside lists) under `data` instead."""
    if isinstance(value, str) and value.startswith(SHIPPED_ROOT):
        return str(Path(data) / value[len(SHIPPED_ROOT):])
    if isinstance(value, list):
        return [rewrite_paths(v, data) for v in value]
    return value


def merged(config: dict, overrides: dict) -> dict:
    """config's sections with overrides' keys laid over them (the string "unset" removes a key)."""
    out = {name: dict(section) for name, section in config.items()}
    for name, section in overrides.items():
        if not isinstance(section, dict):
            raise ValueError(f"overrides: {name!r} is not a [section]")
        target = out.setdefault(name, {})
        for key, value in section.items():
            if value == "unset":
                target.pop(key, None)
            else:
                target[key] = value
    return out


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, float):
        assert math.isfinite(value), value
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ValueError(f"cannot write {value!r} ({type(value).__name__}) to TOML")


def to_toml(config: dict) -> str:
    """Sections of scalars and lists (what `cli compare`'s TOML holds) as TOML text."""
    lines = []
    for name, section in config.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in section.items()]
        lines.append("")
    return "\n".join(lines)


def run_config(path: str, data: str, overrides: str | None = None) -> str:
    config = tomllib.loads(Path(path).read_text())
    config = {name: {k: rewrite_paths(v, data) for k, v in section.items()} for name, section in config.items()}
    if overrides:
        config = merged(config, tomllib.loads(Path(overrides).read_text()))
    return f"# {path}, datasets under {data}" + (f", overridden by {overrides}" if overrides else "") + "\n" \
        + to_toml(config)


def tiny_model(folder: Path, like: str) -> Path:
    """A random 2-layer BERT with `like`'s tokenizer, hidden size and heads, in `folder` (kept if there)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoConfig, AutoTokenizer, BertConfig, BertModel

    from headstore.featurize.encoder.model import resolve_model

    source = resolve_model(like)
    base = AutoConfig.from_pretrained(source)
    folder.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=base.vocab_size, hidden_size=base.hidden_size, num_hidden_layers=2,
                     num_attention_heads=base.num_attention_heads, intermediate_size=base.hidden_size,
                     max_position_embeddings=base.max_position_embeddings)
    BertModel(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def families(path: str) -> list[str]:
    """The encoders of a config's rows other than the frozen one (compare_setups.ENCODERS' order): the
    processes bench/gpu/compare.sh runs side by side, one `--setups <family>-cosine,<family>-head` each."""
    from headstore.heads.experiments.compare.config import load_compare_config
    from headstore.heads.experiments.compare.setups import ENCODERS, SETUPS

    used = {SETUPS[s].encoder for s in load_compare_config(path).setups}
    return [e for e in ENCODERS if e in used and e != "base"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="a shipped compare TOML (examples/compare*.toml)")
    p.add_argument("--data", help=f"the datasets root that replaces {SHIPPED_ROOT}")
    p.add_argument("--overrides", help="TOML of [section] keys laid over the config's")
    p.add_argument("--tiny-model", type=Path, help="write the rehearsal's tiny encoder here and exit")
    p.add_argument("--like", default="minilm", help="the model whose tokenizer and width the tiny one takes")
    p.add_argument("--families", metavar="RUN_TOML", help="print the config's tuned families and exit")
    args = p.parse_args(argv)
    if args.families:
        print(" ".join(families(args.families)))
        return 0
    if args.tiny_model:
        print(tiny_model(args.tiny_model, args.like))
        return 0
    if not args.config or not args.data:
        p.error("give CONFIG and --data (or --tiny-model DIR)")
    sys.stdout.write(run_config(args.config, args.data, args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
