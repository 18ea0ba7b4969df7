#!/bin/bash
# Gathers, on a Debian machine with nmcmc's build packages installed (make deps), what a build on
# a machine without them needs: the header-only libraries' headers and GoogleTest's source, into
# DEST (then: scripts/build_with_pytorch.sh DEST BUILD there; docs/gpu.md). Nothing is downloaded.
#   scripts/gather_build_deps.sh DEST
set -euo pipefail
dest=${1:?usage: scripts/gather_build_deps.sh DEST}
mkdir -p "$dest/include/stb"
for d in nlohmann fmt CLI; do
  [ -d /usr/include/$d ] || { echo "missing /usr/include/$d: install nmcmc's build packages first (make deps)" >&2; exit 1; }
  cp -r /usr/include/$d "$dest/include/"
done
cp /usr/include/stb/stb_image.h /usr/include/stb/stb_image_write.h "$dest/include/stb/"
cp /usr/include/zlib.h /usr/include/zconf.h "$dest/include/"
rm -rf "$dest/googletest" && cp -r /usr/src/googletest "$dest/googletest"
echo "$dest: $(du -sh "$dest" | cut -f1) (headers of nlohmann-json, fmt, CLI11, stb_image, zlib; GoogleTest's source)"
