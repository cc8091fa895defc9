"""Per-token hidden states of a few MiniLM layers for every text of a store, cached once for the token-head study
(issue 57 item 3; bench/studies/tokens_study.py reads them). The texts are the store's, tokenised and encoded as
`cli featurize` does (the store's model, max length and precision; padded batches, bf16 autocast), and the
block outputs of --layers (1 = the bottom block, as hidden_states counts) plus the attention output of --attn
layers (featurize.encoder.taps' `attn` tap) are kept per token, float16, ragged: one (total tokens, d) array per
layer and the texts' offsets. The whole text is kept (special tokens too: MiniLM's mean pooling reads them).

    python3 bench/studies/tokens_cache.py --store STORE --out /work/scratch/tokens/cache --layers 4,5,6 --attn 6

Check: each text's mean over its layer-L tokens equals the store's `tap_block_L` (printed: the largest gap).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headstore.featurize.encoder.encode import tokenize  # noqa: E402
from headstore.featurize.encoder.model import load_encoder  # noqa: E402
from headstore.featurize.encoder.pooling import compute_context  # noqa: E402
from headstore.featurize.encoder.taps import recording  # noqa: E402
from headstore.featurize.store.reader import FeatureStore  # noqa: E402

BATCH = 128


def batch_states(model, ids: list[np.ndarray], pad_id: int, layers: list[int], attn: list[int],
                 precision: str) -> list[list[np.ndarray]]:
    """One padded forward pass: per array (the layers' block outputs, then the attn taps) each text's (n, d) float16
    tokens, padding cut off."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, :len(x)], mask[i, :len(x)] = torch.from_numpy(x.astype(np.int64)), 1
    with torch.inference_mode(), compute_context("cpu", precision), \
            recording(model, [("attn", i) for i in attn]) as tapped:
        out = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, return_dict=True)
        states = [out.hidden_states[i] for i in layers] + [tapped[("attn", i)] for i in attn]
    return [[s[i, :len(x)].float().numpy().astype(np.float16) for i, x in enumerate(ids)] for s in states]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", default="4,5,6")
    p.add_argument("--attn", default="6")
    a = p.parse_args()
    store, out = FeatureStore.open(a.store), Path(a.out)
    config = json.loads((Path(a.store) / "config.json").read_text())
    layers, attn = [int(x) for x in a.layers.split(",") if x], [int(x) for x in a.attn.split(",") if x]
    names = [f"block_{i}" for i in layers] + [f"attn_{i}" for i in attn]
    encoder = load_encoder(config["model"], "cpu", config["max_length"])
    texts = store.texts.sort("row")["text"].to_list()
    tok = tokenize(encoder.tokenizer, texts, config["max_length"])
    order = np.argsort([len(x) for x in tok.ids], kind="stable")
    kept: list[list[np.ndarray | None]] = [[None] * len(texts) for _ in names]
    t0 = time.perf_counter()
    for start in range(0, len(order), BATCH):
        rows = order[start:start + BATCH]
        got = batch_states(encoder.model, [tok.ids[r] for r in rows], encoder.tokenizer.pad_token_id, layers, attn,
                           config["precision"])
        for k, per_text in enumerate(got):
            for r, x in zip(rows, per_text):
                kept[k][r] = x
    seconds = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(x) for x in tok.ids], dtype=np.int64)
    np.save(out / "offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
    for name, per_text in zip(names, kept):
        np.save(out / f"{name}.npy", np.concatenate(per_text))
    check = {}
    for i in layers:
        means = np.stack([x.astype(np.float32).mean(0) for x in kept[names.index(f"block_{i}")]])
        ref = store.features(np.arange(len(texts)), f"tap_block_{i}").astype(np.float32)
        check[f"block_{i}"] = float(np.abs(means - ref).max())
    info = {"store": str(Path(a.store).resolve()), "arrays": names, "n_texts": len(texts),
            "tokens": int(lengths.sum()), "encode_seconds": round(seconds, 1),
            "bytes_per_text": round(float(lengths.mean()) * 2 * sum(x[0].shape[1] for x in kept), 1),
            "max_gap_to_store_taps": check}
    (out / "info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
