#!/usr/bin/env bash
# docs/reference/flags.md must be exactly what scripts/gen-flag-reference.sh prints for the
# programs as built (their --help output), so that the reference cannot go stale.
# Arguments: SOURCE_DIR BUILD_DIR.
set -euo pipefail
source_dir=$1
build=$2
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
"$source_dir/scripts/gen-flag-reference.sh" "$build" >"$generated"
if ! diff -u "$source_dir/docs/reference/flags.md" "$generated"; then
  echo "docs/reference/flags.md differs from the programs' --help (above: - the page, + the" \
       "programs). Refresh it: scripts/gen-flag-reference.sh $build > docs/reference/flags.md" >&2
  exit 1
fi
echo "docs/reference/flags.md matches the programs' --help"
