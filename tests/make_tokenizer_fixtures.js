// SPDX-License-Identifier: MIT
// Reference data for the tokenizer tests, run by tests/make_tokenizer_fixtures.py (or alone):
//   node tests/make_tokenizer_fixtures.js fixtures   GPT-2 ids from gpt-3-encoder's encode()
//   node tests/make_tokenizer_fixtures.js tables     io/tokenizer_unicode.c and io/tokenizer_casefold.c from Node's Unicode data
// Needs network access to the npm registry (fixtures) and ./setup.sh's data/ (the Moby Dick prefix).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const crypto = require('crypto');
const { execFileSync } = require('child_process');

const repo = path.resolve(__dirname, '..');
const fixdir = path.join(__dirname, 'fixtures', 'tokenizer');

// The sample both reference tokenizers see: contractions, numbers, punctuation, runs of spaces
// and blank lines, accents (precomposed and combining), curly quotes, dashes, Greek, Cyrillic,
// CJK, Hangul, emoji with skin tones, ZWJ sequences and flags, a control character, NBSP, a
// zero-width space, and a word over WordPiece's 100-character limit.
const SAMPLE = [
  "Hello world! It's a test: we're testing GPT-2's tokenizer, aren't we? I'm sure they'll say \"yes\"; you'd agree.",
  "SHOUTING IT'S LOUD, rock'n'roll, ''double'' 'single' and o'clock's.",
  "",
  "Numbers: 0 7 42 1,234,567.89 3.14159 2nd 100% $5.99 1e-9 0x1F 10:30pm 2023-01-15 ½ ² ٣٤ Ⅻ 1000000000000.",
  "Multiple   spaces,\ttabs\t\there,  trailing spaces   ",
  " leading space and   ",
  " ",
  "  ",
  " blank lines with spaces.",
  "",
  "",
  "Café naïve – “quotes” ‘single’ — façade, résumé, Ångström, Zürich, São Paulo, Dvořák, Łódź, ŒUVRE, İstanbul.",
  "Ελληνικά: Σίσυφος. Русский текст: Привет, мир! 中文字符测试。日本語のテキスト、カタカナ。한국어 텍스트.",
  "Emoji: 😀 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ and symbols © ® ™ € £ ¥ → ∑ ∞ ≠ ≤ ﬁ.",
  "Combining: e\u0301t\u00e9 a\u0308 (decomposed), NBSP:\u00a0here, zero-width\u200bspace, ideographic\u3000space, bell\u0007char.",
  "Code: if (x != y) { return a->b[i] + 0.5f; } // comment #tag @user user@example.com https://example.com/a?b=c&d=e",
  "unaffable unbelievable Supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
  "a".repeat(101) + " " + "b".repeat(100) + " x",
  "  ends with spaces and a newline   ",
  "",
].join("\n");

const MOBY_PREFIX = 30000; // bytes of data/moby-dick.txt, cut back to the last newline

const GPT3_ENCODER = { spec: 'gpt-3-encoder@1.1.4',
  sha256: '099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c' };

function sha256(buf) { return crypto.createHash('sha256').update(buf).digest('hex'); }

// npm-packs the pinned gpt-3-encoder into a temporary folder and loads its encode().
function loadEncoder() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cg-gpt3enc-'));
  process.on('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  execFileSync('npm', ['pack', GPT3_ENCODER.spec, '--loglevel=error'], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] });
  const tgz = fs.readdirSync(dir).find(f => f.endsWith('.tgz'));
  const got = sha256(fs.readFileSync(path.join(dir, tgz)));
  if (got !== GPT3_ENCODER.sha256) throw new Error(`${GPT3_ENCODER.spec}: sha256 ${got}, expected ${GPT3_ENCODER.sha256}`);
  execFileSync('tar', ['xzf', tgz], { cwd: dir });
  return { enc: require(path.join(dir, 'package', 'Encoder.js')), dir: path.join(dir, 'package') };
}

// A second encoder written from GPT-2's encoder.py, keying merges by "a b" (gpt-3-encoder keys
// them by "a,b", which can collide for tokens containing commas): both must agree on the
// fixtures, so a fixture never records an artefact of either.
function referenceEncoder(dir) {
  const encoder = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const lines = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n');
  const ranks = new Map();
  lines.slice(1, lines.length - 1).forEach((l, i) => ranks.set(l, i));
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const byteChar = {};
  bs.forEach(b => { byteChar[b] = String.fromCharCode(b); });
  let n = 0;
  for (let b = 0; b < 256; b++) if (!(b in byteChar)) byteChar[b] = String.fromCharCode(256 + n++);
  const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
  return text => {
    const ids = [];
    for (const m of text.matchAll(pat)) {
      let word = Array.from(Buffer.from(m[0], 'utf8')).map(b => byteChar[b]);
      for (;;) {
        let best = -1, bestRank = Infinity;
        for (let i = 0; i + 1 < word.length; i++) {
          const r = ranks.get(word[i] + ' ' + word[i + 1]);
          if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
        }
        if (best < 0) break;
        const a = word[best], b = word[best + 1], merged = [];
        for (let i = 0; i < word.length;) {
          if (i + 1 < word.length && word[i] === a && word[i + 1] === b) { merged.push(a + b); i += 2; }
          else merged.push(word[i++]);
        }
        word = merged;
      }
      for (const t of word) ids.push(encoder[t]);
    }
    return ids;
  };
}

// Deterministic random strings for the pre-tokenizer's corner cases: contractions and lone
// apostrophes, space runs of every kind before letters, numbers and punctuation, line ends,
// letters and numbers of many scripts, combining marks, emoji, and any code point except U+0085
// and U+FEFF (where JavaScript's \s and Unicode White_Space, which GPT-2's regex module uses,
// differ).
function randomTexts(count, seed) {
  let x = seed >>> 0;
  const rnd = () => { // mulberry32
    x = (x + 0x6d2b79f5) >>> 0;
    let t = x;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const pick = a => a[Math.floor(rnd() * a.length)];
  const range = (lo, hi) => String.fromCodePoint(lo + Math.floor(rnd() * (hi - lo + 1)));
  const frags = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "''", "'x", ' ', '  ', '   ', '\n',
    '\n\n', ' \n', '\t', '\r\n', '\u00a0', '\u3000', '\u2028', '\u2003', ' 12', '3.5', '٣', '½', 'Ⅻ'];
  const out = [];
  for (let i = 0; i < count; i++) {
    const n = Math.floor(rnd() * 30);
    let s = '';
    for (let k = 0; k < n; k++) {
      const u = rnd();
      if (u < 0.25) s += pick(frags);
      else if (u < 0.55) s += range(0x20, 0x7e);
      else if (u < 0.62) s += range(0xa0, 0x24f);
      else if (u < 0.66) s += range(0x300, 0x36f);
      else if (u < 0.72) s += range(0x370, 0x52f);
      else if (u < 0.76) s += range(0x600, 0x6ff);
      else if (u < 0.80) s += range(0x4e00, 0x9fff);
      else if (u < 0.84) s += range(0x3000, 0x30ff);
      else if (u < 0.88) s += range(0x1f300, 0x1faff);
      else if (u < 0.92) s += range(0x2000, 0x2bff);
      else {
        let cp;
        do cp = Math.floor(rnd() * 0x110000);
        while ((cp >= 0xd800 && cp <= 0xdfff) || cp === 0x85 || cp === 0xfeff);
        s += String.fromCodePoint(cp);
      }
    }
    out.push(s);
  }
  return out;
}

function writeIds(file, header, ids) {
  fs.writeFileSync(path.join(fixdir, file), `# ${header}\n${ids.join(' ')}\n`);
  console.log(`wrote tests/fixtures/tokenizer/${file} (${ids.length} ids)`);
}

function fixtures() {
  fs.mkdirSync(fixdir, { recursive: true });
  fs.writeFileSync(path.join(fixdir, 'sample.txt'), SAMPLE);
  console.log(`wrote tests/fixtures/tokenizer/sample.txt (${Buffer.byteLength(SAMPLE)} bytes)`);
  const { enc, dir } = loadEncoder();
  const ref = referenceEncoder(dir);
  const mobyPath = path.join(repo, 'data', 'moby-dick.txt');
  if (!fs.existsSync(mobyPath)) throw new Error('data/moby-dick.txt is missing: run ./setup.sh');
  const moby = fs.readFileSync(mobyPath);
  const cut = moby.lastIndexOf(0x0a, MOBY_PREFIX - 1) + 1;
  const cases = [
    ['gpt2_sample.ids', 'gpt-3-encoder@1.1.4 encode() of sample.txt', SAMPLE],
    ['gpt2_moby.ids', `gpt-3-encoder@1.1.4 encode() of the first bytes=${cut} of data/moby-dick.txt`,
     moby.subarray(0, cut).toString('utf8')],
  ];
  for (const [file, header, text] of cases) {
    const ids = enc.encode(text);
    const ids2 = ref(text);
    if (ids.join() !== ids2.join()) throw new Error(`${file}: gpt-3-encoder and the reference encoder disagree`);
    if (enc.decode(ids) !== text) throw new Error(`${file}: gpt-3-encoder does not round-trip`);
    writeIds(file, header, ids);
  }
  // One case a line: the text's UTF-8 in hex, a tab, its ids.
  let lines = '';
  for (const text of randomTexts(400, 2024)) {
    const ids = enc.encode(text);
    if (ids.join() !== ref(text).join()) throw new Error(`random text ${JSON.stringify(text)}: encoders disagree`);
    lines += Buffer.from(text, 'utf8').toString('hex') + '\t' + ids.join(' ') + '\n';
  }
  fs.writeFileSync(path.join(fixdir, 'gpt2_random.tsv'), lines);
  console.log('wrote tests/fixtures/tokenizer/gpt2_random.tsv (400 random texts)');
}

// ---- io/tokenizer_unicode.c: code point classes as sorted [lo, hi] ranges; io/tokenizer_casefold.c: BERT's folding ----
function rangesOf(re) {
  const out = [];
  let start = -1;
  for (let cp = 0; cp <= 0x110000; cp++) {
    const ok = cp <= 0x10ffff && re.test(String.fromCodePoint(cp));
    if (ok && start < 0) start = cp;
    if (!ok && start >= 0) { out.push([start, cp - 1]); start = -1; }
  }
  return out;
}

function hex(cp) { return '0x' + cp.toString(16).toUpperCase(); }

function table(name, comment, rows, width) {
  const cells = rows.map(r => `{${r.map(hex).join(', ')}}`);
  let s = `/* ${comment} */\nstatic const uint32_t ${name}[][${width}] = {\n`;
  let line = '   ';
  for (const c of cells) {
    if (line.length + c.length + 2 > 100) { s += line + '\n'; line = '   '; }
    line += ' ' + c + ',';
  }
  return s + line + '\n};\n\n';
}

function tables() {
  const classes = [
    ['cgi_uc_letter', 'Letters, \\p{L}: GPT-2\'s pre-tokenizer', /^\p{L}$/u],
    ['cgi_uc_number', 'Numbers, \\p{N}: GPT-2\'s pre-tokenizer', /^\p{N}$/u],
    ['cgi_uc_punct', 'Punctuation, \\p{P}: BERT splits words around these', /^\p{P}$/u],
    ['cgi_uc_zs', 'Space separators, Zs: BERT turns these into spaces', /^\p{Zs}$/u],
    ['cgi_uc_control', 'Controls and format characters, Cc and Cf: BERT drops these', /^[\p{Cc}\p{Cf}]$/u],
    ['cgi_uc_mn', 'Nonspacing marks, Mn: BERT drops these after NFD (accent stripping)', /^\p{Mn}$/u],
  ];
  const generated = (what) => `/* SPDX-License-Identifier: MIT */\n/* Unicode ${process.versions.unicode} ${what}, GENERATED by\n` +
    ` * "node tests/make_tokenizer_fixtures.js tables" from Node's own Unicode data: do not edit. */\n` +
    `#include <stdint.h>\n\n#include "io/tokenizer_internal.h"\n\n`;
  let src = generated('tables for the tokenizers');
  const lookups = [];
  for (const [name, comment, re] of classes) {
    const r = rangesOf(re);
    src += table(name, comment, r, 2);
    lookups.push(name);
  }
  // BERT uncased folding: lower-case, NFD, drop Mn, one code point at a time. Hangul syllables
  // (decomposed arithmetically) and Mn themselves (dropped) are left out of the table.
  const one = [], more = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if ((cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0xac00 && cp <= 0xd7a3)) continue;
    const ch = String.fromCodePoint(cp);
    if (/\p{Mn}/u.test(ch)) continue;
    const s = Array.from(ch.toLowerCase().normalize('NFD').replace(/\p{Mn}/gu, '')).map(c => c.codePointAt(0));
    if (s.length === 1 && s[0] === cp) continue;
    if (s.length === 0 || s.length > 3) throw new Error(`fold of U+${cp.toString(16)} has ${s.length} code points`);
    if (s.length === 1) one.push([cp, s[0]]);
    else more.push([cp, s[0], s[1], s.length > 2 ? s[2] : 0]);
  }
  let fold = generated('case folding for the tokenizers (BERT uncased)');
  fold += table('cgi_uc_fold1', 'Lower-case + NFD + drop Mn giving one code point: {from, to}', one, 2);
  fold += table('cgi_uc_fold3', 'The same giving two or three code points: {from, a, b, c or 0}', more, 4);
  src += `static bool in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

#define N_(t) (sizeof t / sizeof t[0])
bool cgi_uc_is_letter(uint32_t cp) { return in_ranges(cgi_uc_letter, N_(cgi_uc_letter), cp); }
bool cgi_uc_is_number(uint32_t cp) { return in_ranges(cgi_uc_number, N_(cgi_uc_number), cp); }
bool cgi_uc_is_punct(uint32_t cp) { return in_ranges(cgi_uc_punct, N_(cgi_uc_punct), cp); }
bool cgi_uc_is_zs(uint32_t cp) { return in_ranges(cgi_uc_zs, N_(cgi_uc_zs), cp); }
bool cgi_uc_is_control(uint32_t cp) { return in_ranges(cgi_uc_control, N_(cgi_uc_control), cp); }
bool cgi_uc_is_mn(uint32_t cp) { return in_ranges(cgi_uc_mn, N_(cgi_uc_mn), cp); }
size_t cgi_uc_letter_ranges(const uint32_t (**r)[2]) { *r = cgi_uc_letter; return N_(cgi_uc_letter); }
size_t cgi_uc_number_ranges(const uint32_t (**r)[2]) { *r = cgi_uc_number; return N_(cgi_uc_number); }
`;
  fold += `#define N_(t) (sizeof t / sizeof t[0])
int cgi_uc_fold(uint32_t cp, uint32_t out[3]) {
    if (cp < 0x80) {
        out[0] = cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
        return 1;
    }
    if (cp >= 0xAC00 && cp <= 0xD7A3) { /* Hangul syllable: L V (T) jamo */
        uint32_t s = cp - 0xAC00;
        out[0] = 0x1100 + s / 588;
        out[1] = 0x1161 + s % 588 / 28;
        if (s % 28 == 0) return 2;
        out[2] = 0x11A7 + s % 28;
        return 3;
    }
    if (cgi_uc_is_mn(cp)) return 0;
    size_t lo = 0, hi = N_(cgi_uc_fold1);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cgi_uc_fold1[mid][0] == cp) { out[0] = cgi_uc_fold1[mid][1]; return 1; }
        if (cgi_uc_fold1[mid][0] < cp) lo = mid + 1; else hi = mid;
    }
    lo = 0, hi = N_(cgi_uc_fold3);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cgi_uc_fold3[mid][0] == cp) {
            out[0] = cgi_uc_fold3[mid][1];
            out[1] = cgi_uc_fold3[mid][2];
            out[2] = cgi_uc_fold3[mid][3];
            return out[2] ? 3 : 2;
        }
        if (cgi_uc_fold3[mid][0] < cp) lo = mid + 1; else hi = mid;
    }
    out[0] = cp;
    return 1;
}
`;
  fs.writeFileSync(path.join(repo, 'io', 'tokenizer_unicode.c'), src);
  fs.writeFileSync(path.join(repo, 'io', 'tokenizer_casefold.c'), fold);
  console.log(`wrote io/tokenizer_unicode.c and io/tokenizer_casefold.c (Unicode ${process.versions.unicode}, ${one.length + more.length} fold entries)`);
}

const mode = process.argv[2] || 'fixtures';
if (mode === 'fixtures') fixtures();
else if (mode === 'tables') tables();
else { console.error('usage: node tests/make_tokenizer_fixtures.js [fixtures|tables]'); process.exit(2); }
