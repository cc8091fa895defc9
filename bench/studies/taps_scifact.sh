#!/usr/bin/env bash
# bash bench/studies/taps_scifact.sh WORK, then python3 bench/studies/taps_scifact_ci.py WORK --json OUT.json
# SciFact with the taps recipe of docs/taps.md (issue 57 goal 3): the same store settings, taps chosen on SciFact's
# training pairs, a residual head over them with array dropout 0.3; beside the default head on the same store; 3 seeds;
# each head evaluated on Cranfield and CACM. Resumable: a finished head or eval folder is skipped.
set -uo pipefail
W=$(realpath -m "${1:?usage: taps_scifact.sh WORK}"); S=$W/store; mkdir -p "$W"
cd "$(dirname "$0")/../.."
D=$(realpath -m "${HEADSTORE_DATA:-../shared/datasets}")
start=$(date +%s)
cli featurize --store $S --data $D/scifact --data $D/cranfield --data $D/cacm --model minilm --max-length 256 \
    --precision bf16 --taps > $W/featurize.log 2>&1 || { echo featurize failed; exit 1; }
echo "featurize $(( $(date +%s) - start )) s" >> $W/times.log
[ -f $W/sel.json ] || cli select-taps --store $S --data $D/scifact --keep 4 --out $W/sel.json > $W/select.log 2>&1
ARR=$(python3 -c "import json;d=json.load(open('$W/sel.json'));print(d.get('array') or d.get('chosen_array') or d['arrays'])")
echo "array $ARR" >> $W/times.log
for seed in 0 1 2; do
  for recipe in default taps; do
    H=$W/$recipe-s$seed
    if [ ! -f $H/metrics.json ]; then
      t=$(date +%s)
      if [ $recipe = default ]; then
        cli train-head --store $S --data $D/scifact --out $H --seed $seed --overwrite > $H.log 2>&1
      else
        cli train-head --store $S --data $D/scifact --out $H --seed $seed --overwrite --array "$ARR" --mix-mode concat \
            --out-dim 384 --normalize standardize --array-dropout 0.3 > $H.log 2>&1
      fi
      echo "$recipe-s$seed train $(( $(date +%s) - t )) s rc=$?" >> $W/times.log
    fi
    for target in cranfield cacm; do
      [ -f $H-on-$target/metrics.json ] || cli eval --store $S --head $H --data $D/$target --out $H-on-$target --overwrite > $H-on-$target.log 2>&1
    done
  done
done
echo "all $(( $(date +%s) - start )) s" >> $W/times.log
