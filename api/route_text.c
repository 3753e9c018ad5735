/*
 * The leading prompt text of a completions or chat body, for the edge's
 * route key (ngx_nalar_route.c; what the text is, see
 * api/route_text.h): a scan of the body's bytes as they come, not a
 * parse, that stops once the text is complete.  No nginx dependency, no
 * shared state.
 */
#include <stdint.h>
#include <string.h>

#include "route_text.h"


#define ROUTE_SCAN_OK      0
#define ROUTE_SCAN_END     1           /* ran out of bytes */
#define ROUTE_SCAN_BAD     2

#define ROUTE_MIN(a, b)    ((a) < (b) ? (a) : (b))


typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
    unsigned char        *out;          /* the leading text */
    size_t                len;
    size_t                cap;
} nalar_route_scan;


static int route_scan_string(nalar_route_scan *s, unsigned char *dst,
    size_t *dst_len, size_t dst_cap, size_t *total);
static int route_scan_u(nalar_route_scan *s, unsigned char *utf, size_t *n);
static void route_scan_space(nalar_route_scan *s, unsigned char sep);
static int route_scan_skip(nalar_route_scan *s);
static int route_scan_prompt(nalar_route_scan *s);
static int route_scan_messages(nalar_route_scan *s);
static int route_scan_content(nalar_route_scan *s);


/*
 * The leading text of a completions or chat body (see the top of this
 * file) into out, at most cap bytes; the model, where the body names it
 * before the prompt, into model.  Returns the text's length: 0 when there
 * is none.  The text is made of what the body's first `len` bytes hold; a
 * message cut off there before its role is known is left out.
 */

size_t
nalar_route_text(const unsigned char *body, size_t len, int chat,
    unsigned char *out, size_t cap, unsigned char *model, size_t model_cap,
    size_t *model_len)
{
    int               rc;
    size_t            key_len, total;
    unsigned          found;
    unsigned char     key[16];
    nalar_route_scan  s;

    s.p = body;
    s.end = body + len;
    s.out = out;
    s.len = 0;
    s.cap = cap;

    *model_len = 0;
    found = 0;

    while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                           || *s.p == '\n'))
    {
        s.p++;
    }

    if (s.p == s.end || *s.p++ != '{') {
        return 0;
    }

    for ( ;; ) {
        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n' || *s.p == ','))
        {
            s.p++;
        }

        if (s.p == s.end || *s.p == '}') {
            break;
        }

        key_len = 0;

        if (route_scan_string(&s, key, &key_len, sizeof(key),
                                       &total)
            != ROUTE_SCAN_OK)
        {
            break;
        }

        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n'))
        {
            s.p++;
        }

        if (s.p == s.end || *s.p++ != ':') {
            break;
        }

        while (s.p < s.end && (*s.p == ' ' || *s.p == '\t' || *s.p == '\r'
                               || *s.p == '\n'))
        {
            s.p++;
        }

        if (s.p == s.end) {
            break;
        }

#define route_key_is(name)                                          \
        (total == sizeof(name) - 1                                           \
         && memcmp(key, name, sizeof(name) - 1) == 0)

        if (route_key_is("model") && *s.p == '"') {
            *model_len = 0;
            rc = route_scan_string(&s, model, model_len,
                                            model_cap,
                                            &total);

        } else if (!chat && route_key_is("prompt")) {
            (void) route_scan_prompt(&s);
            found = 1;
            break;

        } else if (chat && route_key_is("messages")) {
            (void) route_scan_messages(&s);
            found = 1;
            break;

        } else {
            rc = route_scan_skip(&s);
        }

#undef route_key_is

        if (rc != ROUTE_SCAN_OK) {
            break;
        }
    }

    return found ? s.len : 0;
}


/*
 * The \uXXXX escape after its "\u" (a surrogate pair taken whole), as
 * UTF-8 in utf (*n bytes); what is not a code point reads as U+FFFD.
 * ROUTE_SCAN_END: the text ends first.
 */

static int
route_scan_u(nalar_route_scan *s, unsigned char *utf, size_t *n)
{
    uint32_t       cp, lo;
    unsigned       k;
    unsigned char  c;

    cp = 0;

    for (k = 0; k < 4; k++) {
        if (s->p == s->end) {
            return ROUTE_SCAN_END;
        }

        c = *s->p++;
        cp <<= 4;

        if (c >= '0' && c <= '9') {
            cp |= c - '0';

        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            cp |= (c | 0x20) - 'a' + 10;

        } else {
            cp = 0xfffd;
            break;
        }
    }

    if (cp >= 0xd800 && cp < 0xdc00) {
        /* a high surrogate: its low half follows */

        if (s->end - s->p < 6) {
            return ROUTE_SCAN_END;
        }

        lo = 0;

        if (s->p[0] == '\\' && s->p[1] == 'u') {
            for (k = 2; k < 6; k++) {
                c = s->p[k];
                lo <<= 4;

                if (c >= '0' && c <= '9') {
                    lo |= c - '0';

                } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
                    lo |= (c | 0x20) - 'a' + 10;

                } else {
                    lo = 0;
                    break;
                }
            }
        }

        if (lo >= 0xdc00 && lo < 0xe000) {
            s->p += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);

        } else {
            cp = 0xfffd;
        }

    } else if (cp >= 0xdc00 && cp < 0xe000) {
        cp = 0xfffd;
    }

    if (cp < 0x80) {
        utf[0] = (unsigned char) cp;
        *n = 1;

    } else if (cp < 0x800) {
        utf[0] = (unsigned char) (0xc0 | (cp >> 6));
        utf[1] = (unsigned char) (0x80 | (cp & 0x3f));
        *n = 2;

    } else if (cp < 0x10000) {
        utf[0] = (unsigned char) (0xe0 | (cp >> 12));
        utf[1] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
        utf[2] = (unsigned char) (0x80 | (cp & 0x3f));
        *n = 3;

    } else {
        utf[0] = (unsigned char) (0xf0 | (cp >> 18));
        utf[1] = (unsigned char) (0x80 | ((cp >> 12) & 0x3f));
        utf[2] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
        utf[3] = (unsigned char) (0x80 | (cp & 0x3f));
        *n = 4;
    }

    return ROUTE_SCAN_OK;
}


/*
 * A JSON string at s->p, decoded into dst (at most dst_cap bytes; dst may
 * be NULL); *total: its whole decoded length.  Invalid escapes and lone
 * surrogates decode as U+FFFD: the text only needs to be the same for the
 * same bytes.
 */

static int
route_scan_string(nalar_route_scan *s, unsigned char *dst,
    size_t *dst_len, size_t dst_cap, size_t *total)
{
    size_t          n, i;
    unsigned char   c, utf[4];

    *total = 0;

    if (s->p == s->end) {
        return ROUTE_SCAN_END;
    }

    if (*s->p != '"') {
        return ROUTE_SCAN_BAD;
    }

    s->p++;

    while (s->p < s->end) {
        c = *s->p++;

        if (c == '"') {
            return ROUTE_SCAN_OK;
        }

        n = 1;
        utf[0] = c;

        if (c == '\\') {
            if (s->p == s->end) {
                return ROUTE_SCAN_END;
            }

            c = *s->p++;

            switch (c) {
            case 'b': utf[0] = '\b'; break;
            case 'f': utf[0] = '\f'; break;
            case 'n': utf[0] = '\n'; break;
            case 'r': utf[0] = '\r'; break;
            case 't': utf[0] = '\t'; break;

            case 'u':
                if (route_scan_u(s, utf, &n) != ROUTE_SCAN_OK) {
                    return ROUTE_SCAN_END;
                }

                break;

            default:
                /* \" \\ \/ and anything else as itself */
                utf[0] = c;
            }
        }

        *total += n;

        if (dst == NULL) {
            continue;
        }

        for (i = 0; i < n && *dst_len < dst_cap; i++) {
            dst[(*dst_len)++] = utf[i];
        }
    }

    return ROUTE_SCAN_END;
}


/* Past JSON whitespace, and sep where it stands among it (' ': none). */

static void
route_scan_space(nalar_route_scan *s, unsigned char sep)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t'
                             || *s->p == '\r' || *s->p == '\n'
                             || *s->p == sep))
    {
        s->p++;
    }
}


/* Any JSON value at s->p, without looking into it. */

static int
route_scan_skip(nalar_route_scan *s)
{
    int                   rc;
    size_t                total;
    unsigned              depth;
    unsigned char         c;
    const unsigned char  *start;

    depth = 0;
    start = s->p;

    while (s->p < s->end) {
        c = *s->p;

        switch (c) {

        case '"':
            rc = route_scan_string(s, NULL, NULL, 0, &total);
            if (rc != ROUTE_SCAN_OK) {
                return rc;
            }

            break;

        case '{':
        case '[':
            depth++;
            s->p++;
            break;

        case '}':
        case ']':
            if (depth == 0) {
                /* the end of the container this value is in; no value
                 * at all is an error (the caller's loop must move on) */
                return s->p == start ? ROUTE_SCAN_BAD : ROUTE_SCAN_OK;
            }

            depth--;
            s->p++;
            break;

        case ',':
            if (depth == 0) {
                return s->p == start ? ROUTE_SCAN_BAD : ROUTE_SCAN_OK;
            }

            s->p++;
            break;

        default:
            s->p++;
        }

        if (depth == 0 && (c == '"' || c == '}' || c == ']')) {
            return ROUTE_SCAN_OK;
        }
    }

    return ROUTE_SCAN_END;
}


static void
route_scan_append(nalar_route_scan *s, const unsigned char *data,
    size_t n)
{
    n = ROUTE_MIN(n, s->cap - s->len);
    memcpy(s->out + s->len, data, n);
    s->len += n;
}


/*
 * "prompt": a string, a batch's first string, or token ids (the first
 * list of a batch) as their decimal text.
 */

static int
route_scan_prompt(nalar_route_scan *s)
{
    size_t    total;
    unsigned  depth;

    depth = 0;

    for ( ;; ) {
        route_scan_space(s, ' ');

        if (s->p == s->end) {
            return ROUTE_SCAN_END;
        }

        if (*s->p == '"') {
            return route_scan_string(s, s->out, &s->len, s->cap,
                                              &total);
        }

        if (*s->p != '[' || depth == 2) {
            break;
        }

        s->p++;
        depth++;
    }

    if (depth == 0) {
        return ROUTE_SCAN_BAD;
    }

    /* ids: digits, commas and blanks, copied without the blanks */

    while (s->p < s->end && *s->p != ']' && s->len < s->cap) {
        if ((*s->p >= '0' && *s->p <= '9') || *s->p == ',' || *s->p == '-') {
            route_scan_append(s, s->p, 1);

        } else if (*s->p != ' ' && *s->p != '\t' && *s->p != '\r'
                   && *s->p != '\n')
        {
            return ROUTE_SCAN_BAD;
        }

        s->p++;
    }

    return s->p < s->end ? ROUTE_SCAN_OK : ROUTE_SCAN_END;
}


/*
 * "messages": each message as 0x1e, then its fields in body order, the
 * role as ROLE 0x1f and the content as its text; the leading system or
 * developer messages, or the first message where the first is neither.
 */

static int
route_scan_messages(nalar_route_scan *s)
{
    int             rc;
    size_t          mark, role_len, total;
    unsigned        i, known, system, first_system;
    unsigned char   role[16], key[16];

    if (s->p == s->end) {
        return ROUTE_SCAN_END;
    }

    if (*s->p++ != '[') {
        return ROUTE_SCAN_BAD;
    }

    first_system = 0;

    for (i = 0; /* void */; i++) {

        route_scan_space(s, ',');

        if (s->p == s->end) {
            return ROUTE_SCAN_END;
        }

        if (*s->p == ']' || s->len == s->cap) {
            return ROUTE_SCAN_OK;
        }

        if (*s->p++ != '{') {
            return ROUTE_SCAN_BAD;
        }

        mark = s->len;
        known = 0;
        system = 0;

        route_scan_append(s, (unsigned char *) "\x1e", 1);

        for ( ;; ) {
            route_scan_space(s, ',');

            if (s->p == s->end) {
                rc = ROUTE_SCAN_END;
                goto cut;
            }

            if (*s->p == '}') {
                s->p++;
                break;
            }

            role_len = 0;
            rc = route_scan_string(s, key, &role_len, sizeof(key),
                                            &total);
            if (rc != ROUTE_SCAN_OK) {
                goto cut;
            }

            route_scan_space(s, ':');

            if (total == 4 && memcmp(key, "role", 4) == 0
                && s->p < s->end && *s->p == '"')
            {
                role_len = 0;
                rc = route_scan_string(s, role, &role_len,
                                                sizeof(role), &total);
                if (rc != ROUTE_SCAN_OK) {
                    goto cut;
                }

                known = 1;
                system = (total == 6
                          && memcmp(role, "system", 6) == 0)
                         || (total == 9
                             && memcmp(role, "developer", 9) == 0);

                if (i > 0 && !(first_system && system)) {
                    /* the leading text ends before this message */
                    s->len = mark;
                    return ROUTE_SCAN_OK;
                }

                route_scan_append(s, role, role_len);
                route_scan_append(s, (unsigned char *) "\x1f", 1);

            } else if (total == 7 && memcmp(key, "content", 7) == 0) {
                rc = route_scan_content(s);

            } else {
                rc = route_scan_skip(s);
            }

            if (rc != ROUTE_SCAN_OK) {
                goto cut;
            }
        }

        if (i == 0) {
            first_system = known && system;

            if (!first_system) {
                return ROUTE_SCAN_OK;
            }

        } else if (!known) {
            s->len = mark;
            return ROUTE_SCAN_OK;
        }
    }

cut:

    /* a message whose role is unknown joins the leading text only as
     * the first */

    if (i > 0 && !known) {
        s->len = mark;
    }

    return rc;
}


/* A message's content: a string, or the "text" of each of its parts. */

static int
route_scan_content(nalar_route_scan *s)
{
    int             rc;
    size_t          key_len, total;
    unsigned char   key[8];

    if (s->p == s->end) {
        return ROUTE_SCAN_END;
    }

    if (*s->p == '"') {
        return route_scan_string(s, s->out, &s->len, s->cap, &total);
    }

    if (*s->p != '[') {
        return route_scan_skip(s);
    }

    s->p++;

    for ( ;; ) {
        route_scan_space(s, ',');

        if (s->p == s->end) {
            return ROUTE_SCAN_END;
        }

        if (*s->p == ']') {
            s->p++;
            return ROUTE_SCAN_OK;
        }

        if (*s->p != '{') {
            rc = route_scan_skip(s);
            if (rc != ROUTE_SCAN_OK) {
                return rc;
            }

            continue;
        }

        s->p++;

        for ( ;; ) {
            route_scan_space(s, ',');

            if (s->p == s->end) {
                return ROUTE_SCAN_END;
            }

            if (*s->p == '}') {
                s->p++;
                break;
            }

            key_len = 0;
            rc = route_scan_string(s, key, &key_len, sizeof(key),
                                            &total);
            if (rc != ROUTE_SCAN_OK) {
                return rc;
            }

            route_scan_space(s, ':');

            if (total == 4 && memcmp(key, "text", 4) == 0
                && s->p < s->end && *s->p == '"')
            {
                rc = route_scan_string(s, s->out, &s->len, s->cap,
                                                &total);
            } else {
                rc = route_scan_skip(s);
            }

            if (rc != ROUTE_SCAN_OK) {
                return rc;
            }
        }
    }
}
