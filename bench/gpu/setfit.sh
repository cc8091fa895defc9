#!/usr/bin/env bash
# ON THE GPU BOX after bootstrap w1-w4 (bench/gpu/bundle_setfit.sh): `cli setfit-compare` on 20 Newsgroups with
# SetFit (b), its contrastive body fine-tuning, run for its whole default epoch (no --setfit-max-steps), at the
# CPU table's shots, seeds and 500 test texts. The CPU run's finished rows (headstore's heads, the tuned LR,
# SetFit (a)) are carried in and reused, so the card runs only (b); each finished (b) run is saved at once, so
# a cut run keeps them. Everything comes back in $OUT (at most 8 files): runs.parquet (every row), setfit.log,
# jobs.tgz (each job's log), env.log and the card's utilisation; the table is made here afterwards (cli
# setfit-compare --no-setfit-body over the rows, docs/labels.md).
#   GPU_SETFIT_SECONDS (default 330): the time box; GPU_SETFIT_SHOTS (default 8,16), GPU_SETFIT_SEEDS (0,1,2);
#   GPU_SETFIT_PARALLEL (default 1): processes at a time on the card; GPU_SETFIT_EXTRA: more
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
# one process per (shots, seed), up to GPU_SETFIT_PARALLEL at a time (one process keeps the card ~30% busy: small
# fp32 batches, launch-bound), each in its own folder seeded with the finished rows; all under one time box
jobs=()
IFS=, read -r -a shot_list <<< "${GPU_SETFIT_SHOTS:-8,16}"
IFS=, read -r -a seed_list <<< "${GPU_SETFIT_SEEDS:-0,1,2}"
for shots in "${shot_list[@]}"; do for seed in "${seed_list[@]}"; do jobs+=("$shots $seed"); done; done
run_one() {  # run_one SHOTS SEED: one setfit-compare process, its log in $OUT
    local dir="$RUN/p-$1-$2"
    mkdir -p "$dir"; [ -f "$dir/runs.parquet" ] || cp "$RUN/runs.parquet" "$dir/runs.parquet"
    # shellcheck disable=SC2086
    cli setfit-compare --store "$W/store-20ng" --data "$W/20newsgroups" --text-column body --shots "$1" --seeds "$2" \
        --test-per-class 25 --losses ce --out "$dir" ${GPU_SETFIT_EXTRA:-} > "$RUN/logs/setfit-$1-$2.log" 2>&1
    echo "[setfit.sh] shots $1 seed $2: exit $? at $(( SECONDS - t0 )) s"
}
mkdir -p "$RUN/logs"
export -f run_one; export W RUN OUT GPU_SETFIT_EXTRA t0
printf '%s\n' "${jobs[@]}" | timeout "${GPU_SETFIT_SECONDS:-330}" xargs -P "${GPU_SETFIT_PARALLEL:-1}" -L 1 \
    bash -c 'run_one $0 $1' | tee "$OUT/setfit.log"
rc=${PIPESTATUS[1]}
python3 - "$RUN" <<'PY'
import sys, glob, polars as pl
run = sys.argv[1]  # every job's rows (the finished ones: each is saved as it ends) and the prior ones, once each
frames = [pl.read_parquet(f) for f in [f"{run}/runs.parquet", *sorted(glob.glob(f"{run}/p-*/runs.parquet"))]]
rows = pl.concat(frames, how="diagonal_relaxed").unique(["method", "shots", "seed"], keep="first", maintain_order=True)
rows.write_parquet(f"{run}/runs.parquet")
PY
tar czf "$OUT/jobs.tgz" -C "$RUN" logs
[ -n "$SMI" ] && kill "$SMI"
cp "$RUN/runs.parquet" "$OUT/" 2>/dev/null
[ -f "$RUN/runs.parquet" ] && python3 - "$RUN/runs.parquet" <<'PY'
import sys, polars as pl
pl.Config.set_fmt_str_lengths(60); pl.Config.set_tbl_width_chars(160)
f = pl.read_parquet(sys.argv[1]).filter(pl.col("method").str.starts_with("SetFit (b)"))
cols = [c for c in ("method", "shots", "seed", "accuracy", "macro_f1", "seconds", "steps", "epoch_steps") if c in f.columns]
print(f.select(cols))
PY
[ -s "$OUT/smi.csv" ] && echo "card utilisation: mean $(awk -F, '{s+=$1; n++} END {printf "%.0f", s/n}' "$OUT/smi.csv")%, $(wc -l < "$OUT/smi.csv") samples"
echo "setfit-compare exit $rc after $(( SECONDS - t0 )) s (124: cut by the time box; finished runs kept)"
