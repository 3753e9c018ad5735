/*
 * The scan of a large completions body for a prompt of token ids (see
 * nalar_api_count_ids in api/request.h): the ids are counted from
 * the bytes, so a prompt too long for the context is refused without a
 * jansson tree of millions of numbers.  No nginx dependency, no shared
 * state: safe on any thread (it runs on the parse threads).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "request.h"


/*
 * The body scan (see nalar_api_count_ids in api/request.h): one
 * pass over the bytes, a lexer of JSON's grammar that keeps the nesting
 * as a bit per level.  It does not decode strings or check their UTF-8,
 * nor compare keys beyond "prompt": the parse of the rest of the body
 * checks all that.
 */

#define API_SCAN_DEPTH  64              /* deeper: left to the full parse */

size_t  nalar_api_count_min = NALAR_API_COUNT_MIN;


typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
} api_scan;


static void
api_scan_space(api_scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n'
                             || *s->p == '\r'))
    {
        s->p++;
    }
}


/* at '"': past the closing quote; *plain: no escape in it */

static int
api_scan_string(api_scan *s, int *plain)
{
    unsigned  i;

    *plain = 1;
    s->p++;

    while (s->p < s->end) {
        if (*s->p == '"') {
            s->p++;
            return 0;
        }

        if (*s->p < 0x20) {
            return -1;
        }

        if (*s->p++ != '\\') {
            continue;
        }

        *plain = 0;

        if (s->p == s->end) {
            return -1;
        }

        switch (*s->p++) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n':
        case 'r': case 't':
            break;

        case 'u':
            for (i = 0; i < 4; i++, s->p++) {
                if (s->p == s->end
                    || !((*s->p >= '0' && *s->p <= '9')
                         || ((*s->p | 0x20) >= 'a' && (*s->p | 0x20) <= 'f')))
                {
                    return -1;
                }
            }
            break;

        default:
            return -1;
        }
    }

    return -1;
}


static size_t
api_scan_digits(api_scan *s)
{
    const unsigned char  *start;

    start = s->p;

    while (s->p < s->end && *s->p >= '0' && *s->p <= '9') {
        s->p++;
    }

    return (size_t) (s->p - start);
}


/* a number; *integer: without fraction or exponent, and of at most 18
 * digits (json_int_t holds it) */

static int
api_scan_number(api_scan *s, int *integer)
{
    size_t  n;

    if (s->p < s->end && *s->p == '-') {
        s->p++;
    }

    if (s->p < s->end && *s->p == '0') {
        s->p++;
        n = 1;

    } else {
        n = api_scan_digits(s);

        if (n == 0) {
            return -1;
        }
    }

    *integer = (n <= 18);

    if (s->p < s->end && *s->p == '.') {
        s->p++;
        *integer = 0;

        if (api_scan_digits(s) == 0) {
            return -1;
        }
    }

    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        *integer = 0;

        if (s->p < s->end && (*s->p == '+' || *s->p == '-')) {
            s->p++;
        }

        if (api_scan_digits(s) == 0) {
            return -1;
        }
    }

    return 0;
}


/* an object's key and its colon */

static int
api_scan_key(api_scan *s, int *plain)
{
    api_scan_space(s);

    if (s->p == s->end || *s->p != '"' || api_scan_string(s, plain) != 0) {
        return -1;
    }

    api_scan_space(s);

    if (s->p == s->end || *s->p != ':') {
        return -1;
    }

    s->p++;

    return 0;
}


/* past one value, of at most API_SCAN_DEPTH levels */

static int
api_scan_skip(api_scan *s)
{
    int       plain, integer;
    size_t    n;
    unsigned  depth;
    uint64_t  objects;                  /* bit d: level d + 1 an object */
    static const char  *words[3] = { "true", "false", "null" };

    depth = 0;
    objects = 0;

    for ( ;; ) {

        /* a value */

        api_scan_space(s);

        if (s->p == s->end) {
            return -1;
        }

        if (*s->p == '{' || *s->p == '[') {
            if (depth == API_SCAN_DEPTH) {
                return -1;
            }

            objects &= ~((uint64_t) 1 << depth);
            objects |= (uint64_t) (*s->p == '{') << depth;
            depth++;
            s->p++;

            api_scan_space(s);

            if (s->p < s->end
                && *s->p == ((objects >> (depth - 1)) & 1 ? '}' : ']'))
            {
                s->p++;
                depth--;

            } else if ((objects >> (depth - 1)) & 1) {
                if (api_scan_key(s, &plain) != 0) {
                    return -1;
                }

                continue;

            } else {
                continue;
            }

        } else if (*s->p == '"') {
            if (api_scan_string(s, &plain) != 0) {
                return -1;
            }

        } else if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9')) {
            if (api_scan_number(s, &integer) != 0) {
                return -1;
            }

        } else {
            for (n = 0; n < 3; n++) {
                if (*s->p == (unsigned char) words[n][0]) {
                    break;
                }
            }

            if (n == 3
                || (size_t) (s->end - s->p) < strlen(words[n])
                || memcmp(s->p, words[n], strlen(words[n])) != 0)
            {
                return -1;
            }

            s->p += strlen(words[n]);
        }

        /* after a value: the next one, or the ends of containers */

        for ( ;; ) {
            if (depth == 0) {
                return 0;
            }

            api_scan_space(s);

            if (s->p == s->end) {
                return -1;
            }

            if (*s->p == ',') {
                s->p++;

                if (((objects >> (depth - 1)) & 1)
                    && api_scan_key(s, &plain) != 0)
                {
                    return -1;
                }

                break;
            }

            if (*s->p != ((objects >> (depth - 1)) & 1 ? '}' : ']')) {
                return -1;
            }

            s->p++;
            depth--;
        }
    }
}


/* an array of integers (of at least one), counted into *count */

static int
api_scan_int_array(api_scan *s, size_t *count)
{
    int  integer;

    if (s->p == s->end || *s->p != '[') {
        return -1;
    }

    s->p++;
    *count = 0;

    for ( ;; ) {
        api_scan_space(s);

        if (s->p == s->end || !(*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))
            || api_scan_number(s, &integer) != 0 || !integer)
        {
            return -1;
        }

        (*count)++;

        api_scan_space(s);

        if (s->p == s->end) {
            return -1;
        }

        if (*s->p == ']') {
            s->p++;
            return 0;
        }

        if (*s->p++ != ',') {
            return -1;
        }
    }
}


int
nalar_api_count_ids(const char *body, size_t len, nalar_api_ids *ids)
{
    int       plain;
    size_t    count, n;
    api_scan  s;

    s.p = (const unsigned char *) body;
    s.end = s.p + len;

    api_scan_space(&s);

    if (s.p == s.end || *s.p++ != '{') {
        return 0;
    }

    api_scan_space(&s);

    if (s.p < s.end && *s.p == '}') {
        return 0;
    }

    for ( ;; ) {
        api_scan_space(&s);

        if (s.p == s.end || *s.p != '"') {
            return 0;
        }

        ids->start = (size_t) (s.p - (const unsigned char *) body);

        if (api_scan_key(&s, &plain) != 0) {
            return 0;
        }

        if (plain && (const char *) s.p - body - ids->start >= 8
            && memcmp(body + ids->start, "\"prompt\"", 8) == 0)
        {
            break;
        }

        if (api_scan_skip(&s) != 0) {
            return 0;
        }

        api_scan_space(&s);

        if (s.p == s.end || *s.p != ',') {
            return 0;
        }

        s.p++;
    }

    /* the first "prompt": [ids], [[ids]], or [[ids], [ids], ...] */

    api_scan_space(&s);
    ids->start = (size_t) (s.p - (const unsigned char *) body);
    ids->arrays = 0;

    if (s.p == s.end || *s.p != '[') {
        return 0;
    }

    s.p++;
    api_scan_space(&s);

    if (s.p < s.end && *s.p == '[') {
        for (n = 1; /* void */; n++) {
            if (api_scan_int_array(&s, &count) != 0) {
                return 0;
            }

            api_scan_space(&s);

            if (s.p == s.end) {
                return 0;
            }

            if (*s.p == ']') {
                s.p++;
                break;
            }

            if (*s.p++ != ',') {
                return 0;
            }

            api_scan_space(&s);
        }

        /* one array is the prompt; more are its elements, none an id */

        if (n > 1) {
            count = n;
            ids->arrays = 1;
        }

    } else {
        s.p = (const unsigned char *) body + ids->start;

        if (api_scan_int_array(&s, &count) != 0) {
            return 0;
        }
    }

    ids->end = (size_t) (s.p - (const unsigned char *) body);
    ids->count = count;

    return 1;
}
