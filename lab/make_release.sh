#!/usr/bin/env bash
# lab/make_release.sh COMMIT [NAME]: the flashtune of COMMIT as a second package, flashtune_NAME
# (NAME: release unless given; a lower-case identifier), in lab/NAME-src/ (ignored by git; carry it
# to the device), so that one process can time its kernels beside today's (lab/release_ab.py;
# lab/bwd_ab.py takes every lab/*-src). Its ops, binding and build cache are renamed so that nothing
# of the two collides: torch op flashtune_NAME_C, cache $FLASHTUNE_<NAME>_CACHE_DIR.
set -euo pipefail
commit=$1
name=${2:-release}
[[ $name =~ ^[a-z][a-z0-9]*$ ]] || { echo "make_release.sh: NAME must be a lower-case identifier, not '$name'" >&2; exit 2; }
pkg=flashtune_$name
cd "$(dirname "$0")/.."
rm -rf "lab/$name-src" && mkdir -p "lab/$name-src"
git archive "$commit" flashtune csrc profiles docs/profiles.md pyproject.toml | tar -x -C "lab/$name-src"
cd "lab/$name-src"
mv flashtune "$pkg"
find "$pkg" -name '*.py' -print0 | xargs -0 sed -i -E \
  -e "s/\bflashtune_C\b/${pkg}_C/g" \
  -e "s/(^|[^_A-Za-z0-9])flashtune(\.| import|\$)/\1${pkg}\2/g" \
  -e "s/\"flashtune::attention_(fwd|bwd)\"/\"${pkg}::attention_\1\"/g" \
  -e "s/FLASHTUNE_CACHE_DIR/FLASHTUNE_${name^^}_CACHE_DIR/g"
sed -i "s/TORCH_LIBRARY(flashtune_C/TORCH_LIBRARY(${pkg}_C/; s/TORCH_LIBRARY_IMPL(flashtune_C/TORCH_LIBRARY_IMPL(${pkg}_C/" csrc/binding.cpp
echo "$commit" > COMMIT
grep -rn "flashtune_C\b\|FLASHTUNE_CACHE_DIR" "$pkg" csrc/binding.cpp || true
