#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every source, script and build file carries the licence's SPDX line (fixtures and corpora are data).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f LICENSE ] || { echo "spdx: LICENSE is missing" >&2; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then files=$(git ls-files); else files=$(find . -type f -not -path './build*' -not -path './data/*' -not -path './.git/*' | sed 's|^\./||'); fi
missing=$(printf '%s\n' "$files" | grep -E '\.(c|h|cpp|def|js|sh|py|cmake)$|(^|/)CMakeLists\.txt$|\.in$|^\.ci/run$' \
          | grep -vE '^tests/fixtures/|/corpus/' | while read -r f; do
              [ -f "$f" ] && ! head -3 "$f" | grep -q 'SPDX-License-Identifier: MIT' && echo "$f"; done || true)
if [ -n "$missing" ]; then
    echo "spdx: these files lack 'SPDX-License-Identifier: MIT' in their first three lines:" >&2
    echo "$missing" >&2
    exit 1
fi
echo "spdx: every source file carries the MIT SPDX line"
