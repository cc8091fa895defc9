#!/usr/bin/env bash
# ON THE GPU BOX after bootstrap w1-w4 (bench/gpu/bundle_setfit.sh): `cli setfit-compare` on 20 Newsgroups with
# SetFit (b), its contrastive body fine-tuning, run for its whole default epoch (no --setfit-max-steps), at the
# CPU table's shots, seeds and 500 test texts. The CPU run's finished rows (headstore's heads, the tuned LR,
# SetFit (a)) are carried in and reused, so the card runs only (b); each finished (b) run is saved at once, so
# a cut run keeps them. Everything comes back in $OUT: runs.parquet, setfit.md (when it finished), the log,
# env.log and the card's utilisation.
#   GPU_SETFIT_SECONDS (default 330): the time box; GPU_SETFIT_SHOTS (default 8,16); GPU_SETFIT_EXTRA: more
#   setfit-compare options (the CPU rehearsal: GPU_SETFIT_DEVICE=cpu GPU_SETFIT_EXTRA="--setfit-max-steps 2").
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${GPU_SETFIT_DEVICE:-cuda}" = cuda ]; then source bench/gpu/env.sh; fi
OUT=${OUT:-runs/gpu-setfit}
RUN=${GPU_SETFIT_RUN:-runs/gpu-setfit-run}
W=${GPU_SETFIT_BUNDLE:-.gpu/setfit}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_DISABLE=1
for need in "$W/store-20ng" "$W/20newsgroups" "$W/prior-runs.parquet"; do
    [ -e "$need" ] || { echo "setfit.sh: $need is missing: bench/gpu/bundle_setfit.sh here, then bench/gpu/bootstrap.sh w4 there"; exit 2; }
done
mkdir -p "$OUT" "$RUN"
[ -f "$RUN/runs.parquet" ] || cp "$W/prior-runs.parquet" "$RUN/runs.parquet"
{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || lscpu | grep 'Model name'
    python3 -c "import torch, setfit, sentence_transformers as st, transformers as t; print('torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'setfit', setfit.__version__, 'sentence-transformers', st.__version__,
'transformers', t.__version__)"
    git log -1 --format='commit %h %s' 2>/dev/null
} 2>&1 | tee "$OUT/env.log"
SMI=
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -l 2 > "$OUT/smi.csv" &
    SMI=$!
fi
t0=$SECONDS
# shellcheck disable=SC2086
timeout "${GPU_SETFIT_SECONDS:-330}" cli setfit-compare --store "$W/store-20ng" --data "$W/20newsgroups" \
    --text-column body --shots "${GPU_SETFIT_SHOTS:-8,16}" --seeds 0,1,2 --test-per-class 25 --losses ce \
    --out "$RUN" ${GPU_SETFIT_EXTRA:-} 2>&1 | tee "$OUT/setfit.log"
rc=${PIPESTATUS[0]}
[ -n "$SMI" ] && kill "$SMI"
cp "$RUN/runs.parquet" "$OUT/" 2>/dev/null
cp "$RUN/setfit.md" "$OUT/" 2>/dev/null
[ -f "$RUN/runs.parquet" ] && python3 - "$RUN/runs.parquet" <<'PY'
import sys, polars as pl
pl.Config.set_fmt_str_lengths(60); pl.Config.set_tbl_width_chars(160)
f = pl.read_parquet(sys.argv[1]).filter(pl.col("method").str.starts_with("SetFit (b)"))
cols = [c for c in ("method", "shots", "seed", "accuracy", "macro_f1", "seconds", "steps", "epoch_steps") if c in f.columns]
print(f.select(cols))
PY
[ -s "$OUT/smi.csv" ] && echo "card utilisation: mean $(awk -F, '{s+=$1; n++} END {printf "%.0f", s/n}' "$OUT/smi.csv")%, $(wc -l < "$OUT/smi.csv") samples"
echo "setfit-compare exit $rc after $(( SECONDS - t0 )) s (124: cut by the time box; finished runs kept)"
