#!/usr/bin/env bash
# Installs llama.cpp's prebuilt CPU binaries from npm (node-llama-cpp and @node-llama-cpp/linux-x64
# at the exact versions of package-lock.json) into bench/llama/node_modules, and makes
# bench/llama/avx2/node_modules: a hard-linked copy whose only ggml CPU backend is the AVX2 one
# (libggml-cpu-haswell.so), so that ggml cannot pick an AVX-512 variant. Both folders are
# git-ignored. Optional packages (the CUDA/Vulkan builds) are left out and no install script runs
# (the prebuilt binaries need none).
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f node_modules/node-llama-cpp/package.json ]; then
    # npm install, not npm ci: npm leaves optional packages that are not published for this
    # version out of the lock file, and npm ci then refuses the lock; install keeps it as is.
    npm install --omit=optional --ignore-scripts --no-audit --no-fund
fi
bins=node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
[ -f "$bins/libggml-cpu-haswell.so" ] || { echo "setup.sh: $bins/libggml-cpu-haswell.so missing" >&2; exit 1; }
rm -rf avx2
mkdir avx2
cp -al node_modules avx2/node_modules
for f in avx2/"$bins"/libggml-cpu-*.so; do
    [ "$(basename "$f")" = libggml-cpu-haswell.so ] || rm -f "$f"
done
echo "setup.sh: node_modules (all CPU variants) and avx2/node_modules ($(ls avx2/$bins | grep -c libggml-cpu) CPU variant: haswell)"
