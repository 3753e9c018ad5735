/*
 * JSON in and out: the caller's variables from jansson values (strings
 * marked as user text where asked), and tojson as Hugging Face defines it,
 * json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=...): ", " and
 * ": " between items without an indent, "," and ": " with one; floats as
 * Python's repr.  A string's escapes keep the taint of the byte they stand
 * for.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_int.h"

#define JJ_JSON_DEPTH 64


jv
jj_from_json(jj_base *b, json_t *j, int tainted, int depth)
{
    jv          v;
    const char *key;
    json_t     *val;
    size_t      i;

    if (depth > JJ_JSON_DEPTH) {
        jj_fail(b, 0, "the variables nest deeper than %d", JJ_JSON_DEPTH);
    }
    switch (json_typeof(j)) {
    case JSON_OBJECT:
        v = jv_dict(b, json_object_size(j));
        json_object_foreach(j, key, val) {
            jj_dict_set(b, v.u.d, jv_str(b, key, strlen(key), tainted),
                        jj_from_json(b, val, tainted, depth + 1));
        }
        return v;
    case JSON_ARRAY:
        v = jv_list(b, json_array_size(j));
        json_array_foreach(j, i, val) {
            jj_list_push(b, v.u.l, jj_from_json(b, val, tainted, depth + 1));
        }
        return v;
    case JSON_STRING:
        return jv_str(b, json_string_value(j), json_string_length(j),
                      tainted);
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(1);
    case JSON_FALSE:
        return jv_bool(0);
    default:
        return jv_none();
    }
}


/* Python's repr(float): the shortest digits that read back the same, fixed
 * notation for exponents -4..15, else d.ddde+XX */
void
jj_format_float(char *buf, size_t n, double f)
{
    char    tmp[64], digits[32];
    int     prec, exp, nd = 0;
    char   *e;

    if (isnan(f)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, n, f < 0 ? "-inf" : "inf");
        return;
    }
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) {
            break;
        }
    }
    /* tmp: [-]d.ddde[+-]XX */
    e = strchr(tmp, 'e');
    exp = atoi(e + 1);
    for (char *p = tmp; p < e; p++) {
        if (*p >= '0' && *p <= '9') {
            digits[nd++] = *p;
        }
    }
    while (nd > 1 && digits[nd - 1] == '0') {
        nd--;
    }
    digits[nd] = 0;
    {
        char  out[64];
        int   k = 0;

        if (f < 0 || (f == 0 && signbit(f))) {
            out[k++] = '-';
        }
        if (exp >= -5 + 1 && exp < 16) {
            if (exp < 0) {
                out[k++] = '0';
                out[k++] = '.';
                for (int i = 0; i < -exp - 1; i++) {
                    out[k++] = '0';
                }
                for (int i = 0; i < nd; i++) {
                    out[k++] = digits[i];
                }
            } else {
                for (int i = 0; i <= exp; i++) {
                    out[k++] = i < nd ? digits[i] : '0';
                }
                out[k++] = '.';
                if (nd > exp + 1) {
                    for (int i = exp + 1; i < nd; i++) {
                        out[k++] = digits[i];
                    }
                } else {
                    out[k++] = '0';
                }
            }
            out[k] = 0;
        } else {
            out[k++] = digits[0];
            if (nd > 1) {
                out[k++] = '.';
                for (int i = 1; i < nd; i++) {
                    out[k++] = digits[i];
                }
            }
            snprintf(out + k, sizeof(out) - k, "e%c%02d", exp < 0 ? '-' : '+',
                     exp < 0 ? -exp : exp);
        }
        snprintf(buf, n, "%s", out);
    }
}


static void
put_json_string(jj_ctx *c, jj_sb *sb, const jj_str *s, int ascii)
{
    jj_sb_putz(&c->b, sb, "\"");
    for (size_t i = 0; i < s->len;) {
        unsigned char ch = (unsigned char) s->s[i];
        int           t = s->taint != NULL && s->taint[i];
        char          e[16];
        uint32_t      cp;
        size_t        j;

        e[0] = 0;
        switch (ch) {
        case '"': strcpy(e, "\\\""); break;
        case '\\': strcpy(e, "\\\\"); break;
        case '\n': strcpy(e, "\\n"); break;
        case '\r': strcpy(e, "\\r"); break;
        case '\t': strcpy(e, "\\t"); break;
        case '\b': strcpy(e, "\\b"); break;
        case '\f': strcpy(e, "\\f"); break;
        default:
            if (ch < 0x20) {
                snprintf(e, sizeof(e), "\\u%04x", ch);
            }
        }
        if (e[0] != 0) {
            jj_sb_put(&c->b, sb, e, strlen(e), t);
            i++;
            continue;
        }
        j = jj_utf8_next(s->s, s->len, i, &cp);
        if (ascii && cp >= 0x80) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;

                snprintf(e, sizeof(e), "\\u%04x\\u%04x", 0xd800 + (v >> 10),
                         0xdc00 + (v & 0x3ff));
            } else {
                snprintf(e, sizeof(e), "\\u%04x", cp);
            }
            jj_sb_put(&c->b, sb, e, strlen(e), t);
        } else {
            jj_sb_put_str(&c->b, sb, s, i, j - i);
        }
        i = j;
    }
    jj_sb_putz(&c->b, sb, "\"");
}


static void
newline(jj_ctx *c, jj_sb *sb, int indent, int level)
{
    jj_sb_putz(&c->b, sb, "\n");
    for (int i = 0; i < indent * level; i++) {
        jj_sb_putz(&c->b, sb, " ");
    }
}


static int
key_cmp(const void *a, const void *b)
{
    const jv *x = *(const jv *const *) a, *y = *(const jv *const *) b;
    size_t    n = x->u.s->len < y->u.s->len ? x->u.s->len : y->u.s->len;
    int       r = memcmp(x->u.s->s, y->u.s->s, n);

    return r != 0 ? r : (x->u.s->len > y->u.s->len) - (x->u.s->len
                                                        < y->u.s->len);
}


static void
json_dict(jj_ctx *c, jj_sb *sb, jv v, int indent, int sort_keys, int ascii,
          int level)
{
    size_t   n = v.u.d->n;
    jv     **keys = jj_alloc(&c->b, (n + 1) * sizeof(jv *));

    for (size_t i = 0; i < n; i++) {
        keys[i] = &v.u.d->k[i];
        if (keys[i]->t != JV_STR) {
            jj_fail(&c->b, c->line, "tojson: keys must be strings here");
        }
    }
    if (sort_keys) {
        qsort(keys, n, sizeof(jv *), key_cmp);
    }
    if (n == 0) {
        jj_sb_putz(&c->b, sb, "{}");
        return;
    }
    jj_sb_putz(&c->b, sb, "{");
    for (size_t i = 0; i < n; i++) {
        if (i > 0) {
            jj_sb_putz(&c->b, sb, indent >= 0 ? "," : ", ");
        }
        if (indent >= 0) {
            newline(c, sb, indent, level + 1);
        }
        put_json_string(c, sb, keys[i]->u.s, ascii);
        jj_sb_putz(&c->b, sb, ": ");
        jj_tojson(c, sb, v.u.d->v[keys[i] - v.u.d->k], indent, sort_keys,
                  ascii, level + 1);
    }
    if (indent >= 0) {
        newline(c, sb, indent, level);
    }
    jj_sb_putz(&c->b, sb, "}");
}


/* indent < 0: none */
void
jj_tojson(jj_ctx *c, jj_sb *sb, jv v, int indent, int sort_keys, int ascii,
          int level)
{
    char buf[64];

    jj_step(c);
    if (level > JJ_JSON_DEPTH || c->depth + level > c->max_depth) {
        jj_fail(&c->b, c->line, "tojson: the value nests too deep");
    }
    switch (v.t) {
    case JV_NONE:
        jj_sb_putz(&c->b, sb, "null");
        return;
    case JV_BOOL:
        jj_sb_putz(&c->b, sb, v.u.b ? "true" : "false");
        return;
    case JV_INT:
    case JV_FLOAT:
        if (v.t == JV_FLOAT && isnan(v.u.f)) {
            jj_sb_putz(&c->b, sb, "NaN");
        } else if (v.t == JV_FLOAT && isinf(v.u.f)) {
            jj_sb_putz(&c->b, sb, v.u.f < 0 ? "-Infinity" : "Infinity");
        } else {
            jv_print(c, sb, v);
        }
        return;
    case JV_STR:
        put_json_string(c, sb, v.u.s, ascii);
        return;
    case JV_LIST:
        if (v.tuple >= 2) {
            jj_fail(&c->b, c->line, "Object of type %s is not JSON "
                    "serializable", jv_type_name(v));
        }
        if (v.u.l->n == 0) {
            jj_sb_putz(&c->b, sb, "[]");
            return;
        }
        jj_sb_putz(&c->b, sb, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i > 0) {
                jj_sb_putz(&c->b, sb, indent >= 0 ? "," : ", ");
            }
            if (indent >= 0) {
                newline(c, sb, indent, level + 1);
            }
            jj_tojson(c, sb, v.u.l->v[i], indent, sort_keys, ascii,
                      level + 1);
        }
        if (indent >= 0) {
            newline(c, sb, indent, level);
        }
        jj_sb_putz(&c->b, sb, "]");
        return;
    case JV_DICT:
        json_dict(c, sb, v, indent, sort_keys, ascii, level);
        return;
    default:
        snprintf(buf, sizeof(buf), "%s", jv_type_name(v));
        if (v.t == JV_UNDEF) {
            jj_not_undef(c, v, c->line);
        }
        jj_fail(&c->b, c->line, "Object of type %s is not JSON serializable",
                buf);
    }
}
