#!/usr/bin/env bash
# Puts the header-only cuDNN frontend (NVIDIA's C++ graph API over cuDNN) into .deps/cudnn_frontend/include,
# for `make USE_CUDNN=1 ...` (llmc/cudnn_attention.cpp). It comes from the nvidia-cudnn-frontend wheel on
# PyPI, which carries the headers; only they are unpacked (nothing is installed into python).
#   bash dev/setup_cudnn_frontend.sh [VERSION]      (default 1.32.0; needs pip and the network once)
# For a machine without network: run it where there is one and copy .deps/cudnn_frontend over.
set -euo pipefail
VERSION=${1:-1.32.0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/.deps/cudnn_frontend
if [ -f "$DEST/include/cudnn_frontend.h" ] && [ -f "$DEST/VERSION" ] && [ "$(cat "$DEST/VERSION")" = "$VERSION" ]; then
    echo "cuDNN frontend $VERSION already in $DEST"
    exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: "nvidia-cudnn-frontend==$VERSION" -d "$TMP"
WHEEL=$(ls "$TMP"/nvidia_cudnn_frontend-*.whl | head -1)
python3 - "$WHEEL" "$TMP/unpacked" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    if not any(n.endswith("cudnn_frontend.h") for n in names):
        sys.exit(f"{wheel}: no include/cudnn_frontend.h in the wheel")
    for n in names:
        z.extract(n, out)
PY
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$TMP/unpacked/include" "$DEST/include"
echo "$VERSION" > "$DEST/VERSION"
echo "cuDNN frontend $VERSION headers in $DEST/include"
