/*
 * tokenizer.json (+ tokenizer_config.json) -> GGUF tokenizer.* keys; see
 * vocab_hf.h for what is written and why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "vocab_hf.h"

/* token types, llama.cpp numbering */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4,
       TT_UNUSED = 5, TT_BYTE = 6 };

#define MAX_TOKENS 4000000

typedef struct {
    const char *path;
    json_t     *tj;        /* tokenizer.json */
    json_t     *cfg;       /* tokenizer_config.json, or NULL */
    json_t     *model;     /* tj.model */
    json_t     *vocab;     /* model.vocab: piece -> id */
    json_t     *merges;    /* model.merges: "l r" or [l, r] */
    int         spm;       /* 1: BPE over "▁" with byte fallback */
    int         space_prefix; /* spm: the normalizer prepends "▁" */
    const char *pre;       /* gpt2: tokenizer.ggml.pre */
    int         n;         /* tokens */
    char      **tok;       /* (n) owned strings */
    int32_t    *type;      /* (n) TT_* */
    float      *score;     /* (n) spm only */
} hf_vocab;


/* The text of a token given as "text" or {"content": "text", ...}. */
static const char *
token_text(const json_t *v)
{
    if (json_is_string(v)) {
        return json_string_value(v);
    }
    if (json_is_object(v)) {
        return json_string_value(json_object_get(v, "content"));
    }
    return NULL;
}


/* Does any node of the tree have "type": type (and, when key is given,
 * key's string value equal to val)? */
static const json_t *
find_type(const json_t *j, const char *type, const char *key,
          const char *val)
{
    const char   *k;
    const json_t *v, *r;
    size_t        i;

    if (json_is_object(j)) {
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t != NULL && strcmp(t, type) == 0) {
            const json_t *kv = key ? json_object_get(j, key) : NULL;
            const char   *s = json_string_value(kv);
            if (key == NULL || (s != NULL && strcmp(s, val) == 0)
                || (json_is_object(kv)
                    && (s = json_string_value(json_object_get(kv, "String")))
                       != NULL && strcmp(s, val) == 0))
            {
                return j;
            }
        }
        json_object_foreach((json_t *) j, k, v) {
            if ((r = find_type(v, type, key, val)) != NULL) {
                return r;
            }
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) {
            if ((r = find_type(v, type, key, val)) != NULL) {
                return r;
            }
        }
    }
    return NULL;
}


/* The Split regexes of the pre-tokenizer, in order, one per line. */
static void
split_regexes(const json_t *j, char *buf, size_t cap, size_t *len)
{
    const char   *k;
    const json_t *v;
    size_t        i;

    if (json_is_object(j)) {
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t != NULL && strcmp(t, "Split") == 0) {
            const char *rx = json_string_value(
                json_object_get(json_object_get(j, "pattern"), "Regex"));
            if (rx != NULL && *len + strlen(rx) + 2 < cap) {
                *len += (size_t) snprintf(buf + *len, cap - *len, "%s\n", rx);
            }
            return;
        }
        json_object_foreach((json_t *) j, k, v) {
            split_regexes(v, buf, cap, len);
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) {
            split_regexes(v, buf, cap, len);
        }
    }
}


/*
 * Which of our pre-tokenizers the regexes are (llama.cpp's names).  Each
 * is recognised by the alternative that tells it apart: Llama 3 takes
 * digits three at a time, Qwen2 one at a time, DeepSeek V3 first splits
 * off digits and CJK with regexes of their own.
 */
static const char *
pre_name(const json_t *pre)
{
    static const char llama3[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+\n";
    static const char qwen2[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
        "\\s+(?!\\S)|\\s+\n";
    static const char dsv3[] =
        "\\p{N}{1,3}\n"
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f"
        "\xe3\x82\xa0-\xe3\x83\xbf]+\n"
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
        "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
        "\\s*[\r\n]+|\\s+(?!\\S)|\\s+\n";

    char   buf[4096];
    size_t len = 0;
    const json_t *bl;

    buf[0] = '\0';
    split_regexes(pre, buf, sizeof(buf), &len);
    if (strcmp(buf, llama3) == 0) {
        return "llama-bpe";
    }
    if (strcmp(buf, qwen2) == 0) {
        return "qwen2";
    }
    if (strcmp(buf, dsv3) == 0) {
        return "deepseek-v3";
    }
    bl = find_type(pre, "ByteLevel", NULL, NULL);
    if (len == 0 && bl != NULL
        && json_is_true(json_object_get(bl, "use_regex")))
    {
        return "gpt2";
    }
    return NULL;
}


static int
load(hf_vocab *v, nalar_err *err)
{
    json_error_t je;
    char        *cfg_path, *slash;
    const char  *mt;
    FILE        *fp;

    v->tj = json_load_file(v->path, 0, &je);
    if (v->tj == NULL) {
        return nalar_fail(err, "%s:%d: %s", v->path, je.line, je.text);
    }
    /* tokenizer_config.json beside it, when there is one */
    cfg_path = malloc(strlen(v->path) + 32);
    if (cfg_path == NULL) {
        return nalar_fail(err, "%s: out of memory", v->path);
    }
    strcpy(cfg_path, v->path);
    slash = strrchr(cfg_path, '/');
    strcpy(slash ? slash + 1 : cfg_path, "tokenizer_config.json");
    fp = fopen(cfg_path, "r");
    if (fp != NULL) {
        fclose(fp);
        /* (its model_max_length may not fit an integer) */
        v->cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je);
        if (v->cfg == NULL) {
            nalar_fail(err, "%s:%d: %s", cfg_path, je.line, je.text);
            free(cfg_path);
            return -1;
        }
    }
    free(cfg_path);

    v->model = json_object_get(v->tj, "model");
    mt = json_string_value(json_object_get(v->model, "type"));
    v->vocab = json_object_get(v->model, "vocab");
    v->merges = json_object_get(v->model, "merges");
    if (mt == NULL || strcmp(mt, "BPE") != 0 || !json_is_object(v->vocab)
        || !json_is_array(v->merges))
    {
        return nalar_fail(err, "%s: only BPE models (a vocab object and a "
                          "merges array) are converted", v->path);
    }
    return 0;
}


/* Which tokenizer this is: byte-level BPE or BPE over "▁" (SPM-like). */
static int
classify(hf_vocab *v, nalar_err *err)
{
    const json_t *norm = json_object_get(v->tj, "normalizer");
    const json_t *pre = json_object_get(v->tj, "pre_tokenizer");
    const json_t *n;

    if (json_is_true(json_object_get(v->model, "byte_fallback"))
        && find_type(norm, "Replace", "pattern", " ") != NULL)
    {
        v->spm = 1;
        v->space_prefix = find_type(norm, "Prepend", NULL, NULL) != NULL;
        return 0;
    }
    v->pre = pre_name(pre);
    if (v->pre == NULL) {
        char *s = json_dumps(pre, JSON_COMPACT);
        nalar_fail(err, "%s: pre-tokenizer not recognised (known: Llama 3, "
                   "Qwen2, DeepSeek V3, GPT-2 byte level): %.300s", v->path,
                   s ? s : "?");
        free(s);
        return -1;
    }
    /* the normalizer: none, or NFC, which the qwen2 pre-tokenizer does
       (a Sequence of none or one is that one) */
    n = json_object_get(norm, "normalizers");
    if (json_is_array(n) && json_array_size(n) <= 1) {
        norm = json_array_get(n, 0);
    }
    if (json_is_object(norm)) {
        const char *t = json_string_value(json_object_get(norm, "type"));
        if (t == NULL || strcmp(t, "NFC") != 0
            || strcmp(v->pre, "qwen2") != 0)
        {
            return nalar_fail(err, "%s: normalizer %s with pre-tokenizer %s "
                              "is not supported (NFC goes with qwen2)",
                              v->path, t ? t : "?", v->pre);
        }
    } else if (strcmp(v->pre, "qwen2") == 0) {
        return nalar_fail(err, "%s: a qwen2 pre-tokenizer without the NFC "
                          "normalizer is not supported", v->path);
    }
    return 0;
}


/* llama.cpp's convert_hf_to_gguf.py does_token_look_special() */
static int
looks_special(const char *s)
{
    size_t n = strlen(s);

#define ENDS(x) (n >= sizeof(x) - 1 && strcmp(s + n - (sizeof(x) - 1), x) == 0)
#define STARTS(x) (strncmp(s, x, sizeof(x) - 1) == 0)
    return strcmp(s, "<pad>") == 0 || strcmp(s, "<mask>") == 0
           || strcmp(s, "<2mass>") == 0 || strcmp(s, "[@BOS@]") == 0
           || (STARTS("<|") && ENDS("|>"))
           || (STARTS("<\xef\xbd\x9c") && ENDS("\xef\xbd\x9c>"))
           || (STARTS("<unused") && ENDS(">"));
#undef ENDS
#undef STARTS
}


/* "▁" -> " " (llama.cpp stores user-defined pieces pre-normalized) */
static char *
unspace(const char *s)
{
    char  *r = malloc(strlen(s) + 1), *o = r;

    if (r == NULL) {
        return NULL;
    }
    while (*s) {
        if (memcmp(s, "\xe2\x96\x81", 3) == 0) {
            *o++ = ' ';
            s += 3;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    return r;
}


static int
is_byte_piece(const char *s)
{
    return strlen(s) == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>'
           && strchr("0123456789ABCDEF", s[3]) && strchr("0123456789ABCDEF",
                                                         s[4]);
}


/* The token list: the vocabulary, then the added tokens over it. */
static int
tokens(hf_vocab *v, nalar_err *err)
{
    const json_t *added = json_object_get(v->tj, "added_tokens");
    const char   *unk = json_string_value(json_object_get(v->model,
                                                          "unk_token"));
    const char   *k;
    json_t       *val;
    size_t        i;
    json_int_t    max = -1;

    json_object_foreach(v->vocab, k, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= MAX_TOKENS) {
            return nalar_fail(err, "%s: token '%.40s' has a bad id", v->path,
                              k);
        }
        max = id > max ? id : max;
    }
    json_array_foreach(added, i, val) {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        if (id < 0 || id >= MAX_TOKENS || token_text(val) == NULL) {
            return nalar_fail(err, "%s: added token %zu is malformed",
                              v->path, i);
        }
        max = id > max ? id : max;
    }
    if (max < 0) {
        return nalar_fail(err, "%s: no tokens", v->path);
    }
    v->n = (int) max + 1;
    v->tok = calloc((size_t) v->n, sizeof(char *));
    v->type = calloc((size_t) v->n, sizeof(int32_t));
    v->score = calloc((size_t) v->n, sizeof(float));
    if (!v->tok || !v->type || !v->score) {
        return nalar_fail(err, "%s: out of memory", v->path);
    }
    json_object_foreach(v->vocab, k, val) {
        json_int_t id = json_integer_value(val);
        free(v->tok[id]);
        v->tok[id] = strdup(k);
        v->type[id] = v->spm && is_byte_piece(k) ? TT_BYTE
                      : unk != NULL && strcmp(k, unk) == 0 ? TT_UNKNOWN
                      : TT_NORMAL;
    }
    json_array_foreach(added, i, val) {
        json_int_t  id = json_integer_value(json_object_get(val, "id"));
        const char *s = token_text(val);
        int         ctl = json_is_true(json_object_get(val, "special"))
                          || looks_special(s);

        free(v->tok[id]);
        v->tok[id] = ctl ? strdup(s) : unspace(s);
        /* the model's unk_token is unknown wherever it is listed (an
         * added token only, too: never a type of 0) */
        v->type[id] = unk != NULL && strcmp(s, unk) == 0 ? TT_UNKNOWN
                      : ctl ? TT_CONTROL : TT_USER_DEFINED;
    }
    for (int id = 0; id < v->n; id++) {
        if (v->tok[id] == NULL && v->type[id] == 0) {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%d]", id);
            v->tok[id] = strdup(pad);
            v->type[id] = TT_UNUSED;
        }
        if (v->tok[id] == NULL) {
            return nalar_fail(err, "%s: out of memory", v->path);
        }
    }
    return 0;
}


/* Merge i as "left right" (malloc'd), or NULL. */
static char *
merge_str(const json_t *m)
{
    const char *l, *r;
    char       *s;

    if (json_is_string(m)) {
        return strdup(json_string_value(m));
    }
    l = json_string_value(json_array_get(m, 0));
    r = json_string_value(json_array_get(m, 1));
    if (l == NULL || r == NULL) {
        return NULL;
    }
    s = malloc(strlen(l) + strlen(r) + 2);
    if (s != NULL) {
        sprintf(s, "%s %s", l, r);
    }
    return s;
}


/*
 * SentencePiece scores equal to the merge order: a piece scores minus the
 * rank of the first merge that makes it (the merge loop takes the highest
 * score, as BPE takes the lowest rank); a piece no merge makes scores
 * below them all.
 */
static int
spm_scores(hf_vocab *v, nalar_err *err)
{
    size_t  nm = json_array_size(v->merges), i;
    char   *done = calloc((size_t) v->n, 1);

    if (done == NULL) {
        return nalar_fail(err, "%s: out of memory", v->path);
    }
    for (i = 0; i < nm; i++) {
        char         *s = merge_str(json_array_get(v->merges, i)), *sp;
        const json_t *id;

        /* "l r" with l not empty (the space at 0 would be l's own) */
        if (s == NULL || s[0] == '\0' || (sp = strchr(s + 1, ' ')) == NULL)
        {
            free(s);
            continue;
        }
        memmove(sp, sp + 1, strlen(sp + 1) + 1);
        id = json_object_get(v->vocab, s);
        free(s);
        if (json_is_integer(id) && !done[json_integer_value(id)]) {
            done[json_integer_value(id)] = 1;
            v->score[json_integer_value(id)] = -(float) i;
        }
    }
    for (int id = 0; id < v->n; id++) {
        if (!done[id]) {
            v->score[id] = -(float) (nm + 1);
        }
    }
    free(done);
    return 0;
}


static int
write_merges(gguf_writer *w, hf_vocab *v, nalar_err *err)
{
    size_t  nm = json_array_size(v->merges), i;
    char  **m = calloc(nm ? nm : 1, sizeof(char *));
    int     rc = 0;

    if (m == NULL) {
        return nalar_fail(err, "%s: out of memory", v->path);
    }
    for (i = 0; i < nm && rc == 0; i++) {
        m[i] = merge_str(json_array_get(v->merges, i));
        if (m[i] == NULL) {
            rc = nalar_fail(err, "%s: merge %zu is malformed", v->path, i);
        }
    }
    if (rc == 0) {
        gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char **) m, nm);
    }
    for (i = 0; i < nm; i++) {
        free(m[i]);
    }
    free(m);
    return rc;
}


static int32_t
id_of(const hf_vocab *v, const char *s)
{
    for (int id = 0; s != NULL && id < v->n; id++) {
        if (strcmp(v->tok[id], s) == 0) {
            return id;
        }
    }
    return -1;
}


/* Does the post-processor put a special token before the text? */
static int
post_adds_bos(const json_t *j)
{
    const char   *k;
    const json_t *v, *single;
    size_t        i;

    if (json_is_object(j)) {
        single = json_object_get(j, "single");
        if (json_is_array(single)) {
            return json_object_get(json_array_get(single, 0), "SpecialToken")
                   != NULL;
        }
        json_object_foreach((json_t *) j, k, v) {
            if (post_adds_bos(v)) {
                return 1;
            }
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v) {
            if (post_adds_bos(v)) {
                return 1;
            }
        }
    }
    return 0;
}


/* BOS, EOS, UNK, padding, add_bos_token and the chat template. */
static void
write_config(gguf_writer *w, const hf_vocab *v, int skip_template)
{
    const json_t *c = v->cfg, *ab, *tmpl, *e;
    int32_t       id;
    size_t        i;

    static const char *keys[][2] = {
        { "bos_token", "tokenizer.ggml.bos_token_id" },
        { "eos_token", "tokenizer.ggml.eos_token_id" },
        { "unk_token", "tokenizer.ggml.unknown_token_id" },
        { "pad_token", "tokenizer.ggml.padding_token_id" },
    };

    for (i = 0; c != NULL && i < sizeof(keys) / sizeof(keys[0]); i++) {
        if ((id = id_of(v, token_text(json_object_get(c, keys[i][0])))) >= 0) {
            gguf_w_u32(w, keys[i][1], (uint32_t) id);
        }
    }
    ab = c ? json_object_get(c, "add_bos_token") : NULL;
    gguf_w_bool(w, "tokenizer.ggml.add_bos_token",
                json_is_boolean(ab) ? json_is_true(ab)
                : post_adds_bos(json_object_get(v->tj, "post_processor")));
    if (v->spm) {
        gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", v->space_prefix);
    }
    tmpl = c ? json_object_get(c, "chat_template") : NULL;
    if (json_is_array(tmpl)) {
        /* [{"name": ..., "template": ...}]: the default one */
        json_array_foreach(json_object_get(c, "chat_template"), i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (nm != NULL && strcmp(nm, "default") == 0) {
                tmpl = json_object_get(e, "template");
            }
        }
    }
    if (!skip_template && json_is_string(tmpl)) {
        gguf_w_str(w, "tokenizer.chat_template", json_string_value(tmpl));
    }
}


int
nalar_vocab_hf_write(gguf_writer *w, const char *tokenizer_json,
                     int skip_template, int *n_vocab, nalar_err *err)
{
    hf_vocab v;
    int      rc = -1;

    memset(&v, 0, sizeof(v));
    v.path = tokenizer_json;
    if (load(&v, err) != 0 || classify(&v, err) != 0 || tokens(&v, err) != 0
        || (v.spm && spm_scores(&v, err) != 0))
    {
        goto done;
    }
    gguf_w_str(w, "tokenizer.ggml.model", v.spm ? "llama" : "gpt2");
    if (!v.spm) {
        gguf_w_str(w, "tokenizer.ggml.pre", v.pre);
    }
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char **) v.tok,
                   (size_t) v.n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.type, (size_t) v.n);
    if (v.spm) {
        gguf_w_arr_f32(w, "tokenizer.ggml.scores", v.score, (size_t) v.n);
    } else if (write_merges(w, &v, err) != 0) {
        goto done;
    }
    write_config(w, &v, skip_template);
    *n_vocab = v.n;
    rc = 0;
done:
    for (int i = 0; v.tok != NULL && i < v.n; i++) {
        free(v.tok[i]);
    }
    free(v.tok);
    free(v.type);
    free(v.score);
    json_decref(v.tj);
    json_decref(v.cfg);
    return rc;
}
