#!/usr/bin/env bash
# Builds the training corpus of models/tiny-trained from Debian packages (bookworm), reproducibly:
#   tools/make_corpus.sh [WORKDIR]        (default WORKDIR: /tmp/lily-corpus)
# 1. apt-get download of the packages below into WORKDIR/debs (their versions go to
#    WORKDIR/out/packages.txt), 2. dpkg -x into WORKDIR/root, 3. tools/make_corpus.py renders
#    man pages (groff), HTML (Python docs, Debian policy/reference/developers-reference) and the
#    GCIDE dictionary to text and writes WORKDIR/out/{train,heldout,chat_train,chat_heldout}.txt,
#    4. WORKDIR/corpus.tar.xz holds the out/ folder (what travels to the GPU machine).
# The corpus is never committed. Needs apt-get, dpkg, groff, python3 (standard library), xz.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/lily-corpus}
pkgs="python3.11-doc manpages manpages-dev git-man coreutils grep sed findutils tar gawk bash
      util-linux procps openssh-client rsync less make binutils diffutils debian-reference-en
      debian-policy developers-reference dict-gcide"
mkdir -p "$work/debs" "$work/out"
rm -rf "$work/root" && mkdir -p "$work/root"
(cd "$work/debs" && apt-get download $pkgs >/dev/null 2>&1 || apt-get download $pkgs)
: >"$work/out/packages.txt"
for p in $pkgs; do
    deb=$(ls "$work/debs/${p}_"*.deb | sort | tail -1)
    dpkg -x "$deb" "$work/root"
    echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version) $(sha256sum "$deb" | cut -c1-16)" \
        >>"$work/out/packages.txt"
done
python3 "$root/tools/make_corpus.py" "$work/root" "$work/out"
(cd "$work/out" && sha256sum train.txt heldout.txt chat_train.txt chat_heldout.txt >sha256.txt)
tar -C "$work" -cf - out | xz -6 -T2 >"$work/corpus.tar.xz"
ls -l "$work/corpus.tar.xz"
