#!/usr/bin/env bash
# The main job, end to end on real data with the offline all-MiniLM-L6-v2:
# featurize six datasets once, train L1-energy heads on SciFact, STS-B and a file of positive pairs
# (TREC-QA questions and answer sentences, evaluated as retrieval), evaluate them in-domain and
# out-of-domain (beside the frozen baseline), and run the example grid on STS-B.
# Rerunnable: featurize adds nothing new, --overwrite replaces the heads and evaluations, the grid resumes.
# Data: $HEADSTORE_DATA (default ../shared/datasets); outputs: $RUNS (default runs/).
set -euo pipefail
cd "$(dirname "$0")/.."
D=${HEADSTORE_DATA:-../shared/datasets}
R=${RUNS:-runs}
S=$R/store-minilm
mkdir -p "$R"

cli featurize --model minilm --data "$D/scifact" --data "$D/stsb" --data "$D/cranfield" --data "$D/cacm" \
    --data "$D/semeval-sts-2012-2016" --data "$D/pairs-small/trecqa_pairs.parquet" --store "$S"
cli store verify "$S"

cli train-head --store "$S" --data "$D/scifact" --loss l1-energy --out "$R/scifact-l1" --overwrite
for target in cranfield cacm; do
    cli eval --store "$S" --head "$R/scifact-l1" --data "$D/$target" --out "$R/scifact-l1-on-$target" --overwrite
done
cli train-head --store "$S" --data "$D/stsb" --loss l1-energy --out "$R/stsb-l1" --overwrite
cli eval --store "$S" --head "$R/stsb-l1" --data "$D/semeval-sts-2012-2016" --exclude-overlap "$D/stsb" \
    --out "$R/stsb-l1-on-semeval" --overwrite
# positive pairs only (anchor, positive): each test question ranks every answer sentence of the test split
cli train-head --store "$S" --data "$D/pairs-small/trecqa_pairs.parquet" --loss l1-energy \
    --out "$R/trecqa-pairs-l1" --overwrite
cli grid --store "$S" --data "$D/stsb" --grid examples/grid.toml --out "$R/grid-stsb"
echo "done: see $R/*/metrics.json and $R/grid-stsb/leaderboard.md"
