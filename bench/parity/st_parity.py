"""Benchmark: how far a `--pooling model` store is from `SentenceTransformer(dir).encode` of the same texts.

    python bench/parity/st_parity.py --json runs/st_parity.json            # tiny architectures + MiniLM on STS-B
    python bench/parity/st_parity.py --no-minilm --json /tmp/parity.json   # tiny architectures only (seconds)

For every tiny random architecture of tests/featurize/arch_models.py (BERT, RoBERTa, XLM-RoBERTa, DistilBERT,
MPNet, ELECTRA, DeBERTa-v2, ModernBERT where transformers has it) saved as a sentence-transformers directory
with cls + Dense + Normalize, lasttoken + Normalize, mean, and max + weightedmean + mean_sqrt_len_tokens
pooling, and for the offline all-MiniLM-L6-v2 on every STS-B text (`--stsb`): the texts are featurized into a
float32 store with `--pooling model` (the default) and compared with SentenceTransformer.encode; also the
largest difference between the MiniLM `--pooling model` rows and the L2-normalised rows of a `--pooling mean`
store (MiniLM's modules are mean pooling then Normalize). Prints a table; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "featurize"))

from arch_models import ARCHES, build_hf, build_st, has_arch  # noqa: E402
from featurize_helpers import random_texts  # noqa: E402

SETUPS = {"cls+dense+normalize": ("cls", 16, True), "lasttoken+normalize": ("lasttoken", None, True),
          "mean": ("mean", None, False), "max+weightedmean+sqrt": (("max", "weightedmean", "mean_sqrt_len_tokens"), None, False)}


def stored_rows(model: str, texts: list[str], store: Path, pooling: str = "model") -> np.ndarray:
    from headstore.data.text_id import text_ids
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.run.local import featurize_texts
    from headstore.featurize.store.reader import FeatureStore

    featurize_texts(FeaturizeConfig(model=model, pooling=pooling, dtype="float32", device="cpu"), texts, store)
    opened = FeatureStore.open(store)
    return opened.features(opened.rows_for(text_ids(texts)))


def tiny_rows(work: Path) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    texts = random_texts(200, seed=11, max_words=40)
    out = []
    for arch in ARCHES:
        if not has_arch(arch):
            out.append({"model": arch, "setup": "-", "note": "not in this transformers"})
            continue
        hf = build_hf(work / arch / "hf", arch)
        for name, (modes, dense, normalize) in SETUPS.items():
            st_dir = build_st(work / arch / name, hf, modes, dense, normalize)
            got = stored_rows(str(st_dir), texts, work / arch / f"store-{name}")
            ref = SentenceTransformer(str(st_dir), device="cpu").encode(texts, batch_size=64, convert_to_numpy=True)
            out.append({"model": arch, "setup": name, "n_texts": len(texts), "max_abs_diff": float(np.abs(got - ref).max())})
    return out


def minilm_rows(work: Path, stsb: Path) -> list[dict]:
    from sentence_transformers import SentenceTransformer

    from headstore.data.dataset import load_dataset
    from headstore.featurize.encoder.model import resolve_model

    texts = load_dataset(stsb).texts()
    t0 = time.perf_counter()
    got = stored_rows("minilm", texts, work / "minilm-model")
    featurize_s = time.perf_counter() - t0
    mean = stored_rows("minilm", texts, work / "minilm-mean", pooling="mean")
    unit = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    t0 = time.perf_counter()
    ref = SentenceTransformer(resolve_model("minilm"), device="cpu").encode(texts, batch_size=64, convert_to_numpy=True)
    encode_s = time.perf_counter() - t0
    return [{"model": "all-MiniLM-L6-v2", "setup": "model (mean + Normalize), STS-B", "n_texts": len(texts),
             "max_abs_diff": float(np.abs(got - ref).max()),
             "max_abs_diff_vs_normalised_mean_store": float(np.abs(got - unit).max()),
             "featurize_seconds": round(featurize_s, 1), "st_encode_seconds": round(encode_s, 1)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--stsb", type=Path, default=ROOT.parent / "shared" / "datasets" / "stsb")
    parser.add_argument("--no-minilm", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = tiny_rows(Path(tmp))
        if not args.no_minilm:
            rows += minilm_rows(Path(tmp), args.stsb)
    print(f"{'model':18} {'setup':34} {'texts':>6} {'max |diff|':>11}")
    for r in rows:
        print(f"{r['model']:18} {r['setup']:34} {r.get('n_texts', 0):>6} {r.get('max_abs_diff', float('nan')):>11.2e}")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"cpu": cpu or platform.processor(), "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
