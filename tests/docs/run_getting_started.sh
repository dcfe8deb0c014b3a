#!/usr/bin/env bash
# Runs every command line of docs/getting-started.md's ```sh blocks, in the page's order, each
# of which must exit 0. Blocks fenced ```sh notest (installing, building the whole project) are
# skipped, as the page says. The commands run in a scratch directory in which build/ is the
# build tree, so that files they write (--model_dir run1) land there and go with it.
# Arguments: SOURCE_DIR BUILD_DIR.
set -euo pipefail
page=$1/docs/getting-started.md
build=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"

# Lines of ```sh blocks (not ```sh notest), without blank lines and whole-line comments.
mapfile -t commands < <(awk '
  /^```sh[[:space:]]*$/ { inside = 1; next }
  /^```/                { inside = 0; next }
  inside && $0 !~ /^[[:space:]]*(#|$)/ { print }' "$page")
if ((${#commands[@]} == 0)); then
  echo "no commands in the \`\`\`sh blocks of $page" >&2
  exit 1
fi

cd "$work"
for command in "${commands[@]}"; do
  echo "\$ $command"
  start=$SECONDS
  if ! bash -c "$command"; then
    echo "run_getting_started.sh: FAILED: $command" >&2
    exit 1
  fi
  echo "(ok, $((SECONDS - start)) s)"
done
echo "run_getting_started.sh: all ${#commands[@]} commands of $page succeeded"
