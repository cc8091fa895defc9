#!/usr/bin/env bash
# Run HERE, after bench/gpu/bundle.sh: packs .gpu/w4 for bench/gpu/setfit.sh (SetFit's contrastive body
# fine-tuning with its full default epoch on the card): the wheels SetFit needs that the GPU box lacks
# (setfit, datasets, evaluate, dill, multiprocess; sentence-transformers at this machine's version), the
# 20 Newsgroups store and dataset, and the CPU run's finished rows (PRIOR: its runs.parquet), so the card
# runs only the rows the CPU could not. Then, in one session, back to back:
#   bash bench/gpu/bootstrap.sh w1;  bash bench/gpu/bootstrap.sh w2;  bash bench/gpu/bootstrap.sh w3
#   bash bench/gpu/bootstrap.sh w4 && bash bench/gpu/setfit.sh            (carry .gpu/w4)
# STORE: the CPU's 20 Newsgroups store (cli featurize ... --format labels --text-column body, docs/labels.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${HEADSTORE_DATA:-../shared/datasets}
STORE=${STORE:?the 20 Newsgroups store (docs/labels.md)}
PRIOR=${PRIOR:?the CPU run\'s runs.parquet (cli setfit-compare --out DIR: DIR/runs.parquet)}
[ -f "$STORE/manifest.json" ] || { echo "bundle_setfit.sh: STORE=$STORE is not a feature store (no manifest.json)"; exit 2; }
[ -f "$PRIOR" ] || { echo "bundle_setfit.sh: PRIOR=$PRIOR: no such file"; exit 2; }
[ -d "$D/20newsgroups" ] || { echo "bundle_setfit.sh: $D/20newsgroups: no such folder (HEADSTORE_DATA)"; exit 2; }
rm -rf .gpu/w4 && mkdir -p .gpu/w4/setfit
ver() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
specs=(); for n in setfit datasets evaluate dill multiprocess sentence-transformers; do specs+=("$n==$(ver "$n")"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/w4 "${specs[@]}"
cp -r "$STORE" .gpu/w4/setfit/store-20ng
cp -r "$D/20newsgroups" .gpu/w4/setfit/20newsgroups
cp "$PRIOR" .gpu/w4/setfit/prior-runs.parquet
tree_kb=$(git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
kb=$(du -sk .gpu/w4 | cut -f1)
echo ".gpu/w4: $(( kb / 1024 )) MiB + the working tree $(( tree_kb / 1024 )) MiB = $(( (kb + tree_kb) / 1024 )) MiB of 64"
