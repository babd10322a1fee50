#!/bin/sh
# SPDX-License-Identifier: MIT
# Doxygen input filter for the public headers: they comment each declaration with a plain /* */
# line above it (or after it, for enum members and fields). This turns those into Doxygen comments
# as it reads them, so the headers stay in the house style: the comment after the SPDX line becomes
# the file's description, a comment opening a line documents what follows, a comment after code
# documents that code. Section rulers (/* ---- ... ---- */) stay plain comments. Every declaration
# of a header in graph/, ops/, models/, optim/, io/ or dist/ joins that folder's module (group,
# defined in docs/modules.dox), so the site lists the API by folder.
case $1 in
*/graph/*.h) group=graph ;; */ops/*.h) group=ops ;; */models/*.h) group=models ;;
*/optim/*.h) group=optim ;; */io/*.h) group=io ;; */dist/*.h) group=dist ;; *) group= ;;
esac
open=""
[ -n "$group" ] && open="/** @addtogroup $group */ /** @{ */"
sed -e "1s|^/\* SPDX-License-Identifier: MIT \*/\$|$open|" \
    -e "2s|^/\* |/** @file\n * |" -e '2b' \
    -e '/^[[:space:]]*\/\* --/b' -e 's|^\([[:space:]]*\)/\* |\1/** |' \
    -e 's|\([^[:space:]/*][^/]*\)/\* |\1/**< |' "$1"
[ -n "$group" ] && echo '/** @} */'
exit 0
