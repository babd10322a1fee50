#!/bin/sh
# SPDX-License-Identifier: MIT
# Doxygen input filter: cgrad's headers comment each declaration with a plain /* */ line above it
# (or after it, for enum members and fields). This turns those into Doxygen comments as it reads
# them, so the headers stay in the house style: the top comment becomes the file's description,
# a comment opening a line documents what follows, a comment after code documents that code.
# Section rulers (/* ---- ... ---- */) stay plain comments.
exec sed -e '1s|^/\* |/** @file\n * |' \
         -e '/^[[:space:]]*\/\* --/b' -e 's|^\([[:space:]]*\)/\* |\1/** |' \
         -e 's|\([^[:space:]/*][^/]*\)/\* |\1/**< |' "$1"
