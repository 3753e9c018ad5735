/*
 * Renders a batch of cases with the Jinja interpreter, for
 * t/80-jinja-reference.t: the same cases, read the same way, and the same
 * results as t/jinja_ref.py gives from Python's jinja2 (one process for all
 * cases; `nalar render` is checked against this on a sample).
 *
 *   build/t/jinja_batch CASES.json  ->  [{"ok": true, "text": ...} |
 *                                        {"ok": false, "raised": bool,
 *                                         "error": ...}, ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jinja.h"


static json_t *
render_case(json_t *c)
{
    const char         *path = json_string_value(json_object_get(c,
                                                                 "template"));
    json_t             *user = json_object(), *trusted, *kw, *r;
    nalar_jinja_tmpl   *t;
    nalar_jinja_limits  lim;
    nalar_jinja_out     out;
    char                err[1024], *src = NULL;
    long                n;
    int                 rc;
    FILE               *f = path != NULL ? fopen(path, "rb") : NULL;

    if (f != NULL && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0
        && fseek(f, 0, SEEK_SET) == 0 && (src = malloc(n + 1)) != NULL
        && fread(src, 1, n, f) == (size_t) n)
    {
        t = nalar_jinja_compile(src, n, err, sizeof(err));
    } else {
        t = NULL;
        snprintf(err, sizeof(err), "cannot read %s", path ? path : "?");
    }
    if (f != NULL) {
        fclose(f);
    }
    free(src);
    if (t == NULL) {
        json_decref(user);
        return json_pack("{sbsbss}", "ok", 0, "raised", 0, "error", err);
    }
    json_object_set(user, "messages", json_object_get(c, "messages"));
    json_object_set_new(user, "tools", json_object_get(c, "tools") != NULL
                        ? json_incref(json_object_get(c, "tools"))
                        : json_null());
    json_object_set_new(user, "documents", json_null());
    if ((kw = json_object_get(c, "kwargs")) != NULL) {
        json_object_update(user, kw);
    }
    trusted = json_pack("{sOsOsO}", "add_generation_prompt",
                        json_object_get(c, "add_generation_prompt"),
                        "bos_token", json_object_get(c, "bos"),
                        "eos_token", json_object_get(c, "eos"));
    memset(&lim, 0, sizeof(lim));
    lim.now = json_integer_value(json_object_get(c, "now"));
    rc = nalar_jinja_render(t, user, trusted, &lim, &out, err, sizeof(err));
    if (rc == 0) {
        r = json_pack("{sbss#}", "ok", 1, "text", out.text, out.len);
        nalar_jinja_out_free(&out);
    } else {
        r = json_pack("{sbsbss}", "ok", 0, "raised",
                      rc == NALAR_JINJA_RAISED, "error", err);
    }
    json_decref(user);
    json_decref(trusted);
    nalar_jinja_free(t);
    return r;
}


int
main(int argc, char **argv)
{
    json_error_t  je;
    json_t       *cases, *res, *c;
    size_t        i;
    char         *s;

    if (argc != 2) {
        fprintf(stderr, "usage: jinja_batch CASES.json\n");
        return 2;
    }
    cases = json_load_file(argv[1], JSON_PRESERVE_ORDER, &je);
    if (cases == NULL || !json_is_array(cases)) {
        fprintf(stderr, "jinja_batch: %s: %s\n", argv[1], je.text);
        return 1;
    }
    res = json_array();
    json_array_foreach(cases, i, c) {
        json_array_append_new(res, render_case(c));
    }
    s = json_dumps(res, JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    json_decref(res);
    json_decref(cases);
    return 0;
}
