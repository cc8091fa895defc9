# Sourced ON THE GPU BOX after bench/gpu/bootstrap.sh: headstore importable from the working tree (the repository
# root is the package `headstore`), the carried wheels, the MiniLM weights and the datasets.
_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$_root/.gpu/pkg" "$_root/.gpu/bin"
ln -sfn "$_root" "$_root/.gpu/pkg/headstore"
export PYTHONPATH="$_root/.gpu/pkg:$_root/.gpu/site${PYTHONPATH:+:$PYTHONPATH}"
printf '#!/usr/bin/env bash\nexec python3 -m headstore.cli "$@"\n' > "$_root/.gpu/bin/cli"
chmod +x "$_root/.gpu/bin/cli"
export PATH="$_root/.gpu/bin:$PATH"
export HEADSTORE_DATA="$_root/.gpu/datasets"
export HEADSTORE_MINILM="$_root/.gpu/minilm"
export PYTHONUNBUFFERED=1
