#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the project is formatted with the project's .clang-format (clang-format
# from Debian 12, version 14). Prints the files that are not, with the first differences, and exits 1.
#   scripts/check-format.sh          check
#   scripts/check-format.sh --fix    reformat them in place
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed (scripts/install-deps.sh)" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' ':!:tests/data/**')
else
  mapfile -t files < <(find common topology planner executor launcher spank_plugin tools tests bench \
    -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null | grep -v '^tests/data/' | sort)
fi
if [[ ${1:-} == --fix ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if ((${#bad[@]})); then
  echo "check-format: ${#bad[@]} of ${#files[@]} files are not formatted with .clang-format (scripts/check-format.sh --fix):"
  for f in "${bad[@]}"; do
    echo "  $f"
    diff -u "$f" <(clang-format "$f") | sed -n '3,12p' | sed 's/^/    /'
  done
  exit 1
fi
echo "check-format: ${#files[@]} files formatted with .clang-format"
