// SPDX-License-Identifier: MIT
// Reference ids for the tokenizer.json parity test (tests/test_tokenizer_hf.c):
//   node tests/make_hf_tokenizer_fixtures.js
// writes tests/fixtures/tokenizer/hf_corpus.txt (the corpus, built here from a fixed seed, the
// Moby Dick prefix of ./setup.sh's data and a few of cgrad's sources) and hf_<name>.ids for the
// three tokenizers ./setup.sh fetches (data/llama2, data/llama3, data/qwen3). The reference is
// @lenml/tokenizers (a port of transformers.js), npm-packed here at a pinned version and sha256.
// hf_<name>.ids: line 1 is encode(corpus) (the default: special tokens added); then one line per
// corpus line (split on "\n"): "R<TAB>[ids]" with R = 1 when decode(encode(line)) gives the line
// back in the reference (no special tokens, no clean-up), else 0.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const crypto = require('crypto');
const { execFileSync } = require('child_process');

const repo = path.resolve(__dirname, '..');
const fixdir = path.join(__dirname, 'fixtures', 'tokenizer');
const REFERENCE = { spec: '@lenml/tokenizers@3.7.2',
  sha256: '4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438' };
const TOKENIZERS = ['llama2', 'llama3', 'qwen3'];

function sha256(buf) { return crypto.createHash('sha256').update(buf).digest('hex'); }

function loadReference() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cg-hftok-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  execFileSync('npm', ['pack', REFERENCE.spec, '--loglevel=error'], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] });
  const tgz = fs.readdirSync(dir).find(f => f.endsWith('.tgz'));
  const got = sha256(fs.readFileSync(path.join(dir, tgz)));
  if (got !== REFERENCE.sha256) throw new Error(`${REFERENCE.spec}: sha256 ${got}, expected ${REFERENCE.sha256}`);
  execFileSync('tar', ['xzf', tgz], { cwd: dir });
  return require(path.join(dir, 'package', 'dist', 'main.js'));
}

// A small deterministic generator (mulberry32), so the corpus is the same on every run.
function rng(seed) {
  return () => {
    seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point ranges assigned long before Unicode 14 (the oldest Unicode data among the reference's
// ICU, PCRE2 and utf8proc), so every library classifies them alike.
const RANGES = [
  [0x20, 0x7E], [0x20, 0x7E], [0x20, 0x7E], [0x30, 0x39], [0xA0, 0xFF], [0x100, 0x17F], [0x180, 0x24F],
  [0x300, 0x36F], [0x391, 0x3A9], [0x3B1, 0x3C9], [0x400, 0x4FF], [0x5D0, 0x5EA], [0x591, 0x5BD],
  [0x621, 0x64A], [0x64B, 0x652], [0x660, 0x669], [0x905, 0x939], [0x93E, 0x94D], [0x966, 0x96F],
  [0xE01, 0xE3A], [0xE40, 0xE4E], [0xAC00, 0xD7A3], [0x1100, 0x1112], [0x4E00, 0x9FA5], [0x3041, 0x3094],
  [0x30A1, 0x30FA], [0x2010, 0x2027], [0x2030, 0x205E], [0x2190, 0x21FF], [0x2200, 0x22FF],
  [0x2500, 0x257F], [0x1F600, 0x1F64F], [0x1F300, 0x1F5FF], [0xFF01, 0xFF5E], [0x2000, 0x200F],
  [0x3000, 0x3000], [0xFEFF, 0xFEFF], [0x85, 0x85], [0x1680, 0x1680], [0x202F, 0x202F], [0x205F, 0x2060],
  [0x1, 0x1F], [0x7F, 0x9F], [0xFE00, 0xFE0F], [0x1D400, 0x1D433], [0xE000, 0xE0FF], [0xFDD0, 0xFDEF],
  [0xFFFE, 0xFFFF], [0x10FFFE, 0x10FFFF], [0xE0020, 0xE007F], [0x2160, 0x2188], [0xB2, 0xB3], [0xBC, 0xBE],
  [0x1E00, 0x1EFF], [0x530, 0x58F], [0x10A0, 0x10FF], [0x0E81, 0x0E82], [0x1200, 0x1248], [0x13A0, 0x13F4],
  [0x0A05, 0x0A0A], [0x0B85, 0x0B8A], [0x0C05, 0x0C0C], [0xFB00, 0xFB06], [0xFB1D, 0xFB4F],
];

const HAND = [
  "Hello world! It's a test: we're testing, aren't we? I'm sure they'll say \"yes\"; you'd agree.",
  "SHOUTING IT'S LOUD, rock'n'roll, ''double'' 'single' and o'clock's. IT'S, WE'RE, THEY'LL, I'D, YOU'VE.",
  "",
  "Numbers: 0 7 42 1,234,567.89 3.14159 2nd 100% $5.99 1e-9 0x1F 10:30pm 2023-01-15 ½ ² ٣٤ Ⅻ 1000000000000.",
  "1234567890123456789012345678901234567890 99999 000 0.000001 -17 +3 1/2 3×4 10^9 ∞",
  "Multiple   spaces,\ttabs\t\there,  trailing spaces   ",
  " leading space and   ",
  " ",
  "  ",
  "\t\t",
  "          ten spaces then text",
  "a\r",
  "\r",
  "windows line\r",
  "Café naïve – “quotes” ‘single’ — façade, résumé, Ångström, Zürich, São Paulo, Dvořák, Łódź, ŒUVRE, İstanbul.",
  "Ελληνικά: Σίσυφος ΟΔΥΣΣΕΥΣ. Русский текст: Привет, мир! Українська: Ґанок, їжак. Български: Здравей.",
  "中文字符测试。日本語のテキスト、カタカナ、ひらがな。한국어 텍스트입니다. 漢字かな交じり文。",
  "العربية: مرحبا بالعالم، كيف حالك؟ ١٢٣٤٥ עברית: שלום עולם, מה שלומך? ",
  "हिन्दी: नमस्ते दुनिया। मराठी: नमस्कार. বাংলা: হ্যালো বিশ্ব। ਪੰਜਾਬੀ: ਸਤ ਸ੍ਰੀ ਅਕਾਲ। தமிழ்: வணக்கம். తెలుగు: నమస్కారం.",
  "ไทย: สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ. ລາວ: ສະບາຍດີ. ខ្មែរ: សួស្តី. မြန်မာ: မင်္ဂလာပါ.",
  "Georgian: გამარჯობა. Armenian: Բարեւ. Amharic: ሰላም. Cherokee: ᏣᎳᎩ. Mongolian: ᠮᠣᠩᠭᠣᠯ. Tibetan: བོད་ཡིག.",
  "Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷 🇯🇵 ❤️ 🏳️‍🌈 👩🏾‍💻 🧑‍🤝‍🧑 ✌🏻 #️⃣ 1️⃣ and symbols © ® ™ € £ ¥ → ∑ ∞ ≠ ≤ ﬁ ﬂ.",
  "Combining: e\u0301t\u00e9 a\u0308 o\u0302\u0323 (decomposed), \u0301 leading mark, Z\u0351\u0352\u0353a\u0354\u0355lgo, ﾊﾝｶｸ ｶﾀｶﾅ, ｆｕｌｌｗｉｄｔｈ.",
  "NBSP:\u00a0here, zero-width\u200bspace, joiner\u200d\u200c, ideographic\u3000space, bell\u0007char, BOM\ufeffinside, NEL\u0085here.",
  "Odd: \u0000nul, \u001fus, \u007fdel, \u0080pad, \ufffdreplacement, \uffff, \ufdd0, private \ue000\uf8ff, tag \u{E0041}, \u{10FFFF}.",
  "Code: if (x != y) { return a->b[i] + 0.5f; } // comment #tag @user user@example.org https://example.org/a?b=c&d=e",
  "    def f(self, x):\n",
  "\tfor (int i = 0; i < n; i++) sum += a[i] * b[i];",
  "<s>Hello</s> <unk> <|endoftext|> <|im_start|>user<|im_end|> <|begin_of_text|>hi<|eot_id|> [CLS] <0x41>",
  "<s><s> </s>x<s> y",
  "unaffable unbelievable Supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
  "a".repeat(101) + " " + "b".repeat(100) + " x",
  "!!!!!!!!!!!!??????????..........,,,,,;;;;;::::::------______======++++++",
  "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D 'x ſ K Kelvin",
  "▁ already has the metaspace ▁▁ twice ▁",
  "Ā ā Ă ă Ą ą Ć ć ÿ Ÿ ǅ ǆ ﬀ ﬃ ℃ ℉ Ω Å ㎏ ㍿ ① ⑳ ⅷ",
  "  ends with spaces and a newline   ",
  // letters and digits of Unicode 15-17 (Cyrillic, Kawi, Nag Mundari, CJK Ext. H, Garay digits):
  // cgrad's regexes take \\p{L} and \\p{N} from its own tables, of the reference's Unicode version
  "New letters: a\u1C89b \u{11F04}\u{11F05} \u{1E4D0}\u{1E4D1}x \u{31350}\u{31351} digits \u{10D40}\u{10D41}7 end",
];

function buildCorpus() {
  const rand = rng(20261128);
  const lines = [...HAND];
  // whitespace runs of every length and mix
  const ws = [' ', '\t', '\u00a0', '\u3000', '\u2003', '\r'];
  for (let i = 0; i < 40; i++) {
    let s = '';
    const n = 1 + Math.floor(rand() * 12);
    for (let k = 0; k < n; k++) s += rand() < 0.5 ? ws[Math.floor(rand() * ws.length)].repeat(1 + Math.floor(rand() * 6)) : 'w' + k;
    lines.push(s);
  }
  // random code points from the ranges above, in runs of one range or mixed
  for (let i = 0; i < 400; i++) {
    let s = '';
    const n = 1 + Math.floor(rand() * 40);
    let r = RANGES[Math.floor(rand() * RANGES.length)];
    for (let k = 0; k < n; k++) {
      if (rand() < 0.3) r = RANGES[Math.floor(rand() * RANGES.length)];
      if (rand() < 0.15) { s += ' '; continue; }
      s += String.fromCodePoint(r[0] + Math.floor(rand() * (r[1] - r[0] + 1)));
    }
    lines.push(s);
  }
  // numbers of every length
  for (let i = 0; i < 60; i++) {
    let s = '';
    const n = 1 + Math.floor(rand() * 25);
    for (let k = 0; k < n; k++) s += String(Math.floor(rand() * 10));
    lines.push(s + (rand() < 0.5 ? ' ' + (rand() * 1000).toFixed(Math.floor(rand() * 6)) : ''));
  }
  const moby = fs.readFileSync(path.join(repo, 'data', 'moby-dick.txt'), 'utf8');
  const prose = moby.slice(0, moby.lastIndexOf('\n', 30000) + 1);
  let code = '';
  for (const f of ['io/tokenizer_hf/model.c', 'cli/tokenize.c', 'setup.sh'])
    code += fs.readFileSync(path.join(repo, f), 'utf8');
  return lines.join('\n') + '\n' + prose + code;
}

function main() {
  const ref = loadReference();
  const corpus = buildCorpus();
  fs.writeFileSync(path.join(fixdir, 'hf_corpus.txt'), corpus);
  const lines = corpus.split('\n');
  for (const name of TOKENIZERS) {
    const dir = path.join(repo, 'data', name);
    const tok = ref.TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
      tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
    });
    const out = [JSON.stringify(tok.encode(corpus))];
    let trips = 0;
    for (const line of lines) {
      const raw = tok.encode(line, { add_special_tokens: false });
      const back = raw.length ? tok.decode(raw, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : '';
      const trip = back === line ? 1 : 0;
      trips += trip;
      out.push(`${trip}\t${JSON.stringify(tok.encode(line))}`);
    }
    fs.writeFileSync(path.join(fixdir, `hf_${name}.ids`), out.join('\n') + '\n');
    console.log(`${name}: ${lines.length} lines, ${trips} round-trip in the reference, whole text ${JSON.parse(out[0]).length} ids`);
  }
}

main();
