#!/usr/bin/env bash
# `buf breaking` (FILE rules, buf.yaml) of the contracts in the work tree against what main promises:
# - on a branch: against `git merge-base HEAD main` (local `main`, else `origin/main`), so every
#   commit of the branch is judged together, not only the last one;
# - on main itself (CI's clean clone) or a detached HEAD: against the commit recorded in
#   proto/BREAKING_BASELINE (see the comment there for when to move it).
# AMC_BUF_AGAINST=<commit> overrides both. Needs the history (a shallow clone fails, loudly).
# Works in a plain clone and in a git worktree (buf reads the repository's common git dir).
set -euo pipefail
cd "$(dirname "$0")/.."

git_dir=$(git rev-parse --path-format=absolute --git-common-dir)

baseline() {
  grep -v '^[[:space:]]*\(#\|$\)' proto/BREAKING_BASELINE | head -n 1 | tr -d '[:space:]'
}

main_ref() {
  for ref in main origin/main; do
    if git rev-parse -q --verify "$ref^{commit}" >/dev/null; then
      echo "$ref"
      return
    fi
  done
}

branch=$(git symbolic-ref -q --short HEAD || true)
if [ -n "${AMC_BUF_AGAINST:-}" ]; then
  against=$AMC_BUF_AGAINST
  why="AMC_BUF_AGAINST"
elif [ -z "$branch" ] || [ "$branch" = main ]; then
  against=$(baseline)
  why="the baseline in proto/BREAKING_BASELINE (${branch:-detached HEAD})"
else
  ref=$(main_ref)
  if [ -z "$ref" ]; then
    echo "buf breaking: branch '$branch' but no 'main' or 'origin/main' to find the merge base" \
      "(git fetch origin main)" >&2
    exit 1
  fi
  against=$(git merge-base HEAD "$ref")
  why="the merge base of '$branch' with $ref"
fi

if ! sha=$(git rev-parse -q --verify "$against^{commit}"); then
  echo "buf breaking: commit '$against' ($why) is not in this clone;" \
    "a shallow clone needs 'git fetch --unshallow'" >&2
  exit 1
fi
if ! git merge-base --is-ancestor "$sha" HEAD; then
  echo "buf breaking: $sha ($why) is not an ancestor of HEAD" >&2
  exit 1
fi
if ! git cat-file -e "$sha:proto" 2>/dev/null; then
  echo "buf breaking: $sha ($why) has no proto/ to compare against" >&2
  exit 1
fi
npx buf breaking --against "$git_dir#ref=$sha"
echo "buf breaking: no breaking change against ${sha:0:12}, $why"
