#!/usr/bin/env bash
# Build .devcarry/: what bench/gpu_session.sh installs on a CUDA machine that has torch and timm but
# not Ray or simplejpeg, and no package index (the device machine lent to this project: Python 3.12).
#
#   bash bench/devcarry_build.sh [PYVER]      # PYVER default 3.12; needs pip's index here, gcc, xz
#   PYTHON=/root/.pyenv/versions/3.12.1/bin/python3.12 bash bench/devcarry_build.sh   # headers from there
#
# Writes .devcarry/ (git-ignored; ~33 MB):
#   ray.tar.xz   the ray package from its wheel, file modes kept (raylet, gcs_server executable), less
#                what raypipe never imports (Java jars, dashboard web UI, rllib, serve, llm)
#   wheels/      simplejpeg, jsonschema (+ deps; ray needs it), pydantic (+ deps; ray.train needs it)
#   photos/      the sample photos (raypipe/sample_photos), in case the copy there lacks some
#   _jpegregion.cpython-XY-x86_64-linux-gnu.so   the partial-decode extension for that Python, with
#                libjpeg-turbo linked in statically (that machine may lack libjpeg.so.62), if
#                python$PYVER's headers and /usr/lib/x86_64-linux-gnu/libjpeg.a exist
#   _warp.*.so, _resample.*.so, _colorops.*.so, _affine.*.so   the auto-augment warp, resize, auto-augment colour ops
#                                               and CPU normalise extensions for that Python
set -euo pipefail
PYVER=${1:-3.12}
TAG=cp${PYVER/./}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/.devcarry
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
grep -qx '/.devcarry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.devcarry/' >>"$ROOT/.git/info/exclude"
rm -rf "$OUT" && mkdir -p "$OUT/wheels" "$OUT/photos"

download() {  # download DIR NAME==VERSION...: binary wheels for the target Python, no dependencies
    local dir=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dir" "$@"
}

echo "ray wheel -> ray.tar.xz"
download "$WORK" ray==2.60.0
python3 - "$WORK"/ray-2.60.0-"$TAG"-*.whl "$WORK/stage" <<'PY'
import os, sys, zipfile
wheel, stage = sys.argv[1], sys.argv[2]
drop = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/serve/", "ray/llm/")
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if name.startswith(drop) or name.endswith(".js.map") or name.endswith("/"):
            continue
        path = z.extract(info, stage)
        mode = (info.external_attr >> 16) & 0o777
        if mode:
            os.chmod(path, mode)  # zipfile does not apply the modes the wheel records
PY
tar -C "$WORK/stage" -cJf "$OUT/ray.tar.xz" ray ray-2.60.0.dist-info

echo "wheels"
download "$OUT/wheels" simplejpeg==1.9.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
    referencing==0.37.0 rpds-py==2026.9.1 pydantic==2.11.10 pydantic-core==2.33.2 annotated-types==0.8.0 \
    typing-inspection==0.4.2

echo "photos"
python3 -c "
import shutil
from raypipe.sample_data import PHOTO_DIR, PHOTOS
for p in PHOTOS:
    shutil.copy(PHOTO_DIR / p, '$OUT/photos/' + p)"

# PYTHON: an interpreter of the target version, for its headers (e.g. a pyenv one: PYENV_VERSION=3.12.1)
INC=$(${PYTHON:-python$PYVER} -c "import sysconfig; print(sysconfig.get_paths()['include'])" 2>/dev/null || true)
LIBJPEG=/usr/lib/x86_64-linux-gnu/libjpeg.a
if [ -n "$INC" ] && [ -f "$LIBJPEG" ]; then
    echo "_jpegregion for CPython $PYVER, libjpeg static"
    mkdir -p "$WORK/jpeg" && (cd "$WORK/jpeg" && ar x "$LIBJPEG")
    # libjpeg.a is built -fPIE: jerror.o's reference to libc's `stderr` cannot go into a shared object.
    # Rename it to a hidden pointer set at load time (only libjpeg's default message output uses it,
    # and _jpegregion.c replaces both routines that would call that).
    objcopy --redefine-sym stderr=_jr_libjpeg_stderr "$WORK/jpeg/jerror.c.o"
    (cd "$WORK/jpeg" && ar rcs "$WORK/libjpeg_jr.a" $(ar t "$LIBJPEG"))
    cat >"$WORK/shim.c" <<'C'
#include <stdio.h>
__attribute__((visibility("hidden"))) FILE *_jr_libjpeg_stderr;
__attribute__((constructor)) static void _jr_init_stderr(void) { _jr_libjpeg_stderr = stderr; }
C
    gcc -shared -fPIC -O2 -I"$INC" "$ROOT/raypipe/kernels/_jpegregion.c" "$WORK/shim.c" "$WORK/libjpeg_jr.a" \
        -Wl,--exclude-libs,ALL -Wl,-z,noexecstack -o "$OUT/_jpegregion.cpython-${PYVER/./}-x86_64-linux-gnu.so"
else
    echo "no python$PYVER headers or no $LIBJPEG: skipping the extension (whole-image decodes there)"
fi
if [ -n "$INC" ]; then  # the extensions without a library: auto-augment warps, resize, CPU normalise
    echo "_warp, _resample, _colorops and _affine for CPython $PYVER"
    for ext in _warp _resample _colorops; do
        gcc -shared -fPIC -O2 -ffp-contract=off -I"$INC" "$ROOT/raypipe/kernels/$ext.c" \
            -o "$OUT/$ext.cpython-${PYVER/./}-x86_64-linux-gnu.so"
    done
    gcc -shared -fPIC -O3 -ffp-contract=off -I"$INC" "$ROOT/raypipe/device/_affine.c" \
        -o "$OUT/_affine.cpython-${PYVER/./}-x86_64-linux-gnu.so"
fi
du -sh "$OUT"
