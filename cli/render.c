/*
 * nalar render [-m MODEL] [--template FILE] --messages FILE.json
 *              [--tools FILE.json] [--kwargs JSON] [--bos TEXT] [--eos TEXT]
 *              [--now SECONDS] [--no-generation-prompt] [--openai]
 *              [--spans | --ids]
 *
 * The template is FILE, else the model's tokenizer.chat_template; bos_token
 * and eos_token are --bos/--eos, else the model's BOS and EOS tokens' text
 * (else "").
 *
 * Renders a Jinja chat template as Hugging Face's apply_chat_template does
 * (api/jinja.h) and prints the prompt exactly, or with --spans one JSON
 * object {"text": ..., "user_spans": [[offset, length], ...]} giving the
 * byte spans that came from the request (messages, tools, kwargs), or with
 * --ids (which needs -m) the prompt's token ids as the module tokenizes it:
 * the whole text as one, no BOS added (the template writes its own, as
 * Hugging Face and vLLM tokenize a chat), control tokens recognised only
 * outside the user spans; one JSON object {"ids": [...], "count": N}.
 * --openai makes the variables as the module does of a chat request: a
 * content array's text parts joined with "\n", a tool call's arguments
 * string parsed into an object (vLLM's way).  As
 * transformers does, `tools` and `documents` are None when not given.  The
 * template's raise_exception, an undefined value used, or a bound passed
 * exits 1 with the message; a usage error exits 2.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_template.h"
#include "gguf.h"
#include "jinja.h"
#include "tokenizer.h"
#include "opts.h"
#include "render.h"


static char *
slurp(const char *path, size_t *len)
{
    FILE   *f = fopen(path, "rb");
    char   *buf = NULL;
    size_t  cap = 0, n = 0;

    if (f == NULL) {
        return NULL;
    }
    for (;;) {
        size_t got;

        if (n + 4096 + 1 > cap) {
            char *nb;

            cap = cap ? 2 * cap : 65536;
            nb = realloc(buf, cap);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            break;
        }
    }
    fclose(f);
    buf[n] = 0;
    *len = n;
    return buf;
}


/* the text of token `key` ("tokenizer.ggml.bos_token_id"), or NULL */
static char *
token_text(const gguf_file *f, const char *key)
{
    const gguf_kv *toks = gguf_find(f, "tokenizer.ggml.tokens");
    int64_t        id = gguf_get_int(f, key, -1);
    char          *s;

    if (toks == NULL || toks->type != GGUF_T_ARRAY
        || toks->arr_strs == NULL || id < 0 || (uint64_t) id >= toks->arr_len)
    {
        return NULL;
    }
    s = malloc(toks->arr_strs[id].len + 1);
    if (s != NULL) {
        memcpy(s, toks->arr_strs[id].ptr, toks->arr_strs[id].len);
        s[toks->arr_strs[id].len] = 0;
    }
    return s;
}


/* -m MODEL: its template (unless --template) and its BOS/EOS text (unless
 * --bos/--eos); 0, or 1 after a message */
static int
from_model(const char *path, char **src, size_t *len, char **bos, char **eos)
{
    nalar_err  err;
    gguf_file *f = gguf_open(path, &err);

    if (f == NULL) {
        fprintf(stderr, "nalar render: %s\n", err.msg);
        return 1;
    }
    if (*src == NULL) {
        *src = gguf_get_str(f, "tokenizer.chat_template");
        if (*src == NULL) {
            fprintf(stderr, "nalar render: %s has no tokenizer.chat_template"
                    " (give --template FILE)\n", path);
            gguf_close(f);
            return 1;
        }
        *len = strlen(*src);
    }
    *bos = token_text(f, "tokenizer.ggml.bos_token_id");
    *eos = token_text(f, "tokenizer.ggml.eos_token_id");
    gguf_close(f);
    return 0;
}


static json_t *
load_json(const char *what, const char *path)
{
    json_error_t  je;
    json_t       *j = json_load_file(path, JSON_PRESERVE_ORDER, &je);

    if (j == NULL) {
        fprintf(stderr, "nalar render: %s %s: %s (line %d)\n", what, path,
                je.text, je.line);
    }
    return j;
}


/* --ids: the pieces (markup, user text) tokenized as the module does */
static int
print_ids(const char *model, const nalar_jinja_out *out)
{
    int32_t          n, *ids = NULL;
    int              k, more = 0;
    nalar_err        err;
    gguf_file       *f;
    nalar_tok_text  *pc;
    nalar_tokenizer *tok;

    f = gguf_open(model, &err);
    if (f == NULL) {
        fprintf(stderr, "nalar render: %s\n", err.msg);
        return 1;
    }
    tok = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    if (tok == NULL) {
        fprintf(stderr, "nalar render: %s\n", err.msg);
        return 1;
    }
    pc = nalar_chat_template_pieces(out, NULL, &n);
    k = pc != NULL ? nalar_tokenize_bounded(tok, pc, (size_t) n, 0,
                                            INT32_MAX - 1, &ids, &more)
                   : -1;
    if (k >= 0) {
        printf("{\"ids\": [");
        for (int i = 0; i < k; i++) {
            printf("%s%d", i ? ", " : "", ids[i]);
        }
        printf("], \"count\": %d}\n", k);
    } else {
        fprintf(stderr, "nalar render: out of memory\n");
    }
    free(ids);
    free(pc);
    nalar_tokenizer_destroy(tok);
    return k >= 0 ? 0 : 1;
}


static int
render(nalar_jinja_tmpl *t, json_t *user, json_t *trusted, int64_t now,
       int show_spans, const char *ids_model)
{
    nalar_jinja_limits  lim;
    nalar_jinja_out     out;
    char                err[512];
    int                 rc;

    memset(&lim, 0, sizeof(lim));
    lim.now = now;
    rc = nalar_jinja_render(t, user, trusted, &lim, &out, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "nalar render: %s%s\n",
                rc == NALAR_JINJA_RAISED ? "the template raised: " : "", err);
        return 1;
    }
    if (ids_model != NULL) {
        rc = print_ids(ids_model, &out);
    } else if (!show_spans) {
        fwrite(out.text, 1, out.len, stdout);
    } else {
        json_t *o = json_object(), *sp = json_array();
        char   *s;

        json_object_set_new(o, "text", json_stringn(out.text, out.len));
        for (size_t i = 0; i < out.n_spans; i++) {
            json_array_append_new(sp, json_pack("[II]",
                                  (json_int_t) out.spans[i].off,
                                  (json_int_t) out.spans[i].len));
        }
        json_object_set_new(o, "user_spans", sp);
        s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
        printf("%s\n", s != NULL ? s : "{}");
        free(s);
        json_decref(o);
    }
    nalar_jinja_out_free(&out);
    return rc;
}


/* --openai: the variables as the module makes them of a chat request
 * (api/chat_template.h): the messages normalised as vLLM does, the kwargs
 * beside them */
static int
openai_vars(json_t **user, json_t **trusted, int gen, const char *bos,
            const char *eos)
{
    json_t  *root, *kw, *u, *t;
    int      rc;

    root = json_pack("{sO}", "messages", json_object_get(*user, "messages"));
    kw = json_deep_copy(*user);
    if (root == NULL || kw == NULL) {
        json_decref(root);
        json_decref(kw);
        return -1;
    }
    json_object_del(kw, "messages");
    json_object_del(kw, "tools");
    json_object_del(kw, "documents");
    json_object_set_new(root, "chat_template_kwargs", kw);
    rc = nalar_chat_template_vars(root, json_is_null(json_object_get(*user,
                                  "tools")) ? NULL
                                  : json_object_get(*user, "tools"),
                                  gen, bos, eos, &u, &t);
    json_decref(root);
    if (rc != 0) {
        fprintf(stderr, "nalar render: out of memory\n");
        return -1;
    }
    json_decref(*user);
    json_decref(*trusted);
    *user = u;
    *trusted = t;
    return 0;
}


int
nalar_cmd_render(int argc, char **argv)
{
    const char        *tpath = NULL, *mpath = NULL, *tools = NULL;
    const char        *kwargs = NULL, *bos = NULL, *eos = NULL;
    const char        *model = NULL;
    char              *mbos = NULL, *meos = NULL;
    uint64_t           now = UINT64_MAX;
    int                no_gen = 0, show_spans = 0, show_ids = 0, rc = 1;
    int                openai = 0;
    char              *src = NULL;
    size_t             len = 0;
    char               err[512];
    nalar_jinja_tmpl  *t;
    json_t            *user = NULL, *trusted = NULL, *j;
    const nalar_opt    opts[] = {
        { "-m", "--model", NALAR_OPT_STR, &model, NULL, 0 },
        { "--template", NULL, NALAR_OPT_STR, &tpath, NULL, 0 },
        { "--messages", NULL, NALAR_OPT_STR, &mpath, NULL, 0 },
        { "--tools", NULL, NALAR_OPT_STR, &tools, NULL, 0 },
        { "--kwargs", NULL, NALAR_OPT_STR, &kwargs, NULL, 0 },
        { "--bos", NULL, NALAR_OPT_STR, &bos, NULL, 0 },
        { "--eos", NULL, NALAR_OPT_STR, &eos, NULL, 0 },
        { "--now", NULL, NALAR_OPT_U64, &now, NULL, 0 },
        { "--no-generation-prompt", NULL, NALAR_OPT_FLAG, &no_gen, NULL, 0 },
        { "--spans", NULL, NALAR_OPT_FLAG, &show_spans, NULL, 0 },
        { "--ids", NULL, NALAR_OPT_FLAG, &show_ids, NULL, 0 },
        { "--openai", NULL, NALAR_OPT_FLAG, &openai, NULL, 0 },
    };

    if (NALAR_OPTS_PARSE("render", argc, argv, opts) != 0) {
        return 2;
    }
    if ((tpath == NULL && model == NULL) || mpath == NULL) {
        fprintf(stderr, "nalar render: --template FILE (or -m MODEL) and "
                "--messages FILE.json are required\n");
        return 2;
    }
    if (show_ids && (model == NULL || show_spans)) {
        fprintf(stderr, "nalar render: --ids needs -m MODEL (its tokenizer)"
                " and excludes --spans\n");
        return 2;
    }
    if (tpath != NULL) {
        src = slurp(tpath, &len);
        if (src == NULL) {
            fprintf(stderr, "nalar render: cannot read %s\n", tpath);
            return 1;
        }
    }
    if (model != NULL && from_model(model, &src, &len, &mbos, &meos) != 0) {
        free(src);
        return 1;
    }
    bos = bos != NULL ? bos : mbos != NULL ? mbos : "";
    eos = eos != NULL ? eos : meos != NULL ? meos : "";
    t = nalar_jinja_compile(src, len, err, sizeof(err));
    free(src);
    if (t == NULL) {
        fprintf(stderr, "nalar render: %s: %s\n",
                tpath != NULL ? tpath : model, err);
        free(mbos);
        free(meos);
        return 1;
    }
    user = json_object();
    trusted = json_pack("{sbssss}", "add_generation_prompt", !no_gen,
                        "bos_token", bos, "eos_token", eos);
    if ((j = load_json("--messages", mpath)) == NULL) {
        goto done;
    }
    json_object_set_new(user, "messages", j);
    /* as transformers passes them: None when not given */
    if (tools == NULL) {
        json_object_set_new(user, "tools", json_null());
    } else {
        if ((j = load_json("--tools", tools)) == NULL) {
            goto done;
        }
        json_object_set_new(user, "tools", j);
    }
    json_object_set_new(user, "documents", json_null());
    if (kwargs != NULL) {
        json_error_t je;

        j = json_loads(kwargs, JSON_PRESERVE_ORDER, &je);
        if (j == NULL || !json_is_object(j)) {
            fprintf(stderr, "nalar render: --kwargs: a JSON object%s%s\n",
                    j == NULL ? ": " : "", j == NULL ? je.text : "");
            json_decref(j);
            goto done;
        }
        json_object_update(user, j);
        json_decref(j);
    }
    if (openai && openai_vars(&user, &trusted, !no_gen, bos, eos) != 0) {
        goto done;
    }
    rc = render(t, user, trusted, now == UINT64_MAX ? -1 : (int64_t) now,
                show_spans, show_ids ? model : NULL);
done:
    json_decref(user);
    json_decref(trusted);
    nalar_jinja_free(t);
    free(mbos);
    free(meos);
    return rc;
}
