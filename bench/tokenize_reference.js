// SPDX-License-Identifier: MIT
// The reference side of bench/tokenize_bench.sh: @lenml/tokenizers (REFDIR, an unpacked package)
// encodes stdin with the tokenizer.json and tokenizer_config.json in TOKDIR, as `cgrad tokenize`
// does (encode() with its default special tokens), prints the ids as one JSON array, and to stderr
// load_s=... encode_s=... as `cgrad tokenize --time` does (wall seconds; encode_s with the printing).
//   node bench/tokenize_reference.js REFDIR TOKDIR < text
'use strict';
const fs = require('fs');
const path = require('path');
const [refdir, tokdir] = process.argv.slice(2);
const t0 = process.hrtime.bigint();
const { TokenizerLoader } = require(path.join(refdir, 'dist', 'main.js'));
const read = f => JSON.parse(fs.readFileSync(path.join(tokdir, f), 'utf8'));
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: read('tokenizer.json'), tokenizerConfig: read('tokenizer_config.json') });
const t1 = process.hrtime.bigint();
const text = fs.readFileSync(0, 'utf8');
const t2 = process.hrtime.bigint();
process.stdout.write(JSON.stringify(tok.encode(text)) + '\n');
const t3 = process.hrtime.bigint();
process.stderr.write(`load_s=${Number(t1 - t0) / 1e9} encode_s=${Number(t3 - t2) / 1e9}\n`);
