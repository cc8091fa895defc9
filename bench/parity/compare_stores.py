"""Compare the features of two stores (or reference files) text by text: max |diff| of unit rows.

    python bench/parity/compare_stores.py STORE_A STORE_B [--bound 1e-2] [--json out.json]
    python bench/parity/compare_stores.py --make-ref .gpu/ref-cpu-minilm.parquet [--sample 2000] [--device cpu]

Each side is a feature store (a `cli featurize` folder) or a reference file: Parquet with `text_id` and
`features` (fp32, one list per text). Rows are joined by text_id; each row is scaled to unit length (a
store may hold float16 or unnormalised features), and the line printed gives the texts compared, the max
and the 99.9th percentile of |a - b| over every component, and the lowest cosine. Exit status 1 when no
text is shared or the max passes --bound.

--make-ref writes such a file from the main job's texts (bench/speed/featurize_data.py: every text of
examples/end_to_end.sh's datasets) cut to --sample texts spread over the length order, featurized here in
fp32 by headstore (`cli featurize`'s code path, --precision fp32, float32 store): a small file that travels
to a GPU box, where the store `cli featurize --device cuda` made of the same datasets is compared with it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # featurize_data


def read_side(path: Path) -> tuple[list[str], np.ndarray]:
    """(text ids, (N, D) float32 features) of a store folder or a Parquet reference file."""
    if path.is_dir():
        from headstore.featurize.store.reader import FeatureStore

        store = FeatureStore.open(path)
        texts = store.texts.sort("row")
        return texts["text_id"].to_list(), np.asarray(store.features(texts["row"].to_numpy()), dtype=np.float32)
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ValueError(f"{path}: neither a feature store folder nor a reference .parquet file")
    table = pq.read_table(path, columns=["text_id", "features"])
    feats = np.stack(table.column("features").to_numpy(zero_copy_only=False)).astype(np.float32)
    return table.column("text_id").to_pylist(), feats


def compare(a: Path, b: Path) -> dict:
    ids_a, fa = read_side(a)
    ids_b, fb = read_side(b)
    where_b = {t: i for i, t in enumerate(ids_b)}
    pairs = [(i, where_b[t]) for i, t in enumerate(ids_a) if t in where_b]
    out = {"a": str(a), "b": str(b), "n_a": len(ids_a), "n_b": len(ids_b), "n_compared": len(pairs)}
    if not pairs:
        return out
    if fa.shape[1] != fb.shape[1]:
        raise ValueError(f"feature dims differ: {a} has {fa.shape[1]}, {b} has {fb.shape[1]}")
    ia, ib = (np.asarray(x) for x in zip(*pairs))
    ua, ub = (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
              for x in (fa[ia].astype(np.float64), fb[ib].astype(np.float64)))
    diff = np.abs(ua - ub)
    out.update(max_abs_diff=float(diff.max()), p999_abs_diff=float(np.quantile(diff, 0.999)),
               min_cosine=float((ua * ub).sum(1).min()))
    return out


def make_ref(out: Path, sample: int, data: Path, model: str, device: str) -> dict:
    """Featurize `sample` main-job texts (spread over the length order) in fp32 and write text_id, features."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import featurize_data as fd
    from headstore.featurize.encoder.config import FeaturizeConfig
    from headstore.featurize.encoder.model import model_identity, resolve_model
    from headstore.featurize.run.local import featurize_texts

    texts = fd.read_text_set("main", data)
    n_tokens, _ = fd.tokenizer_counts(resolve_model(model), texts, model_identity(model).max_length)
    texts = [texts[i] for i in fd.spread(n_tokens, sample)]
    folder = Path(tempfile.mkdtemp(prefix="bench-ref-"))
    try:
        config = FeaturizeConfig(model=model, dtype="float32", precision="fp32", device=device)
        summary = featurize_texts(config, texts, folder / "s")
        ids, feats = read_side(folder / "s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    dim = feats.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1), pa.float32()), dim)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text_id": ids, "features": column}), out)
    return {"ref": str(out), "n_texts": len(ids), "dim": dim, "real_tokens": summary["real_tokens"],
            "fingerprint": summary["fingerprint"], "device": device}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stores", nargs="*", type=Path, help="STORE_A STORE_B (store folders or .parquet references)")
    ap.add_argument("--bound", type=float, default=None, help="exit 1 when max |diff| passes this")
    ap.add_argument("--json", default=None)
    ap.add_argument("--make-ref", type=Path, default=None, help="write a reference .parquet instead")
    ap.add_argument("--sample", type=int, default=2000)
    ap.add_argument("--data", type=Path, default=Path(__import__("os").environ.get(
        "HEADSTORE_DATA", str(Path(__file__).resolve().parents[2].parent / "shared" / "datasets"))))
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.make_ref:
        result = make_ref(args.make_ref, args.sample, args.data, args.model, args.device)
        print(f"reference: {result['n_texts']} texts x {result['dim']} ({result['real_tokens']} real tokens) "
              f"-> {result['ref']}")
        ok = True
    else:
        if len(args.stores) != 2:
            ap.error("give two stores (or reference files) to compare, or --make-ref OUT")
        result = compare(*args.stores)
        ok = result["n_compared"] > 0 and (args.bound is None or result["max_abs_diff"] <= args.bound)
        result["bound"], result["ok"] = args.bound, ok
        if result["n_compared"]:
            print(f"compare: {result['n_compared']} texts shared ({result['n_a']} in A, {result['n_b']} in B): "
                  f"max |diff| {result['max_abs_diff']:.2e}, p99.9 {result['p999_abs_diff']:.2e}, min cosine "
                  f"{result['min_cosine']:.6f}" + (f"; bound {args.bound:g}: {'ok' if ok else 'OVER'}"
                                                   if args.bound is not None else ""))
        else:
            print(f"compare: no text shared ({result['n_a']} in A, {result['n_b']} in B)")
    print(json.dumps(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
