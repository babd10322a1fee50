#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# No message, comment or doc names a package registry's host ("the npm registry" says enough).
# The patterns are split so that this file does not match itself.
set -euo pipefail
cd "$(dirname "$0")/.."
hosts='registry\.''npmjs\.(org|com)|''npmjs\.(org|com)|registry\.''yarnpkg\.com|''pypi\.(org|python\.org)|files\.''pythonhosted\.org|''crates\.io|static\.''crates\.io|''rubygems\.org|proxy\.''golang\.org|repo''1?\.maven(\.apache)?\.org|''unpkg\.com|cdn\.''jsdelivr\.net'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then files=$(git ls-files); else files=$(find . -type f -not -path './build*' -not -path './data/*' -not -path './.git/*'); fi
found=$(printf '%s\n' "$files" | grep -v '^data/' | tr '\n' '\0' | xargs -0 grep -nIiE "$hosts" -- 2>/dev/null || true)
if [ -n "$found" ]; then
    echo "registry_hosts: these lines name a package registry's host; say \"the npm registry\" (or pip's, cargo's) instead:" >&2
    echo "$found" >&2
    exit 1
fi
echo "registry_hosts: no tracked file names a package registry's host"
