#!/usr/bin/env bash
# The study of docs/robust.md (issue 20): the levers on SciFact (Cranfield, CACM out of domain), STS-B (SemEval
# without STS-B overlap) and TREC-QA pairs, 3 seeds each, against the frozen cosine baseline and the round-2
# default. Reads an existing store holding those datasets (never writes to it); outputs under $RUNS.
# Then bench/studies/robust_study.py scores every head's strength curve and writes the tables and the picture.
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=${HEADSTORE_DATA:-../shared/datasets}
S=${STORE:-runs/store-minilm}
R=${RUNS:-runs/robust}
mkdir -p "$R"
grid() { nice -n 5 cli grid --store "$S" "$@"; }
SF=(--data "$D/scifact" --transfer "$D/cranfield" --transfer "$D/cacm")
ST=(--data "$D/stsb" --transfer "$D/semeval-sts-2012-2016")
TQ=(--data "$D/pairs-small/trecqa_pairs.parquet")
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact.toml --out "$R/scifact-base"
grid "${ST[@]}" --grid examples/studies/robust/robust-stsb.toml --out "$R/stsb-base"
grid "${TQ[@]}" --grid examples/studies/robust/robust-trecqa.toml --out "$R/trecqa-base"
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-anchor.toml --out "$R/scifact-anchor"
grid "${ST[@]}" --grid examples/studies/robust/robust-stsb-anchor.toml --out "$R/stsb-anchor"
grid "${TQ[@]}" --grid examples/studies/robust/robust-trecqa-anchor.toml --out "$R/trecqa-anchor"
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-soup.toml --out "$R/scifact-soup" --soup 3
grid "${ST[@]}" --grid examples/studies/robust/robust-stsb-soup.toml --out "$R/stsb-soup" --soup 3 --soup 9
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-anchor-stsb.toml --out "$R/scifact-anchorgen"
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-anchor-strong.toml --out "$R/scifact-anchorstrong"
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-cosine.toml --out "$R/scifact-cosx"
grid "${SF[@]}" --grid examples/studies/robust/robust-scifact-query.toml --out "$R/scifact-query"   # lever 3: query-side heads
grid "${ST[@]}" --grid examples/studies/robust/robust-stsb-query.toml --out "$R/stsb-query"
grid "${TQ[@]}" --grid examples/studies/robust/robust-trecqa-query.toml --out "$R/trecqa-query"
nice -n 5 python3 bench/studies/robust_study.py --store "$S" --runs "$R" --out docs/img/robust-tradeoff.png
