#!/usr/bin/env bash
# Run ON THE GPU BOX, once per carried bundle (bench/gpu/bundle.sh made them here): w1 and w2 install wheels into
# .gpu/site; w2 and w3 hold the two halves of MiniLM's weights, joined (and checked by sha256) into .gpu/minilm;
# w3 brings the datasets to .gpu/datasets; w4 (bench/gpu/bundle_setfit.sh) SetFit's wheels and 20 Newsgroups to .gpu/setfit.
set -euo pipefail
cd "$(dirname "$0")/../.."
part=$1
mkdir -p .gpu/site .gpu/parts
src=.gpu/$part
ls "$src" >/dev/null
if ls "$src"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .gpu/site "$src"/*.whl
fi
[ -d "$src/minilm" ] && rm -rf .gpu/minilm && cp -r "$src/minilm" .gpu/minilm
cp "$src"/model.safetensors.* .gpu/parts/ 2>/dev/null || true
[ -d "$src/datasets" ] && rm -rf .gpu/datasets && cp -r "$src/datasets" .gpu/datasets
[ -d "$src/setfit" ] && rm -rf .gpu/setfit && cp -r "$src/setfit" .gpu/setfit
[ -f "$src/ref-cpu-minilm.parquet" ] && cp "$src/ref-cpu-minilm.parquet" .gpu/
if [ -f .gpu/parts/model.safetensors.sha256 ] && [ -f .gpu/parts/model.safetensors.part-00 ] \
        && [ -f .gpu/parts/model.safetensors.part-01 ]; then
    cat .gpu/parts/model.safetensors.part-0* > .gpu/minilm/model.safetensors
    echo "$(cat .gpu/parts/model.safetensors.sha256)  .gpu/minilm/model.safetensors" | sha256sum -c -
fi
echo "bootstrap $part: site $(ls .gpu/site | wc -l) entries; minilm $(ls .gpu/minilm 2>/dev/null | wc -l) files;" \
     "datasets $(ls .gpu/datasets 2>/dev/null | wc -l)"
