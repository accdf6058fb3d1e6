#!/usr/bin/env bash
# Checks that the exported API of the packages listed below is compatible
# with the record in api/, using golang.org/x/exp/cmd/apidiff (a tool
# dependency in go.mod).
#
# Usage, from the repository root or anywhere in it:
#   scripts/api-check.sh           # check the working tree against api/
#   scripts/api-check.sh -update   # rewrite api/ from the working tree
#
# The check exits 1 when apidiff reports an incompatible change (a name
# removed, a signature or type changed, a method added to an interface,
# a constant's value changed) in any package, printing the changes per
# package. Compatible changes (a name, field or method added) pass: the
# check prints them and says that the record is stale. Run -update in the
# commit that adds them, so that the record grows with the API and a later
# removal of the new names is caught. A deliberate incompatible change
# (only outside the v1 promise, see README) is committed together with its
# -update. Exit 2 is a usage error.
#
# api/ holds, for each package P:
#   P.x    apidiff's export data of P (apidiff -w), what the check compares
#          the tree with. It is binary (go/types export data, with line
#          positions), written with -trimpath so that it does not depend on
#          where the clone is; -update rewrites it only when apidiff sees a
#          change, so that moved lines do not churn it.
#   P.txt  the same API as a sorted, readable listing (internal/apicheck),
#          for review in diffs. The check says when it differs from the
#          tree, but does not fail on it: apidiff decides.
#
# Environment: API_CHECK_TOOLS, a folder holding prebuilt apidiff and
# apilist binaries (the test of this script builds them once); without it
# the script builds both.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
# Module-relative file names in the export data and the build cache shared
# by every copy of the module.
export GOFLAGS="${GOFLAGS:-} -trimpath"

packages=(connector connector/driver store hashing rdma scheduler)
record=api

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}
update=false
case "$#:${1:-}" in
  0:) ;;
  1:-update) update=true ;;
  1:-h | 1:-help | 1:--help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
esac

module=$(go list -m)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tools=${API_CHECK_TOOLS:-}
if [[ -z "$tools" ]]; then
  tools=$work/bin
  go build -o "$tools/apidiff" golang.org/x/exp/cmd/apidiff
  go build -o "$tools/apilist" ./internal/apicheck/apilist
fi

"$tools/apilist" -o "$work/txt" "${packages[@]}"

if $update; then
  mkdir -p "$work/new"
  for p in "${packages[@]}"; do
    mkdir -p "$(dirname "$work/new/$p.x")"
    if [[ -f "$record/$p.x" ]] && report=$("$tools/apidiff" "$record/$p.x" "$module/$p") && [[ -z "$report" ]]; then
      cp "$record/$p.x" "$work/new/$p.x" # the same API: keep the bytes
    else
      "$tools/apidiff" -w "$work/new/$p.x" "$module/$p"
    fi
    cp "$work/txt/$p.txt" "$work/new/$p.txt"
  done
  # Only now that every package is written: the old record stays whole if
  # anything above failed.
  rm -rf "$record"
  mkdir "$record"
  cp -R "$work/new/." "$record/"
  echo "api-check: wrote $record/ for ${packages[*]}; commit it with the change"
  exit 0
fi

failed=() missing=() stale=()
for p in "${packages[@]}"; do
  if [[ ! -f "$record/$p.x" ]]; then
    echo "api-check: $p: no record $record/$p.x"
    missing+=("$p")
    continue
  fi
  if ! "$tools/apidiff" "$record/$p.x" "$module/$p" >"$work/report"; then
    echo "api-check: $p: apidiff $record/$p.x $module/$p failed (above)" >&2
    exit 1
  fi
  incompatible=() compatible=() section=
  while IFS= read -r line; do
    case "$line" in
      "Incompatible changes:") section=incompatible ;;
      "Compatible changes:") section=compatible ;;
      "- "*)
        case "$section" in
          incompatible) incompatible+=("$line") ;;
          compatible) compatible+=("$line") ;;
          *) section=unknown ;;
        esac ;;
      *) section=unknown ;;
    esac
    if [[ "$section" == unknown ]]; then
      echo "api-check: $p: apidiff printed a report this script does not know:" >&2
      cat "$work/report" >&2
      exit 1
    fi
  done <"$work/report"

  if ((${#incompatible[@]})); then
    echo "api-check: $p: incompatible with $record/$p.x:"
    printf '%s\n' "${incompatible[@]}"
    failed+=("$p")
  fi
  if ((${#compatible[@]})); then
    echo "api-check: $p: compatible changes, not yet in $record/$p.x:"
    printf '%s\n' "${compatible[@]}"
    stale+=("$p")
  fi
  if ! cmp -s "$record/$p.txt" "$work/txt/$p.txt"; then
    echo "api-check: $p: $record/$p.txt differs from the tree's listing:"
    diff -u --label "$record/$p.txt" --label "tree" "$record/$p.txt" "$work/txt/$p.txt" | tail -n +3 || true
    [[ " ${stale[*]} ${failed[*]} " == *" $p "* ]] || stale+=("$p")
  fi
done

if ((${#failed[@]})); then
  echo "api-check: FAIL: the exported API of ${failed[*]} is incompatible with $record/."
  echo "  Within v1 only additive changes are allowed. If the change is deliberate"
  echo "  (outside the promise), run scripts/api-check.sh -update and commit $record/ with it."
fi
if ((${#missing[@]})); then
  echo "api-check: FAIL: $record/ has no record of ${missing[*]}: run scripts/api-check.sh -update"
fi
if ((${#failed[@]} + ${#missing[@]})); then
  exit 1
fi
if ((${#stale[@]})); then
  echo "api-check: ok, compatible; but the record of ${stale[*]} is stale: run scripts/api-check.sh -update"
  exit 0
fi
echo "api-check: ok: ${packages[*]} match $record/"
