/*
 * The ids a GGUF vocabulary gives each text of a JSON-lines file, one line
 * of ids per text (no BOS; control-token strings stay text): the other half
 * of t/22-tokenizer-npm.t, which compares them with the real tokenizers'.
 *
 *   build/t/tok_ids MODEL.gguf FILE.jsonl [--split]
 *   build/t/tok_ids MODEL.gguf --eog
 *
 * Each line of FILE is {"text": "..."}.  With --split each text is cut into
 * three pieces at character boundaries (a third and two thirds of the way)
 * and encoded by nalar_tokenize_bounded as user text: literal text that
 * runs across pieces must give the ids of the whole.  --eog prints the ids
 * that end generation, and --bos the BOS id and whether it is added.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tokenizer.h"

/* a cut near `at`, moved back to the start of a UTF-8 character */
static size_t
cut(const char *s, size_t n, size_t at)
{
    while (at > 0 && at < n && ((unsigned char) s[at] & 0xC0) == 0x80) {
        at--;
    }
    return at;
}

static int
encode(const nalar_tokenizer *tok, const char *s, size_t n, int split)
{
    int32_t *ids = NULL;
    int      k, more = 0;

    if (split) {
        size_t a = cut(s, n, n / 3), b = cut(s, n, 2 * n / 3);
        nalar_tok_text pc[3] = {
            { s, a, 0 }, { s + a, b - a, 0 }, { s + b, n - b, 0 }
        };
        k = nalar_tokenize_bounded(tok, pc, 3, 0, 1 << 20, &ids, &more);
    } else {
        k = nalar_tokenize(tok, s, n, 0, 0, NULL, 0);
        ids = k > 0 ? malloc((size_t) k * sizeof(int32_t)) : NULL;
        if (k > 0 && (ids == NULL || nalar_tokenize(tok, s, n, 0, 0, ids, k)
                                     != k)) {
            k = -1;
        }
    }
    if (k < 0 || more) {
        free(ids);
        return -1;
    }
    for (int i = 0; i < k; i++) {
        printf(i ? " %d" : "%d", ids[i]);
    }
    printf("\n");
    free(ids);
    return 0;
}

int
main(int argc, char **argv)
{
    gguf_file       *f;
    nalar_tokenizer *tok;
    nalar_err        err;
    FILE            *in;
    char            *line = NULL;
    size_t           cap = 0;
    int              split = argc > 3 && strcmp(argv[3], "--split") == 0;
    int              rc = 0;

    if (argc < 3) {
        fprintf(stderr, "usage: tok_ids MODEL FILE.jsonl [--split] | "
                "MODEL --eog | MODEL --bos\n");
        return 2;
    }
    f = gguf_open(argv[1], &err);
    tok = f ? nalar_tokenizer_create(f, &err) : NULL;
    if (f) {
        gguf_close(f);
    }
    if (tok == NULL) {
        fprintf(stderr, "tok_ids: %s\n", err.msg);
        return 1;
    }
    if (strcmp(argv[2], "--eog") == 0 || strcmp(argv[2], "--bos") == 0) {
        int k = 0;
        for (int32_t id = 0; argv[2][2] == 'e' && id < nalar_tok_n_vocab(tok);
             id++) {
            if (nalar_tok_is_eog(tok, id)) printf(k++ ? " %d" : "%d", id);
        }
        if (argv[2][2] == 'b') {
            printf("%d %d", nalar_tok_bos(tok), nalar_tok_add_bos(tok));
        }
        printf("\n");
        nalar_tokenizer_destroy(tok);
        return 0;
    }
    in = fopen(argv[2], "r");
    if (in == NULL) {
        perror(argv[2]);
        nalar_tokenizer_destroy(tok);
        return 1;
    }
    while (rc == 0 && getline(&line, &cap, in) > 0) {
        json_error_t je;
        json_t      *j = json_loads(line, JSON_ALLOW_NUL, &je);
        json_t      *t = json_object_get(j, "text");

        if (!json_is_string(t)
            || encode(tok, json_string_value(t), json_string_length(t),
                      split) != 0)
        {
            fprintf(stderr, "tok_ids: cannot encode: %s", line);
            rc = 1;
        }
        json_decref(j);
    }
    free(line);
    fclose(in);
    nalar_tokenizer_destroy(tok);
    return rc;
}
