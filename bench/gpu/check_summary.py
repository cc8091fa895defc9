"""The short summary that ends bench/gpu/check.sh: stages, tests, the main job on the card, the benchmark.

    python bench/gpu/check_summary.py OUT_FOLDER

Reads what the check wrote (stages.tsv, *.log, featurize-summary.json, compare.json, bench-gpu-*.json) and
prints a few lines and small tables: the check's output is read from its end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def last_line(path: Path, containing: str = "") -> str:
    if not path.is_file():
        return "(no log)"
    lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip() and containing in x]
    return lines[-1][-240:] if lines else "(empty)"


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def stages(out: Path) -> None:
    print("| stage | exit | seconds |\n|---|---|---|")
    for line in (out / "stages.tsv").read_text().splitlines() if (out / "stages.tsv").is_file() else []:
        name, rc, seconds, *note = line.split("\t") + [""]
        print(f"| {name} | {rc} {note[0]} | {seconds} |")


def main_job(out: Path) -> None:
    print(f"\ncard: {last_line(out / 'env.log', ',')}")
    print(f"tests: {last_line(out / 'tests.log', ' in ')}")
    smoke = read_json(out / "gpu-smoke.json")
    for r in (smoke or {}).get("rows", []):
        print(f"gpu smoke: {r.get('precision')} packing={r.get('packing')} {r.get('attention_kernel')}: "
              f"{r.get('real_tokens_per_s', 0):,.0f} tok/s, padded/real {r.get('padded_per_real')}, tokenizer "
              f"{r.get('tokenize_tokens_per_s', 0):,.0f} / encoder {r.get('encoder_tokens_per_s', 0):,.0f} tok/s, "
              f"max diff vs first {r.get('max_abs_diff_vs_first', float('nan')):.1e}")
    if smoke is None:
        print(f"gpu smoke: {last_line(out / 'gpu-smoke.log')}")
    summary = read_json(out / "featurize-summary.json")
    if summary:
        keys = ("n_encoded", "encode_seconds", "tokens_per_s", "tokenize_tokens_per_s", "encoder_tokens_per_s",
                "numerics", "packing",
                "attention_kernel", "precision", "seconds")
        print("featurize (main job, --device cuda): " + ", ".join(f"{k} {summary[k]}" for k in keys if k in summary))
    else:
        print(f"featurize: no summary; {last_line(out / 'featurize.log')}")
    compare = read_json(out / "compare.json")
    print(f"compare with the CPU reference: {last_line(out / 'verify-compare.log', 'compare:')}"
          if compare else f"compare: {last_line(out / 'verify-compare.log')}")
    print(f"e2e: {last_line(out / 'e2e.log')}")


def bench(path: Path) -> None:
    result = read_json(path)
    if not result:
        print(f"\n{path.name}: none written")
        return
    print(f"\n{path.name}: {result['device_name']}; {result['ceiling_precision']} matmul ceiling "
          f"{result['ceiling_gflop_per_s'] / 1e3:,.1f} TFLOP/s; {result['seconds']} s")
    print("| shape | texts | system | setting | tok/s | padded/real | share | peak MB | tokenizer/encoder | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        if r["status"] != "ok":
            continue
        encoder = r.get("encoder_tokens_per_s") or r.get("encode_tokens_per_s")
        tok = f"{r['tokenize_tokens_per_s']:,.0f}/{encoder:,.0f}" if r.get("tokenize_tokens_per_s") and encoder else "-"
        diff = "-" if r.get("max_abs_diff_vs_fp32") is None else f"{r['max_abs_diff_vs_fp32']:.1e}"
        print(f"| {r['shape']} | {r['text_set']} | {'hs' if r['system'] == 'headstore' else 'ST'} | {r['label']} | "
              f"{r['real_tokens_per_s']:,.0f} | {r['padded_per_real']} | {100 * r['share_of_ceiling']:.1f}% | "
              f"{r['peak_memory_mb']:,.0f} | {tok} | {diff} |")
    others: dict[str, list[str]] = {}
    for r in result["rows"]:
        if r["status"] != "ok":
            others.setdefault(f"{r['status']}: {r.get('reason')}", []).append(f"{r['shape']}/{r['text_set']}/{r['label']}")
    for reason, labels in others.items():
        print(f"- {len(labels)} {reason[:160]} (e.g. {labels[0]})")
    for s in result["speedups"]:
        print(f"- {s['shape']} {s['text_set']} {s['scope']}: headstore {s['headstore']} {s['headstore_tokens_per_s']:,.0f} "
              f"tok/s ({100 * s['headstore_share_of_ceiling']:.1f}% of ceiling) vs ST {s['st']} "
              f"{s['st_tokens_per_s']:,.0f} tok/s = {s['ratio']:.2f}x")
    for g in result.get("goals", []):
        print(f"- {'MET' if g['met'] else 'NOT MET'}: {g['goal']}: {g['value']:.3g}")


def main(out: Path) -> None:
    print(f"\n# GPU check summary ({out})")
    stages(out)
    main_job(out)
    for path in sorted(out.glob("bench-gpu-*.json")):
        bench(path)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
