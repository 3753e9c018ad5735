/*
 * Unicode classes, NFC and the BPE pre-tokenizers: the text is cut into
 * words by the regexes llama.cpp lists for each tokenizer.ggml.pre, each
 * written out by hand over code point classes.
 */
#include <limits.h>

#include <utf8proc.h>

#include "tokenizer_internal.h"

static int
is_unicode_space(uint32_t cp)
{
    /* Unicode White_Space, which is what \s means in these regexes */
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* The classes of a code point from its general category (utf8proc's
 * tables, Unicode 15 with Debian's libutf8proc 2.8). */
static int
unicode_class(uint32_t cp)
{
    int f = C_VALID;

    if (is_unicode_space(cp)) f |= C_SPACE;
    switch (utf8proc_category((utf8proc_int32_t) cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LT:
        return f | C_LETTER | C_UP;
    case UTF8PROC_CATEGORY_LL:
        return f | C_LETTER | C_LO;
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return f | C_LETTER | C_UP | C_LO;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
        return f | C_NUMBER;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
        return f | C_UP | C_LO;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
        return f | C_PUNCT;
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK: case UTF8PROC_CATEGORY_SO:
        return f | C_SYMBOL;
    default:
        return f;
    }
}

/* ---------------------------------------------------------------------- */
/* BPE pre-tokenizers: cut code points cp[0..n) into words, writing the
 * end index of each word to ends[]; return the number of words.  They
 * follow llama.cpp's hand-written versions of the regexes, including
 * their reading of \s+(?!\S). */

static int
cls_at(const uint8_t *cls, size_t n, size_t i)
{
    return i < n ? cls[i] : 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d, ASCII case-folded when `fold`; returns the
 * length matched at i (0: none) */
static size_t
match_contraction(const uint32_t *cp, size_t n, size_t i, int fold)
{
    uint32_t a, b;

    if (cp[i] != '\'' || i + 1 >= n) return 0;
    a = cp[i + 1];
    if (fold && a >= 'A' && a <= 'Z') a += 32;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (i + 2 >= n) return 0;
    b = cp[i + 2];
    if (fold && b >= 'A' && b <= 'Z') b += 32;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t
pre_gpt2(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        size_t c = match_contraction(cp, n, pos, 0), ws;
        int f2 = cp[pos] == ' ' ? cls_at(cls, n, pos + 1) : cls[pos];

        if (c > 0) {
            pos += c;
        } else if (f2 & (C_LETTER | C_NUMBER)) {
            int want = f2 & C_LETTER ? C_LETTER : C_NUMBER;
            pos += cp[pos] == ' ';
            while (cls_at(cls, n, pos) & want) pos++;
        } else if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos += cp[pos] == ' ';
            for (;;) {
                int f = cls_at(cls, n, pos);
                if (!(f & C_VALID) || (f & (C_SPACE | C_LETTER | C_NUMBER))) break;
                pos++;
            }
        } else {
            for (ws = 0; cls_at(cls, n, pos + ws) & C_SPACE; ws++) {}
            if (ws > 1 && pos + ws < n) pos += ws - 1; /* leave one for " ?x" */
            else if (ws > 0) pos += ws;
            else pos++;
        }
        ends[nw++] = pos;
    }
    return nw;
}

/* ` ?[^\s\p{L}\p{N}]+` at pos (the caller has checked that it matches),
 * then [\r\n]* (with `slash`, [\r\n/]*): the end of the match */
static size_t
punct_end(const uint32_t *cp, const uint8_t *cls, size_t n, size_t pos,
          int slash)
{
    pos += cp[pos] == ' ';
    for (;;) {
        int g = cls_at(cls, n, pos);
        if (!(g & C_VALID) || (g & (C_SPACE | C_LETTER | C_NUMBER))) break;
        pos++;
    }
    while (pos < n && (cp[pos] == '\r' || cp[pos] == '\n'
                       || (slash && cp[pos] == '/')))
        pos++;
    return pos;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at pos, or the one character there where none
 * matches: the end of the match */
static size_t
space_end(const uint32_t *cp, const uint8_t *cls, size_t n, size_t pos)
{
    size_t ws = 0, last_nl = 0;

    while (cls_at(cls, n, pos + ws) & C_SPACE) {
        if (cp[pos + ws] == '\r' || cp[pos + ws] == '\n')
            last_nl = pos + ws + 1;
        ws++;
    }
    if (last_nl > 0) return last_nl;            /* \s*[\r\n]+ */
    if (ws > 1 && pos + ws < n) return pos + ws - 1;
    if (ws > 0) return pos + ws;
    return pos + 1;
}

/* llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *         ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * qwen2: the same with \p{N} one digit at a time. */
static size_t
pre_llama3(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends,
           size_t max_digits)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        size_t c = match_contraction(cp, n, pos, 1);
        uint32_t ch = cp[pos];
        int f = cls[pos], f2;

        if (c > 0) {
            pos += c;
            ends[nw++] = pos;
            continue;
        }
        if (!(ch == '\r' || ch == '\n' || (f & C_NUMBER)) &&
            ((f & C_LETTER) || (cls_at(cls, n, pos + 1) & C_LETTER))) {
            pos++;
            while (cls_at(cls, n, pos) & C_LETTER) pos++;
            ends[nw++] = pos;
            continue;
        }
        if (f & C_NUMBER) {
            size_t start = pos;
            while ((cls_at(cls, n, pos) & C_NUMBER) && pos - start < max_digits)
                pos++;
            ends[nw++] = pos;
            continue;
        }
        f2 = ch == ' ' ? cls_at(cls, n, pos + 1) : f;
        if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos = punct_end(cp, cls, n, pos, 0);
            ends[nw++] = pos;
            continue;
        }
        pos = space_end(cp, cls, n, pos);
        ends[nw++] = pos;
    }
    return nw;
}

/* tekken (Mistral Nemo and later), the regex of its tokenizer.json:
 *   [^\r\n\p{L}\p{N}]?[UP]*[LO]+|[^\r\n\p{L}\p{N}]?[UP]+[LO]*|\p{N}|
 *    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with UP = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], LO = [\p{Ll}\p{Lm}\p{Lo}\p{M}]
 * (alternatives tried in order, each with the regex's backtracking). */

/* [UP]*[LO]+ at q: the end of the match, or q when none */
static size_t
tekken_alt1(const uint8_t *cls, size_t n, size_t q)
{
    size_t e = q, k;

    while (cls_at(cls, n, e) & C_UP) e++;
    if (cls_at(cls, n, e) & C_LO) {
        while (cls_at(cls, n, e) & C_LO) e++;
        return e;
    }
    /* give back UP characters until one of them can start [LO]+ */
    for (k = e; k > q; k--)
        if (cls[k - 1] & C_LO) return k;
    return q;
}

/* [UP]+[LO]* at q */
static size_t
tekken_alt2(const uint8_t *cls, size_t n, size_t q)
{
    size_t e = q;

    while (cls_at(cls, n, e) & C_UP) e++;
    if (e == q) return q;
    while (cls_at(cls, n, e) & C_LO) e++;
    return e;
}

static size_t
pre_tekken(const uint32_t *cp, const uint8_t *cls, size_t n, size_t *ends)
{
    size_t pos = 0, nw = 0;

    while (pos < n) {
        uint32_t ch = cp[pos];
        int f = cls[pos], f2;
        int pfx = (f & C_VALID) && ch != '\r' && ch != '\n'
                  && !(f & (C_LETTER | C_NUMBER));
        size_t e;

        if ((pfx && (e = tekken_alt1(cls, n, pos + 1)) > pos + 1)
            || (e = tekken_alt1(cls, n, pos)) > pos
            || (pfx && (e = tekken_alt2(cls, n, pos + 1)) > pos + 1)
            || (e = tekken_alt2(cls, n, pos)) > pos) {
            pos = e;
            ends[nw++] = pos;
            continue;
        }
        if (f & C_NUMBER) {
            ends[nw++] = ++pos;
            continue;
        }
        f2 = ch == ' ' ? cls_at(cls, n, pos + 1) : f;
        if ((f2 & C_VALID) && !(f2 & (C_SPACE | C_LETTER | C_NUMBER))) {
            pos = punct_end(cp, cls, n, pos, 1);
            ends[nw++] = pos;
            continue;
        }
        pos = space_end(cp, cls, n, pos);
        ends[nw++] = pos;
    }
    return nw;
}

/* The other pre-tokenizers are sequences of regexes, each splitting every
 * piece the ones before it made into its matches and the text between
 * them (HF tokenizers' Split with "isolated" behaviour; llama.cpp's
 * unicode_regex_split).  A regex is one of these: */
enum {
    RX_GPT2,        /* the GPT-2 regex above */
    RX_NEWLINE,     /* [\r\n] */
    RX_DIGIT,       /* \p{N} */
    RX_DIGITS,      /* \p{N}+ */
    RX_DIGITS3,     /* [0-9][0-9][0-9] */
    RX_FALCON_PUNCT,/* [\p{P}\$\+<=>\^~\|`]+ */
    RX_DS_LETTERS,  /* \s?[A-Za-zµÀ-ÖØ-ö...]+ (deepseek-llm's letters) */
    RX_DS_PUNCT,    /* \s?[!-/:-~！-／：-～‘-‟　-。]+ */
    RX_TRAIL_SPACE, /* \s+$ */
    RX_CJK,         /* [一-龥ࠀ-一가-퟿]+ */
    RX_LETTERS,     /* \s?\p{L}+ */
    RX_PUNCT,       /* \s?\p{P}+ */
    RX_DIGITS13,    /* \p{N}{1,3} */
    RX_CJK_KANA,    /* [一-龥぀-ゟ゠-ヿ]+ */
    RX_DSV3,        /* deepseek-v3's third regex: see dsv3_match() */
    RX_END = -1
};

static const signed char pre_regexes[][7] = {
    [PRE_STARCODER] = { RX_DIGIT, RX_GPT2, RX_END },
    [PRE_DEEPSEEK_LLM] = { RX_NEWLINE, RX_DS_LETTERS, RX_DS_PUNCT,
                           RX_TRAIL_SPACE, RX_CJK, RX_DIGITS, RX_END },
    [PRE_DEEPSEEK_CODER] = { RX_NEWLINE, RX_LETTERS, RX_PUNCT, RX_CJK,
                             RX_DIGIT, RX_END },
    [PRE_FALCON] = { RX_FALCON_PUNCT, RX_GPT2, RX_DIGITS3, RX_END },
    [PRE_DEEPSEEK_V3] = { RX_DIGITS13, RX_CJK_KANA, RX_DSV3, RX_END },
};

/* deepseek-llm's letter class, as code point ranges */
static const uint32_t ds_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6},
    {0xF8, 0x1BA}, {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF},
    {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D}, {0x37F, 0x37F},
    {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1},
    {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D},
    {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D},
    {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102},
    {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D},
    {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D},
    {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B},
    {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A},
    {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943}
};

static int
in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Does code point i belong to the class a run of regex rx repeats? */
static int
rx_class(int rx, const uint32_t *cp, const uint8_t *cls, size_t i)
{
    uint32_t c = cp[i];

    switch (rx) {
    case RX_DIGIT: case RX_DIGITS: case RX_DIGITS13:
        return (cls[i] & C_NUMBER) != 0;
    case RX_CJK_KANA:
        return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
    case RX_FALCON_PUNCT:
        return (cls[i] & C_PUNCT) || (c < 128 && c != 0
                                      && strchr("$+<=>^~|`", (int) c));
    case RX_DS_LETTERS:
        return in_ranges(c, ds_letters,
                         sizeof(ds_letters) / sizeof(ds_letters[0]));
    case RX_DS_PUNCT:
        return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x7E)
               || (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0xFF1A && c <= 0xFF5E)
               || (c >= 0x2018 && c <= 0x201F) || (c >= 0x3000 && c <= 0x3002);
    case RX_CJK:
        return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x800 && c <= 0x4E00)
               || (c >= 0xAC00 && c <= 0xD7FF);
    case RX_LETTERS:
        return (cls[i] & C_LETTER) != 0;
    case RX_PUNCT:
        return (cls[i] & C_PUNCT) != 0;
    default:
        return 0;
    }
}

static int
ascii_alpha(uint32_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* \p{L} or \p{M} (a mark is C_UP | C_LO without C_LETTER) */
static int
letter_or_mark(int f)
{
    return (f & (C_LETTER | C_UP | C_LO)) != 0;
}

/*
 * deepseek-v3's third regex (its tokenizer.json and llama.cpp agree):
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
 *   |[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *   | ?[\p{P}\p{S}]+[\r\n]*
 *   |\s*[\r\n]+|\s+(?!\S)|\s+
 * the length of its match at i (within [i, n)), 0 when none.
 */
static size_t
dsv3_match(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
    uint32_t c = cp[i];
    int      f = cls[i];
    size_t   e;

    if (c > ' ' && c < 127 && !ascii_alpha(c) && !(c >= '0' && c <= '9')
        && i + 1 < n && ascii_alpha(cp[i + 1])) {
        for (e = i + 1; e < n && ascii_alpha(cp[e]); e++) {}
        return e - i;
    }
    if (c != '\r' && c != '\n' && !(f & (C_LETTER | C_PUNCT | C_SYMBOL))
        && letter_or_mark(cls_at(cls, n, i + 1))) {
        for (e = i + 1; letter_or_mark(cls_at(cls, n, e)); e++) {}
        return e - i;
    }
    if (letter_or_mark(f)) {
        for (e = i; letter_or_mark(cls_at(cls, n, e)); e++) {}
        return e - i;
    }
    e = i + (c == ' ');
    if (cls_at(cls, n, e) & (C_PUNCT | C_SYMBOL)) {
        while (cls_at(cls, n, e) & (C_PUNCT | C_SYMBOL)) e++;
        while (e < n && (cp[e] == '\r' || cp[e] == '\n')) e++;
        return e - i;
    }
    if (f & C_SPACE) return space_end(cp, cls, n, i) - i;
    return 0;
}

/* The length of regex rx's match at i (within [i, n)), 0 when none. */
static size_t
rx_match(int rx, const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
    size_t e = i;

    switch (rx) {
    case RX_NEWLINE:
        return cp[i] == '\r' || cp[i] == '\n';
    case RX_DIGIT:
        return rx_class(rx, cp, cls, i);
    case RX_DIGITS3:
        return i + 3 <= n && cp[i] >= '0' && cp[i] <= '9'
               && cp[i + 1] >= '0' && cp[i + 1] <= '9'
               && cp[i + 2] >= '0' && cp[i + 2] <= '9' ? 3 : 0;
    case RX_DIGITS13:
        while (e < n && e - i < 3 && rx_class(rx, cp, cls, e)) e++;
        return e - i;
    case RX_DSV3:
        return dsv3_match(cp, cls, i, n);
    case RX_DS_LETTERS: case RX_DS_PUNCT: case RX_LETTERS: case RX_PUNCT:
        /* \s? then the class, greedy: the space only when a class
           character follows it */
        if ((cls[i] & C_SPACE) && i + 1 < n && rx_class(rx, cp, cls, i + 1))
            e++;
        /* fall through */
    default:
        while (e < n && rx_class(rx, cp, cls, e)) e++;
        return e - i;
    }
}

/* Splits the piece [a, b) by regex rx, appending the ends of its matches
 * and of the text between them to out; returns how many. */
static size_t
rx_split(int rx, const uint32_t *cp, const uint8_t *cls, size_t a, size_t b,
         size_t *out)
{
    size_t k = 0, gap = a, i;

    if (rx == RX_GPT2) {
        k = pre_gpt2(cp + a, cls + a, b - a, out);
        for (i = 0; i < k; i++) out[i] += a;
        return k;
    }
    if (rx == RX_TRAIL_SPACE) {
        /* one match at most: the whitespace that ends the piece */
        for (i = b; i > a && (cls[i - 1] & C_SPACE); i--) {}
        if (i > a && i < b) out[k++] = i;
        out[k++] = b;
        return k;
    }
    for (i = a; i < b; ) {
        size_t m = rx_match(rx, cp, cls, i, b);
        if (m == 0) {
            i++;
            continue;
        }
        if (i > gap) out[k++] = i;
        i += m;
        out[k++] = gap = i;
    }
    if (gap < b) out[k++] = b;
    return k;
}

void
ntok_pretok_free(pretok *p)
{
    free(p->cp);
    free(p->cls);
    free(p->boff);
    free(p->ends);
    free(p->tmp);
}

int
ntok_pretokenize(const nalar_tokenizer *t, const char *s, size_t n,
                 pretok *p)
{
    memset(p, 0, sizeof(*p));
    p->cp = malloc((n + 1) * sizeof(uint32_t));
    p->cls = malloc(n + 1);
    p->boff = malloc((n + 1) * sizeof(size_t));
    p->ends = malloc((n + 1) * sizeof(size_t));
    p->tmp = malloc((n + 1) * sizeof(size_t));
    if (!p->cp || !p->cls || !p->boff || !p->ends || !p->tmp) {
        ntok_pretok_free(p);
        return -1;
    }
    for (size_t i = 0; i < n; ) {
        uint32_t c;
        int f = C_VALID;
        p->boff[p->ncp] = i;
        c = utf8_decode((const uint8_t *) s, n, &i);
        if (c >= 128) {
            f = unicode_class(c);
        } else if (c >= 'a' && c <= 'z') {
            f |= C_LETTER | C_LO;   /* ASCII fast path */
        } else if (c >= 'A' && c <= 'Z') {
            f |= C_LETTER | C_UP;
        } else if (c >= '0' && c <= '9') {
            f |= C_NUMBER;
        } else if ((c >= 9 && c <= 13) || c == ' ') {
            f |= C_SPACE;
        } else if (c > ' ' && c < 127) {
            /* ASCII punctuation (\p{P}) or symbols (\p{S}) */
            f |= strchr("$+<=>^`|~", (int) c) ? C_SYMBOL : C_PUNCT;
        }
        p->cp[p->ncp] = c;
        p->cls[p->ncp] = (uint8_t) f;
        p->ncp++;
    }
    p->boff[p->ncp] = n;
    switch (t->pre) {
    case PRE_LLAMA3:
        p->nw = pre_llama3(p->cp, p->cls, p->ncp, p->ends, 3);
        break;
    case PRE_QWEN2:
        p->nw = pre_llama3(p->cp, p->cls, p->ncp, p->ends, 1);
        break;
    case PRE_TEKKEN:
        p->nw = pre_tekken(p->cp, p->cls, p->ncp, p->ends);
        break;
    case PRE_GPT2:
        p->nw = pre_gpt2(p->cp, p->cls, p->ncp, p->ends);
        break;
    default:
        /* each regex splits every piece made so far */
        p->nw = 0;
        if (p->ncp > 0) p->ends[p->nw++] = p->ncp;
        for (const signed char *rx = pre_regexes[t->pre]; *rx != RX_END;
             rx++) {
            size_t *prev = p->ends, np = p->nw, a = 0;
            p->ends = p->tmp;
            p->tmp = prev;
            p->nw = 0;
            for (size_t k = 0; k < np; k++) {
                p->nw += rx_split(*rx, p->cp, p->cls, a, prev[k],
                                  p->ends + p->nw);
                a = prev[k];
            }
        }
        break;
    }
    return 0;
}

int
nalar_tok_pretokenize(const nalar_tokenizer *t, const char *text, size_t len,
                      size_t *ends, int cap)
{
    pretok p;
    int nw;

    if (t == NULL || t->kind != TOK_BPE || (text == NULL && len > 0) ||
        len > INT_MAX / 8 || ntok_pretokenize(t, text, len, &p) < 0)
        return -1;
    for (size_t k = 0; k < p.nw && k < (size_t) (cap > 0 ? cap : 0); k++)
        ends[k] = p.boff[p.ends[k]];
    nw = (int) p.nw;
    ntok_pretok_free(&p);
    return nw;
}


/* Appends s[0..n) to out at *k, growing it. */
static int
append(const char *s, size_t n, char **out, size_t *k, size_t *cap)
{
    if (*k + n > *cap) {
        size_t c = 2 * (*k + n);
        char  *o = realloc(*out, c);
        if (o == NULL) return -1;
        *out = o;
        *cap = c;
    }
    memcpy(*out + *k, s, n);
    *k += n;
    return 0;
}

/* Appends the NFC form of the valid UTF-8 s[0..n) to out at *k. */
static int
nfc_run(const char *s, size_t n, char **out, size_t *k, size_t *cap)
{
    utf8proc_uint8_t *d = NULL;
    utf8proc_ssize_t  dn;
    int               rc;

    if (n == 0) return 0;
    dn = utf8proc_map((const utf8proc_uint8_t *) s, (utf8proc_ssize_t) n, &d,
                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (dn < 0) return -1;
    rc = append((const char *) d, (size_t) dn, out, k, cap);
    free(d);
    return rc;
}

/* Appends the NFC of s[0..n), where a byte that is not UTF-8 stays as it
 * is and the valid runs between such bytes are normalized. */
static int
nfc_segment(const char *s, size_t n, char **out, size_t *k, size_t *cap)
{
    size_t a = 0, i = 0;

    while (i < n) {
        size_t i0 = i;
        uint32_t c = utf8_decode((const uint8_t *) s, n, &i);

        if (c != 0xFFFD || i - i0 == 3) continue;   /* valid: keep going */
        /* s[i0] is not UTF-8: normalize the run before it, copy it */
        if (nfc_run(s + a, i0 - a, out, k, cap) < 0
            || append(s + i0, 1, out, k, cap) < 0)
            return -1;
        a = i;
    }
    return nfc_run(s + a, n - a, out, k, cap);
}

/*
 * NFC of s[0..n) (malloc'd; its length in *out_n), as the normalizer of a
 * tokenizer.json that declares it; a byte that is not UTF-8 stays as it is
 * (the pre-tokenizer reads it as U+FFFD).  NULL when out of memory.
 *
 * The text is normalized in segments, each an ASCII character and the
 * non-ASCII bytes after it: an ASCII character never composes with what
 * comes before it and ends any run of combining marks, so the NFC of the
 * whole is the NFC of its segments, put together.  A segment below U+0300
 * (the first combining mark; every character that composes with one
 * before it, Hangul jamo included, lies above), that is with all its bytes
 * below 0xCC, is its own NFC and is copied.
 */
char *
ntok_nfc(const char *s, size_t n, size_t *out_n)
{
    size_t cap = n + 16, k = 0, i = 0;
    char  *out = malloc(cap);

    if (out == NULL) return NULL;
    while (i < n) {
        size_t a = i, b = i + ((uint8_t) s[i] < 0x80);
        int    stable = 1;

        while (b < n && (uint8_t) s[b] >= 0x80) {
            stable &= (uint8_t) s[b] < 0xCC;
            b++;
        }
        if ((stable ? append(s + a, b - a, &out, &k, &cap)
                    : nfc_segment(s + a, b - a, &out, &k, &cap)) < 0) {
            free(out);
            return NULL;
        }
        i = b;
    }
    *out_n = k;
    return out;
}
