/*
 * Structured output, compile: bounded integers and numbers (minimum,
 * maximum, exclusive bounds) and strings with a pattern or a format
 * (through grammar_regex.c's DFA), as rules (see grammar_internal.h).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "grammar_regex.h"


/* ---- bounded integers and numbers ----
 *
 * A bounded integer is the decimal strings of the values in [lo, hi]:
 * magnitudes without a leading zero, split by digit count, and each count's
 * range split at the first digit where its ends differ (the classic
 * range-to-regex construction): a chain of rules per end, so the grammar
 * grows linearly with the number of digits.  "-0" is never produced.
 *
 * A bounded number has no exponent; its bounds are made inclusive decimal
 * ones first (see num_bound), and the fraction (at most GR_FRAC_DIGITS
 * digits) is compared digit by digit with theirs.
 */

#define GR_DEC_FRAC 400      /* a double's decimal fraction fits */

typedef struct {
    int     inf;             /* no bound on this side */
    int     neg;
    char    ip[24];          /* integer part, no leading zero ("0") */
    char    fp[GR_DEC_FRAC]; /* fraction digits, no trailing zero */
} gdec;

/* shared per range: x_any[k] matches exactly k digits */
typedef struct {
    int32_t any[21];
    int32_t frac_any;        /* gr_r_digits(GR_FRAC_DIGITS, 0): rule frac_any
                                + j allows up to GR_FRAC_DIGITS - j digits */
} gnum;


static int32_t
any_digits(gbuild *b, gnum *nc, int k)
{
    if (nc->any[0] < 0) {
        gsym s[2];

        nc->any[0] = gr_rule_new(b);
        gr_alt_add(b, nc->any[0], NULL, 0);
        s[0] = S_cls_range(b, '0', '9');
        for (int i = 1; i <= 20; i++) {
            nc->any[i] = gr_rule_new(b);
            s[1] = S_ref(nc->any[i - 1]);
            gr_alt_add(b, nc->any[i], s, 2);
        }
    }
    return nc->any[k];
}


/* a rule of one alternative: class [lo, hi] then rule `next` (or nothing
 * when next < 0) */
static void
alt_digit(gbuild *b, int32_t r, int lo, int hi, int32_t next)
{
    gsym s[2];

    s[0] = S_cls_range(b, lo, hi);
    s[1] = S_ref(next);
    gr_alt_add(b, r, s, next >= 0 ? 2 : 1);
}


/* digit strings s, |s| = |x| - pos, with s >= x[pos..] (ge) or <= (le) */
static int32_t
r_digits_cmp(gbuild *b, gnum *nc, const char *x, size_t pos, int ge)
{
    size_t  n = strlen(x);
    int32_t r, rest;
    int     d;

    if (pos == n) {
        return any_digits(b, nc, 0);
    }
    if (strspn(x + pos, ge ? "0" : "9") == n - pos) {
        return any_digits(b, nc, (int) (n - pos));
    }
    rest = r_digits_cmp(b, nc, x, pos + 1, ge);
    r = gr_rule_new(b);
    d = x[pos];
    alt_digit(b, r, d, d, rest);
    if (ge && d < '9') {
        alt_digit(b, r, d + 1, '9', any_digits(b, nc, (int) (n - pos - 1)));
    }
    if (!ge && d > '0') {
        alt_digit(b, r, '0', d - 1, any_digits(b, nc, (int) (n - pos - 1)));
    }
    return r;
}


/* digit strings of x's length between x and y (x <= y, as long) */
static int32_t
r_digits_between(gbuild *b, gnum *nc, const char *x, const char *y,
                 size_t pos)
{
    size_t  n = strlen(x);
    int32_t r;

    if (pos == n) {
        return any_digits(b, nc, 0);
    }
    r = gr_rule_new(b);
    if (x[pos] == y[pos]) {
        alt_digit(b, r, x[pos], x[pos],
                  r_digits_between(b, nc, x, y, pos + 1));
        return r;
    }
    alt_digit(b, r, x[pos], x[pos], r_digits_cmp(b, nc, x, pos + 1, 1));
    if (x[pos] + 1 <= y[pos] - 1) {
        alt_digit(b, r, x[pos] + 1, y[pos] - 1,
                  any_digits(b, nc, (int) (n - pos - 1)));
    }
    alt_digit(b, r, y[pos], y[pos], r_digits_cmp(b, nc, y, pos + 1, 0));
    return r;
}


/* the decimal strings (no leading zero) of the integers in [a, z]: an
 * alternative per digit count */
static int32_t
r_uint_range(gbuild *b, gnum *nc, uint64_t a, uint64_t z)
{
    char     xz[24];
    int32_t  r = gr_rule_new(b);
    int      la, lz;
    uint64_t p10 = 1;        /* 10^(l-1) */

    la = snprintf(xz, sizeof(xz), "%llu", (unsigned long long) a);
    lz = snprintf(xz, sizeof(xz), "%llu", (unsigned long long) z);
    for (int l = 1; l < la; l++) {
        p10 *= 10;
    }
    for (int l = la; l <= lz && !b->failed; l++, p10 *= 10) {
        char lo[24], hi[24];
        gsym s;

        snprintf(lo, sizeof(lo), "%llu",
                 (unsigned long long) (l == la ? a : p10));
        if (l == lz) {
            memcpy(hi, xz, sizeof(hi));
        } else {
            memset(hi, '9', l);
            hi[l] = '\0';
        }
        s = S_ref(r_digits_between(b, nc, lo, hi, 0));
        gr_alt_add(b, r, &s, 1);
    }
    return b->failed ? -1 : r;
}


/* the integers in [lo, hi] (lo <= hi) */
static int32_t
r_int_range(gbuild *b, int64_t lo, int64_t hi)
{
    gnum    nc;
    int32_t r = gr_rule_new(b);
    gsym    s[2];

    memset(&nc, 0xff, sizeof(nc));
    if (hi >= 0) {
        s[0] = S_ref(r_uint_range(b, &nc, lo > 0 ? (uint64_t) lo : 0,
                                  (uint64_t) hi));
        gr_alt_add(b, r, s, 1);
    }
    if (lo < 0) {
        /* magnitudes of the negative part, -0 left out */
        uint64_t mlo = hi < 0 ? (uint64_t) -(hi + 1) + 1 : 1,
                 mhi = (uint64_t) -(lo + 1) + 1;

        s[0] = S_ch(b, '-');
        s[1] = S_ref(r_uint_range(b, &nc, mlo, mhi));
        gr_alt_add(b, r, s, 2);
    }
    return b->failed ? -1 : r;
}


/* digit j of a fraction (0 past its end) */
static int
frac_digit(const char *f, size_t j)
{
    return j < strlen(f) ? f[j] : '0';
}


/*
 * Fraction digits s (positions j.. of at most GR_FRAC_DIGITS) with
 * lo[j..] <= s <= hi[j..] as decimal fractions (lo, hi NULL: no bound),
 * at least one digit when need; -2 when there is none such.
 */
static int32_t
r_frac_body(gbuild *b, gnum *nc, const char *lo, const char *hi, size_t j,
            int need)
{
    gsym    alts[4][2];
    int     na[4], n = 0, empty;
    int32_t r;

    if (lo != NULL && (j >= strlen(lo) || strspn(lo + j, "0")
                                          == strlen(lo + j)))
    {
        lo = NULL;           /* lo's rest is zero: any s is >= */
    }
    if (hi != NULL && j < GR_FRAC_DIGITS
        && strlen(hi) >= GR_FRAC_DIGITS
        && strspn(hi + j, "9") >= GR_FRAC_DIGITS - j)
    {
        hi = NULL;           /* any s of the digits left is <= */
    }
    empty = lo == NULL && !need;
    if (lo == NULL && hi == NULL) {
        if (j >= GR_FRAC_DIGITS) {
            return empty ? any_digits(b, nc, 0) : -2;
        }
        if (nc->frac_any < 0) {
            nc->frac_any = gr_r_digits(b, GR_FRAC_DIGITS, 0);
        }
        if (!need) {
            return nc->frac_any + (int32_t) j;
        }
        r = gr_rule_new(b);
        alt_digit(b, r, '0', '9', nc->frac_any + (int32_t) j + 1);
        return r;
    }
    if (j >= GR_FRAC_DIGITS) {
        return empty ? any_digits(b, nc, 0) : -2;
    }
    {
        int dl = lo ? frac_digit(lo, j) : '0', dh = hi ? frac_digit(hi, j)
                                                      : '9';
        int32_t c;

        if (lo && hi && dl == dh) {
            c = r_frac_body(b, nc, lo, hi, j + 1, 0);
            if (c != -2) {
                alts[n][0] = S_cls_range(b, dl, dl);
                alts[n][1] = S_ref(c);
                na[n++] = 2;
            }
        } else {
            int from = dl, to = dh;

            if (lo) {
                c = r_frac_body(b, nc, lo, NULL, j + 1, 0);
                if (c != -2) {
                    alts[n][0] = S_cls_range(b, dl, dl);
                    alts[n][1] = S_ref(c);
                    na[n++] = 2;
                }
                from = dl + 1;
            }
            if (hi) {
                c = r_frac_body(b, nc, NULL, hi, j + 1, 0);
                if (c != -2) {
                    alts[n][0] = S_cls_range(b, dh, dh);
                    alts[n][1] = S_ref(c);
                    na[n++] = 2;
                }
                to = dh - 1;
            }
            if (from <= to) {
                alts[n][0] = S_cls_range(b, from, to);
                alts[n][1] = S_ref(r_frac_body(b, nc, NULL, NULL, j + 1, 0));
                na[n++] = 2;
            }
        }
    }
    if (n == 0 && !empty) {
        return -2;
    }
    r = gr_rule_new(b);
    if (empty) {
        gr_alt_add(b, r, NULL, 0);
    }
    for (int i = 0; i < n; i++) {
        gr_alt_add(b, r, alts[i], na[i]);
    }
    return r;
}


/* ("." digits)? with lo <= 0.digits <= hi (NULL: no bound); -2: none */
static int32_t
r_frac(gbuild *b, gnum *nc, const char *lo, const char *hi)
{
    int32_t body = r_frac_body(b, nc, lo, hi, 0, 1), r;
    int     empty = lo == NULL || strspn(lo, "0") == strlen(lo);
    gsym    s[2];

    if (body == -2 && !empty) {
        return -2;
    }
    r = gr_rule_new(b);
    if (empty) {
        gr_alt_add(b, r, NULL, 0);
    }
    if (body != -2) {
        s[0] = S_ch(b, '.');
        s[1] = S_ref(body);
        gr_alt_add(b, r, s, 2);
    }
    return r;
}


/* adds to r the magnitudes m (no sign) with a <= m <= z (a <= z): the
 * count of alternatives added (0: none has at most 15 fraction digits) */
static int
num_magnitudes(gbuild *b, gnum *nc, int32_t r, const gdec *a,
               const gdec *z)
{
    uint64_t ai = strtoull(a->ip, NULL, 10), zi = strtoull(z->ip, NULL, 10);
    int32_t  f;
    int      n = 0;
    gsym     s[2];

    if (ai == zi) {
        f = r_frac(b, nc, a->fp, z->fp);
        if (f != -2) {
            s[0] = S_ref(gr_rule_literal(b, a->ip, strlen(a->ip)));
            s[1] = S_ref(f);
            gr_alt_add(b, r, s, 2);
            n++;
        }
        return n;
    }
    f = r_frac(b, nc, a->fp, NULL);
    if (f != -2) {
        s[0] = S_ref(gr_rule_literal(b, a->ip, strlen(a->ip)));
        s[1] = S_ref(f);
        gr_alt_add(b, r, s, 2);
        n++;
    }
    if (ai + 1 <= zi - 1) {
        s[0] = S_ref(r_uint_range(b, nc, ai + 1, zi - 1));
        s[1] = S_ref(r_frac(b, nc, NULL, NULL));
        gr_alt_add(b, r, s, 2);
        n++;
    }
    f = r_frac(b, nc, NULL, z->fp);
    if (f != -2) {
        s[0] = S_ref(gr_rule_literal(b, z->ip, strlen(z->ip)));
        s[1] = S_ref(f);
        gr_alt_add(b, r, s, 2);
        n++;
    }
    return n;
}


/* -1, 0, 1 as |x| compares with |y| (finite ones) */
static int
dec_cmp_mag(const gdec *x, const gdec *y)
{
    size_t lx = strlen(x->ip), ly = strlen(y->ip);
    int    c;

    if (lx != ly) {
        return lx < ly ? -1 : 1;
    }
    if ((c = strcmp(x->ip, y->ip)) != 0) {
        return c < 0 ? -1 : 1;
    }
    for (size_t j = 0; ; j++) {
        int dx = frac_digit(x->fp, j), dy = frac_digit(y->fp, j);

        if (dx != dy) {
            return dx < dy ? -1 : 1;
        }
        if (j >= strlen(x->fp) && j >= strlen(y->fp)) {
            return 0;
        }
    }
}


static int
dec_is_zero(const gdec *x)
{
    return strcmp(x->ip, "0") == 0 && x->fp[0] == '\0';
}


/* the numbers in [lo, hi] (inclusive decimal bounds, inf for none), no
 * exponent; -2 when there is none */
static int32_t
r_num_range(gbuild *b, const gdec *lo, const gdec *hi)
{
    static const gdec zero = { 0, 0, "0", "" },
                      tiny = { 0, 0, "0", "000000000000001" };
    gdec    maxm = { 0, 0, "999999999999999", "999999999999999" };
    gnum    nc;
    int32_t r, pos, neg;
    int     np, nn;

    memset(&nc, 0xff, sizeof(nc));
    if ((!lo->inf && strlen(lo->ip) >= 16)
        || (!hi->inf && strlen(hi->ip) >= 16))
    {
        memcpy(maxm.ip, "9999999999999999", 17);
    }
    /* x >= 0 written without a sign: [max(lo, 0), hi]; x < 0: "-" and a
     * magnitude in [max(|hi|, tiny), |lo|] (so never "-0") */
    const gdec *pa = lo->inf || lo->neg ? &zero : lo,
               *pz = hi->inf ? &maxm : hi,
               *na = hi->inf || !hi->neg ? &tiny : hi,
               *nz = lo->inf ? &maxm : lo;
    int         has_pos = (hi->inf || !hi->neg || dec_is_zero(hi))
                          && dec_cmp_mag(pa, pz) <= 0,
                has_neg;

    if (dec_cmp_mag(na, &tiny) < 0) {
        na = &tiny;
    }
    has_neg = (lo->inf || (lo->neg && !dec_is_zero(lo)))
              && dec_cmp_mag(na, nz) <= 0;
    /* a first pass counts what each side has (a side may have nothing of
     * at most 15 fraction digits; its rules then go unused), so that no
     * rule is left without an alternative */
    np = has_pos ? num_magnitudes(b, &nc, -1, pa, pz) : 0;
    nn = has_neg ? num_magnitudes(b, &nc, -1, na, nz) : 0;
    if (np + nn == 0) {
        return -2;
    }
    r = gr_rule_new(b);
    if (np) {
        pos = gr_rule_new(b);
        num_magnitudes(b, &nc, pos, pa, pz);
        gr_alt_add(b, r, (gsym[]) { S_ref(pos) }, 1);
    }
    if (nn) {
        neg = gr_rule_new(b);
        num_magnitudes(b, &nc, neg, na, nz);
        gr_alt_add(b, r, (gsym[]) { S_ch(b, '-'), S_ref(neg) }, 2);
    }
    return b->failed ? -1 : r;
}


/* x as a decimal: exact for integers, else the shortest decimal that reads
 * back as x */
static void
dec_of_double(double x, gdec *d)
{
    char buf[64], m[32];
    int  e, nm = 0, p;

    memset(d, 0, sizeof(*d));
    d->neg = x < 0;
    if (x < 0) {
        x = -x;
    }
    if (x == floor(x) && x < 1e18) {
        snprintf(d->ip, sizeof(d->ip), "%.0f", x);
        return;
    }
    for (p = 1; p <= 17; p++) {
        snprintf(buf, sizeof(buf), "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) {
            break;
        }
    }
    /* d[.ddd]e[+-]XX */
    for (char *c = buf; *c && *c != 'e'; c++) {
        if (*c >= '0' && *c <= '9') {
            m[nm++] = *c;
        }
    }
    m[nm] = '\0';
    e = atoi(strchr(buf, 'e') + 1);
    if (e >= 0) {
        for (int i = 0; i <= e && i < 23; i++) {
            d->ip[i] = i < nm ? m[i] : '0';
        }
        if (e + 1 < nm) {
            snprintf(d->fp, sizeof(d->fp), "%s", m + e + 1);
        }
    } else {
        int z = -e - 1;

        d->ip[0] = '0';
        if (z + nm < GR_DEC_FRAC) {
            memset(d->fp, '0', z);
            memcpy(d->fp + z, m, nm + 1);
        }
    }
    for (size_t n = strlen(d->fp); n > 0 && d->fp[n - 1] == '0'; n--) {
        d->fp[n - 1] = '\0';
    }
}


/*
 * One bound of a number (lower when lower) from minimum/maximum and
 * exclusiveMinimum/exclusiveMaximum (a number, or draft 4's boolean), as an
 * inclusive decimal: an exclusive bound x becomes the shortest decimal of
 * the next double past x, so that every number the grammar produces reads
 * back (as Python or JavaScript read JSON) as one past x.  Refuses bounds
 * beyond 2^53, where doubles skip integers.
 */
static int
num_bound(gbuild *b, json_t *sc, int lower, int integer, gdec *d,
          int64_t *iv, const char *path)
{
    const char *kin = lower ? "minimum" : "maximum",
               *kex = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    json_t     *in = json_object_get(sc, kin), *ex = json_object_get(sc, kex),
               *v;
    int         excl = 0;
    double      x;

    d->inf = 1;
    if (ex != NULL && json_is_boolean(ex)) {
        excl = json_is_true(ex);
        ex = NULL;
    }
    if (in != NULL && !json_is_number(in)) {
        return gr_bfail(b, "'%s' at %s must be a number", kin, path);
    }
    if (ex != NULL && !json_is_number(ex)) {
        return gr_bfail(b, "'%s' at %s must be a number", kex, path);
    }
    /* both: the tighter one */
    v = in;
    if (ex != NULL) {
        if (in == NULL || (lower ? json_number_value(ex)
                                   >= json_number_value(in)
                                 : json_number_value(ex)
                                   <= json_number_value(in)))
        {
            v = ex;
            excl = 1;
        }
    }
    if (v == NULL) {
        return 0;
    }
    d->inf = 0;
    if (integer) {
        /* the closest integer inside */
        if (json_is_integer(v)) {
            int64_t n = json_integer_value(v);

            if (excl && (lower ? n == INT64_MAX : n == INT64_MIN)) {
                return gr_bfail(b, "no integer satisfies '%s' at %s", kex,
                                path);
            }
            *iv = excl ? (lower ? n + 1 : n - 1) : n;
            return 0;
        }
        x = json_real_value(v);
        x = lower ? (excl ? floor(x) + 1 : ceil(x))
                  : (excl ? ceil(x) - 1 : floor(x));
        if (x >= 9223372036854775808.0) {
            if (lower) {
                return gr_bfail(b, "no int64 satisfies '%s' at %s", kin, path);
            }
            *iv = INT64_MAX;
        } else if (x < -9223372036854775808.0) {
            if (!lower) {
                return gr_bfail(b, "no int64 satisfies '%s' at %s", kin, path);
            }
            *iv = INT64_MIN;
        } else {
            *iv = (int64_t) x;
        }
        return 0;
    }
    if (json_is_integer(v)) {
        int64_t n = json_integer_value(v);

        if (n > (1LL << 53) || n < -(1LL << 53)) {
            return gr_bfail(b, "'%s' at %s is beyond 2^53 (not supported for "
                            "numbers)", excl ? kex : kin, path);
        }
        x = (double) n;
    } else {
        x = json_real_value(v);
    }
    if (!isfinite(x) || fabs(x) > 9007199254740992.0) {
        return gr_bfail(b, "'%s' at %s is beyond 2^53 (not supported for "
                        "numbers)", excl ? kex : kin, path);
    }
    if (excl) {
        x = nextafter(x, lower ? INFINITY : -INFINITY);
    }
    dec_of_double(x, d);
    return 0;
}


/* the bounded integer or number rule of sc, or -2 when sc has no bound */
int32_t
gr_compile_bounds(gbuild *b, json_t *sc, int integer, const char *path)
{
    gdec    lo, hi;
    int64_t ilo = 0, ihi = 0;
    int32_t r;

    if (num_bound(b, sc, 1, integer, &lo, &ilo, path) < 0
        || num_bound(b, sc, 0, integer, &hi, &ihi, path) < 0)
    {
        return -1;
    }
    if (lo.inf && hi.inf) {
        return -2;
    }
    if (integer) {
        /* an open side: 15 digits, as unbounded integers, or the int64
         * limit past the other bound */
        const int64_t m15 = 999999999999999LL;

        if (lo.inf) {
            ilo = ihi < -m15 ? INT64_MIN : -m15;
        }
        if (hi.inf) {
            ihi = ilo > m15 ? INT64_MAX : m15;
        }
        if (ilo > ihi) {
            return gr_bfail(b, "no integer satisfies the bounds at %s%s", path,
                            "");
        }
        return r_int_range(b, ilo, ihi);
    }
    if (!lo.inf && !hi.inf
        && ((lo.neg && !hi.neg) ? 0
            : (!lo.neg && hi.neg) ? !(dec_is_zero(&lo) && dec_is_zero(&hi))
            : lo.neg ? dec_cmp_mag(&lo, &hi) < 0 : dec_cmp_mag(&lo, &hi) > 0))
    {
        return gr_bfail(b, "no number satisfies the bounds at %s%s", path, "");
    }
    r = r_num_range(b, &lo, &hi);
    if (r == -2) {
        return gr_bfail(b, "no number of at most 15 fraction digits satisfies "
                        "the bounds at %s%s", path, "");
    }
    return r;
}


#define GR_MAX_PRODUCT 200000    /* pattern states x lengths */

/*
 * A string whose content (between the quotes) the DFA accepts, of min..max
 * characters (max < 0: no limit): a rule per live (DFA state, characters
 * so far) pair, an alternative per successor (the bytes that lead there,
 * then its rule), and "" where the DFA accepts with at least min.  A byte
 * out of a state between two characters starts one; with no max, counts
 * stop at min.  Pairs that cannot reach acceptance within max are left
 * out, so no walk ends in a dead end.
 */
static int32_t
r_dfa_string(gbuild *b, const gr_dfa *d, int64_t min, int64_t max,
             const char *path)
{
    int64_t  K = max >= 0 ? max : min, P = (int64_t) d->n * (K + 1), E = 0;
    int32_t *tn = calloc(d->n + 1, sizeof(int32_t)), *tl = NULL, *tc = NULL;
    int32_t *id = NULL, *rhead = NULL, *rnext = NULL, *rfrom = NULL, *work;
    int32_t  nt = 0, r = -1, nid = 0;
    int64_t  nw = 0;
    uint8_t *live = NULL;
    gsym     s[3];

    if (P > GR_MAX_PRODUCT) {
        free(tn);
        return gr_bfail(b, "'pattern' or 'format' with these lengths is too "
                        "large at %s%s", path, "");
    }
    /* each state's successors and the class of bytes to each */
    tl = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    tc = malloc((int64_t) d->n * 256 * sizeof(int32_t));
    if (tn == NULL || tl == NULL || tc == NULL) {
        goto oom;
    }
    for (int32_t q = 0; q < d->n && !b->failed; q++) {
        const int32_t *nx = d->next + (int64_t) q * 256;
        uint8_t        done[256];

        tn[q] = nt;
        memset(done, 0, sizeof(done));
        for (int c = 0; c < 256; c++) {
            uint32_t set[8] = {0};

            if (nx[c] < 0 || done[c]) {
                continue;
            }
            for (int k = c; k < 256; k++) {
                if (nx[k] == nx[c]) {
                    set[k >> 5] |= 1u << (k & 31);
                    done[k] = 1;
                }
            }
            tl[nt] = nx[c];
            tc[nt++] = gr_cls_new(b, set);
        }
    }
    tn[d->n] = nt;
    /* the pairs that reach acceptance: backwards from the accepting ones */
#define PAIR(q, k) ((int64_t) (q) * (K + 1) + (k))
#define NEXT_K(q, k) (d->mid[q] ? (k) : max < 0 && (k) == K ? (k) : (k) + 1)
    live = calloc(P, 1);
    id = malloc(P * sizeof(int32_t));
    rhead = malloc(P * sizeof(int32_t));
    rnext = malloc((int64_t) nt * (K + 1) * sizeof(int32_t));
    rfrom = malloc((int64_t) nt * (K + 1) * sizeof(int32_t));
    if (!live || !id || !rhead || !rnext || !rfrom) {
        goto oom;
    }
    work = id;               /* a worklist first, the rule ids after */
    for (int64_t p = 0; p < P; p++) {
        rhead[p] = -1;
    }
    for (int32_t q = 0; q < d->n; q++) {
        for (int64_t k = 0; k <= K; k++) {
            int64_t k2 = NEXT_K(q, k);

            for (int32_t t = tn[q]; t < tn[q + 1] && k2 <= K; t++) {
                int64_t to = PAIR(tl[t], k2);

                rfrom[E] = (int32_t) PAIR(q, k);
                rnext[E] = rhead[to];
                rhead[to] = (int32_t) E++;
            }
            if (d->accept[q] && k >= min) {
                live[PAIR(q, k)] = 1;
                work[nw++] = (int32_t) PAIR(q, k);
            }
        }
    }
    while (nw > 0) {
        int32_t p = work[--nw];

        for (int32_t e = rhead[p]; e >= 0; e = rnext[e]) {
            if (!live[rfrom[e]]) {
                live[rfrom[e]] = 1;
                work[nw++] = rfrom[e];
            }
        }
    }
    if (!live[PAIR(0, 0)]) {
        r = gr_bfail(b, "no string of the lengths allowed matches 'pattern' or "
                     "'format' at %s%s", path, "");
        goto done;
    }
    /* a rule per live pair */
    for (int64_t p = 0; p < P; p++) {
        id[p] = live[p] ? gr_rule_new(b) : -1;
        nid += live[p];
    }
    for (int32_t q = 0; q < d->n && !b->failed; q++) {
        for (int64_t k = 0; k <= K; k++) {
            int64_t k2 = NEXT_K(q, k);

            if (!live[PAIR(q, k)]) {
                continue;
            }
            if (d->accept[q] && k >= min) {
                gr_alt_add(b, id[PAIR(q, k)], NULL, 0);
            }
            for (int32_t t = tn[q]; t < tn[q + 1] && k2 <= K; t++) {
                if (live[PAIR(tl[t], k2)]) {
                    s[0] = (gsym) { SYM_CLASS, tc[t] };
                    s[1] = S_ref(id[PAIR(tl[t], k2)]);
                    gr_alt_add(b, id[PAIR(q, k)], s, 2);
                }
            }
        }
    }
#undef PAIR
#undef NEXT_K
    r = gr_rule_new(b);
    s[0] = S_ch(b, '"');
    s[1] = S_ref(id[0]);
    s[2] = s[0];
    gr_alt_add(b, r, s, 3);
    r = b->failed ? -1 : r;
    goto done;
oom:
    r = gr_bfail(b, "out of memory%s%s", "", "");
done:
    free(tn); free(tl); free(tc); free(live); free(id); free(rhead);
    free(rnext); free(rfrom);
    return r;
}


/* formats JSON Schema defines that are not supported: refused, since a
 * validator may assert them; any other format is an annotation */
static const char *const gr_formats_refused[] = {
    "duration", "idn-email", "hostname", "idn-hostname", "uri-reference",
    "iri", "iri-reference", "uri-template", "json-pointer",
    "relative-json-pointer", "regex", NULL
};


/* a string with pattern or format (or -2 when it has neither) */
int32_t
gr_compile_string_pattern(gbuild *b, json_t *sc, const char *path)
{
    json_t     *pat = json_object_get(sc, "pattern"),
               *fmt = json_object_get(sc, "format");
    const char *p = NULL;
    size_t      plen = 0;
    gr_dfa      d;
    char        msg[200];
    int32_t     r;
    int64_t     min = 0, max = -1;

    if (pat != NULL && !json_is_string(pat)) {
        return gr_bfail(b, "'pattern' at %s%s must be a string", path, "");
    }
    if (fmt != NULL && !json_is_string(fmt)) {
        return gr_bfail(b, "'format' at %s%s must be a string", path, "");
    }
    if (fmt != NULL) {
        const char *f = json_string_value(fmt);

        for (int i = 0; gr_formats_refused[i]; i++) {
            if (strcmp(f, gr_formats_refused[i]) == 0) {
                return gr_bfail(b, "unsupported format '%s' at %s (supported: "
                                "date, time, date-time, email, uri, ipv4, "
                                "ipv6, uuid)", f, path);
            }
        }
        p = gr_format_pattern(f);
        if (p == NULL) {
            fmt = NULL;      /* an annotation */
        } else {
            plen = strlen(p);
        }
    }
    if (pat == NULL && fmt == NULL) {
        return -2;
    }
    if (pat != NULL && fmt != NULL) {
        return gr_bfail(b, "'pattern' with 'format' at %s%s is not supported",
                        path, "");
    }
    if (gr_get_count(b, sc, "minLength", &min, path) < 0
        || gr_get_count(b, sc, "maxLength", &max, path) < 0)
    {
        return -1;
    }
    if (max >= 0 && max < min) {
        return gr_bfail(b, "maxLength < minLength at %s%s", path, "");
    }
    if (pat != NULL) {
        p = json_string_value(pat);
        plen = json_string_length(pat);
    }
    if (gr_regex_dfa(p, plen, &d, msg, sizeof(msg)) < 0) {
        return gr_bfail(b, "%s at %s", msg, path);
    }
    r = r_dfa_string(b, &d, min, max, path);
    gr_dfa_free(&d);
    return r;
}
