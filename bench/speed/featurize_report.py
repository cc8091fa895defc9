"""bench/speed/featurize.py's rows, ratios and tables: each worker result as one row of real figures."""

from __future__ import annotations

import numpy as np

from featurize_data import max_abs_diff, st_padded_tokens


def setting_label(s: dict) -> str:
    """A setting as one short string: precision, then what else it sets (batch, packing, backend, attention)."""
    parts = [s["precision"]]
    parts += [f"{k}={s[k]}" for k in ("backend", "packing", "attn") if s.get(k) not in (None, "torch")]
    if s.get("batch"):
        parts.append(f"{'bs' if s['system'] == 'sentence-transformers' else 'bt'}={s['batch']}")
    return " ".join(parts)


def make_row(result: dict, shape: str, cell: dict, ref: np.ndarray, feats: np.ndarray | None,
             ceiling_gflops: float) -> dict:
    """One row of the JSON: result (a worker's, incl. status and the best run) with its figures. cell: the
    text set as measured (texts, n_tokens, flops)."""
    row = {"shape": shape, "label": setting_label(result), **{k: v for k, v in result.items() if k != "index"}}
    if result["status"] != "ok":
        return row
    real, seconds = cell["real_tokens"], result["seconds"]
    if result["system"] == "headstore":
        padded = result.get("padded_tokens", real)
    else:
        padded = st_padded_tokens(cell["texts"], cell["n_tokens"], result["batch"])
    row.update(n_texts=len(cell["texts"]), real_tokens=real,
               texts_per_s=round(len(cell["texts"]) / seconds, 1),
               real_tokens_per_s=round(real / seconds, 0), padded_per_real=round(padded / real, 3),
               gflop_per_s=round(cell["flops"] / seconds / 1e9, 1),
               share_of_ceiling=round(cell["flops"] / seconds / 1e9 / ceiling_gflops, 4),
               peak_memory_mb=round(result["peak_memory_bytes"] / 2**20, 1),
               max_abs_diff_vs_fp32=max_abs_diff(feats, ref))
    encoder = result.get("encoder_tokens_per_s") or result.get("encode_tokens_per_s")  # the encoder alone if known
    if result.get("tokenize_tokens_per_s") and encoder:
        row["tokenizer_over_encoder"] = round(result["tokenize_tokens_per_s"] / encoder, 2)
    return row


def speedups(rows: list[dict]) -> list[dict]:
    """Per (shape, text set): headstore's best against sentence-transformers' best, over every setting and
    among the exact (fp32) ones."""
    out = []
    for shape, text_set in dict.fromkeys((r["shape"], r["text_set"]) for r in rows):
        cell = [r for r in rows if r["shape"] == shape and r["text_set"] == text_set and r["status"] == "ok"]
        for scope, keep in (("all", lambda r: True), ("fp32", lambda r: r["precision"] == "fp32")):
            hs = [r for r in cell if r["system"] == "headstore" and keep(r)]
            st = [r for r in cell if r["system"] == "sentence-transformers" and keep(r)]
            if not hs or not st:
                continue
            best_hs = max(hs, key=lambda r: r["real_tokens_per_s"])
            best_st = max(st, key=lambda r: r["real_tokens_per_s"])
            out.append({"shape": shape, "text_set": text_set, "scope": scope,
                        "headstore": best_hs["label"], "headstore_tokens_per_s": best_hs["real_tokens_per_s"],
                        "headstore_share_of_ceiling": best_hs["share_of_ceiling"],
                        "st": best_st["label"], "st_tokens_per_s": best_st["real_tokens_per_s"],
                        "ratio": round(best_hs["real_tokens_per_s"] / best_st["real_tokens_per_s"], 3)})
    return out


def _num(x, fmt: str = ",.0f") -> str:
    return "-" if x is None else format(x, fmt)


def print_table(rows: list[dict]) -> None:
    """Every row: the figures of ok rows, the reason of the others."""
    print("\n| shape | texts | system | setting | real tok/s | padded/real | share of ceiling | peak MB | "
          "tokenizer / encoder tok/s | max abs diff vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    not_run: dict[tuple, list[str]] = {}  # settings not run, one line per (cell, system, reason)
    for r in rows:
        if r["status"] != "ok":
            key = (r["shape"], r["text_set"], r["system"], f"{r['status']}: {r.get('reason') or ''}")
            not_run.setdefault(key, []).append(r["label"])
    for r in rows:
        head = f"| {r['shape']} | {r['text_set']} | {'hs' if r['system'] == 'headstore' else 'ST'} | {r['label']} |"
        if r["status"] != "ok":
            key = (r["shape"], r["text_set"], r["system"], f"{r['status']}: {r.get('reason') or ''}")
            if key in not_run:
                labels = not_run.pop(key)
                print(f"| {key[0]} | {key[1]} | {'hs' if key[2] == 'headstore' else 'ST'} | {'; '.join(labels)} | "
                      f"{key[3][:160]} | | | | | |")
            continue
        tok = (f"{_num(r.get('tokenize_tokens_per_s'))} / {_num(r.get('encoder_tokens_per_s') or r.get('encode_tokens_per_s'))}"
               if r.get("tokenize_tokens_per_s") else "-")
        extra = " ".join(f"{k}={r[k]}" for k in ("numerics", "attention_kernel") if r.get(k))
        print(f"{head} {_num(r['real_tokens_per_s'])} | {r['padded_per_real']} | "
              f"{100 * r['share_of_ceiling']:.1f}% | {_num(r['peak_memory_mb'])} | {tok} | "
              f"{_num(r['max_abs_diff_vs_fp32'], '.1e')}{' (' + extra + ')' if extra else ''} |")


def print_speedups(ratios: list[dict]) -> None:
    print("\n| shape | texts | scope | headstore best | tok/s | share | ST best | tok/s | headstore / ST |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in ratios:
        print(f"| {s['shape']} | {s['text_set']} | {s['scope']} | {s['headstore']} | {_num(s['headstore_tokens_per_s'])} | "
              f"{100 * s['headstore_share_of_ceiling']:.1f}% | {s['st']} | {_num(s['st_tokens_per_s'])} | "
              f"{s['ratio']:.2f}x |")


def _ratio(ratios: list[dict], shape: str, scope: str) -> dict | None:
    return next((s for s in ratios if s["shape"] == shape and s["text_set"] == "main" and s["scope"] == scope), None)


def goals(rows: list[dict], ratios: list[dict], device: str) -> list[dict]:
    """Issue 30's goals as measured in this run: (goal, value, met); a goal whose rows did not run is left out."""
    out = []

    def add(goal: str, value, met: bool) -> None:
        out.append({"goal": goal, "value": value, "met": bool(met)})

    hs = [r for r in rows if r["system"] == "headstore" and r["status"] == "ok"]
    if device == "cuda":
        if (s := _ratio(ratios, "bert-base", "all")) is not None:
            add("BERT-base, main texts: headstore >= 45% of the bf16 matmul ceiling", s["headstore_share_of_ceiling"],
                s["headstore_share_of_ceiling"] >= 0.45)
            add("BERT-base, main texts: >= 1.5x sentence-transformers' best", s["ratio"], s["ratio"] >= 1.5)
        if (s := _ratio(ratios, "minilm", "all")) is not None:
            add("MiniLM, main texts: >= 1.5x sentence-transformers' best", s["ratio"], s["ratio"] >= 1.5)
            best = max((r for r in hs if r["shape"] == "minilm" and r["text_set"] == "main"),
                       key=lambda r: r["real_tokens_per_s"])
            if best.get("tokenizer_over_encoder") is not None:
                add("MiniLM, main texts: tokenizer >= 2x the encoder (best headstore run)",
                    best["tokenizer_over_encoder"], best["tokenizer_over_encoder"] >= 2)
        for precision, bound in (("bf16", 1e-2), ("fp32", 1e-6)):
            diffs = [r["max_abs_diff_vs_fp32"] for r in hs if r["precision"] == precision
                     and r.get("max_abs_diff_vs_fp32") is not None]
            if diffs:
                add(f"headstore {precision} features within {bound:g} of the fp32 reference (max over runs)",
                    max(diffs), max(diffs) <= bound)
    else:
        for scope in ("fp32", "all"):
            if (s := _ratio(ratios, "minilm", scope)) is not None:
                add(f"CPU, MiniLM, main texts ({scope} settings): >= 1.2x the best sentence-transformers backend",
                    s["ratio"], s["ratio"] >= 1.2)
    return out


def print_goals(measured: list[dict]) -> None:
    for g in measured:
        print(f"- {'MET' if g['met'] else 'NOT MET'}: {g['goal']}: {g['value']:.3g}")
