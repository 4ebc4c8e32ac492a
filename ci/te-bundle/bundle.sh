#!/usr/bin/env bash
# An offline TransformerEngine for a GPU host that has torch but no package index: run this on a
# machine with one (any OS, no GPU needed), from anywhere in the project; it writes .tebundle/
# in the project root (git-ignored, ~50 MB with ARCHS=90). Copy that to the GPU host's checkout
# and start there with:   source .tebundle/install.sh
#
# Settings (environment), for the GPU host:
#   TE_VERSION  TransformerEngine release                     (default 2.20.2)
#   PY          its Python, major.minor                        (default 3.12)
#   CUDA        its torch's CUDA major: 12 or 13               (default 13)
#   ARCHS       SM architectures kept in TE's library, comma-separated: 90 Hopper, 100 Blackwell;
#               "all" keeps every one (about four times larger)              (default 90)
#   OUT         where the bundle goes                          (default .tebundle)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
TE_VERSION=${TE_VERSION:-2.20.2}
PY=${PY:-3.12}
CUDA=${CUDA:-13}
ARCHS=${ARCHS:-90}
OUT=${OUT:-.tebundle}
PYTHON=${PYTHON:-python3}

download() {  # download DEST ARGS...: wheels for the GPU host's Python and platform
  local dest=$1
  shift
  "$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: \
    --implementation cp --python-version "$PY" --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "$@"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/ext"

# 1. TE's core (the Python package and its CUDA library): unpacked; the code for other GPU
#    architectures zeroed, so that the library compresses to a fraction
download "$tmp/core" --no-deps "transformer-engine==$TE_VERSION" \
  "transformer-engine-cu$CUDA==$TE_VERSION"
mkdir "$tmp/site"
for whl in "$tmp"/core/*.whl; do "$PYTHON" -m zipfile -e "$whl" "$tmp/site"; done
rm -rf "$tmp/site/transformer_engine/jax"
if [ "$ARCHS" != all ]; then
  for lib in "$tmp"/site/transformer_engine/wheel_lib/*.so; do
    "$PYTHON" "$here/strip_fatbin.py" "$lib" "$ARCHS"
  done
fi
tar -czf "$OUT/te_core.tar.gz" -C "$tmp/site" .

# 2. TE's torch extension as source: built on the GPU host, against its own torch
"$PYTHON" -m pip download -q --disable-pip-version-check --no-deps -d "$OUT" \
  "transformer-engine-torch==$TE_VERSION"

# 3. what TE imports besides torch: pydantic with its pinned core, einops; and, without their
#    dependencies (torch and CUDA libraries the host has), the debug-API and cuDNN front ends
download "$OUT/wheels" pydantic einops packaging
download "$OUT/wheels" --no-deps nvdlfw-inspect "nvidia-cudnn-frontend>=1.29.0"

nvte_archs=$([ "$ARCHS" = all ] && echo "" || echo "${ARCHS//,/;}")
sed -e "s/@TE_VERSION@/$TE_VERSION/g" -e "s/@NVTE_CUDA_ARCHS@/$nvte_archs/g" \
  "$here/install.sh" > "$OUT/install.sh"
echo "$OUT: TransformerEngine $TE_VERSION for Python $PY, CUDA $CUDA, sm $ARCHS" \
  "($(du -sh "$OUT" | cut -f1)); on the GPU host: source $OUT/install.sh"
