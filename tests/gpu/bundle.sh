#!/bin/sh
# bundle.sh - what a bare GPU machine needs to run the GPU checks, built here: the binaries,
# the shared libraries they load that a CUDA image may not have (everything ldd names but
# glibc, the C++ runtime and CUDA's own libraries, which the GPU machine brings), and the
# kiln-tsmoe vectors. The device tool carries the folder (it is git-ignored):
#
#   tests/gpu/bundle.sh                      (makes .gpu-bundle/, about 45 MB)
#   device run, carry [".gpu-bundle"]:  sh tests/gpu/device.sh
#
# Exit: 0 made, 2 a step failed.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
B=.gpu-bundle
make -s -j"$(nproc)" BUILD="$BUILD" all gpu-check >/dev/null
# One set of binaries: the CUDA runtime is linked in and cuBLAS and NCCL are opened on first
# use, so they start on any machine; without an NCCL there, gpu-check skips its NCCL rows
# and says why.
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib"
for f in kiln gpu-check stream_service; do
    cp "$BUILD/$f" "$B/bin/"
done
for f in "$B"/bin/*; do ldd "$f"; done | awk '/=> \//{print $1, $3}' | sort -u |
    grep -Ev '^(libc|libm|libpthread|libdl|librt|libutil|ld-linux[^ ]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
    while read -r name path; do cp -L "$path" "$B/lib/$name"; done
tar -C "$B" -czf "$B/lib.tgz" lib
rm -rf "$B/lib"
V=${KILN_VECTORS:-tests/vectors}
[ -f "$V/tsmoe-moe.io.safetensors" ] || { echo "bundle.sh: no vectors at $V" >&2; exit 2; }
cp -r "$V" "$B/vectors"
du -sh "$B"
