#!/usr/bin/env bash
# lab/make_release.sh COMMIT: the flashtune of COMMIT as a second package, flashtune_release, in
# lab/release-src/ (ignored by git; carry it to the device), so that one process can time its
# kernels beside today's (lab/release_ab.py). Its ops, binding and build cache are renamed so that
# nothing of the two collides: torch op flashtune_release_C, cache $FLASHTUNE_RELEASE_CACHE_DIR.
set -euo pipefail
commit=$1
cd "$(dirname "$0")/.."
rm -rf lab/release-src && mkdir -p lab/release-src
git archive "$commit" flashtune csrc profiles docs/profiles.md pyproject.toml | tar -x -C lab/release-src
cd lab/release-src
mv flashtune flashtune_release
find flashtune_release -name '*.py' -print0 | xargs -0 sed -i -E \
  -e 's/\bflashtune_C\b/flashtune_release_C/g' \
  -e 's/(^|[^_A-Za-z0-9])flashtune(\.| import|$)/\1flashtune_release\2/g' \
  -e 's/"flashtune::attention_(fwd|bwd)"/"flashtune_release::attention_\1"/g' \
  -e 's/FLASHTUNE_CACHE_DIR/FLASHTUNE_RELEASE_CACHE_DIR/g'
sed -i 's/TORCH_LIBRARY(flashtune_C/TORCH_LIBRARY(flashtune_release_C/; s/TORCH_LIBRARY_IMPL(flashtune_C/TORCH_LIBRARY_IMPL(flashtune_release_C/' csrc/binding.cpp
echo "$commit" > COMMIT
grep -rn "flashtune_C\b\|FLASHTUNE_CACHE_DIR" flashtune_release csrc/binding.cpp || true
