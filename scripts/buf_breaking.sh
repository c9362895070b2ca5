#!/usr/bin/env bash
# `buf breaking` (FILE rules) against the previous commit, when that commit has contracts.
set -euo pipefail
if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:proto 2>/dev/null; then
  npx buf breaking --against ".git#ref=HEAD~1"
  echo "buf breaking: no breaking change against HEAD~1"
else
  echo "buf breaking: no previous commit with proto/ to compare against"
fi
