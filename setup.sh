#!/usr/bin/env bash
# Installs what cgrad needs on Debian 12 and is missing, nothing else; safe to run again.
set -euo pipefail
pkgs=(build-essential cmake libblis-dev zlib1g-dev libcjson-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "setup: packages ready"
