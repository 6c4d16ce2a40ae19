#!/usr/bin/env bash
# Formats troupe's C++ with .clang-format (the house style's layout), or checks that it is.
#
#   scripts/format.sh            rewrites every tracked .h and .cpp file in place
#   scripts/format.sh --check    changes nothing; lists what is off and exits 1 if anything is
#
# Needs Debian 12's clang-format (version 14, scripts/setup.sh installs it): another version
# lays some code out differently, so the check refuses to run with one.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [ "$version" != 14 ]; then
  echo "format: clang-format 14 is needed (Debian 12's), not $(clang-format --version)" >&2
  exit 2
fi

mode=(-i)
[ "${1:-}" = --check ] && mode=(--dry-run --Werror)
git ls-files -z -- '*.h' '*.cpp' | xargs -0 -P "$(nproc)" -n 16 clang-format "${mode[@]}" --style=file
[ "${1:-}" = --check ] && echo "format: every .h and .cpp file is formatted"
exit 0
