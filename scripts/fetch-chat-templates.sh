#!/usr/bin/env bash
# Fetches the test corpus of real chat templates (tests/python/test_chat_templates.py): the
# Jinja files llama.cpp keeps of the templates models ship on the Hugging Face Hub (Qwen2.5,
# Qwen3, Llama 3.x, Mistral, Phi-3.5, DeepSeek, Gemma, Granite, SmolLM3, ...), taken from the
# source distribution of llama-cpp-python on PyPI (the version tests/python/requirements.txt
# pins), checked by sha256. Idempotent; writes models/chat-templates/*.jinja.
set -euo pipefail

VERSION="0.3.36"
URL="https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$VERSION.tar.gz"
SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${WINNOW_MODEL_DIR:-$root/models}/chat-templates"
stamp="$dest/.llama-cpp-python-$VERSION"
if [ -f "$stamp" ]; then
  echo "fetch-chat-templates: $dest present"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
curl --fail --silent --show-error --location --retry 3 -o "$tmp/sdist.tar.gz" "$URL"
echo "$SHA256  $tmp/sdist.tar.gz" | sha256sum -c --quiet - || {
  echo "fetch-chat-templates: sha256 mismatch for llama_cpp_python-$VERSION.tar.gz" >&2
  exit 1
}
tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" --wildcards \
  "llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/*.jinja"
rm -rf "$dest"
mkdir -p "$dest"
cp "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp/models/templates/"*.jinja "$dest/"
touch "$stamp"
echo "fetch-chat-templates: wrote $(ls "$dest" | wc -l) templates to $dest"
