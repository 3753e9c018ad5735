/*
 * The request body -> engine parameters (see ngx_nalar_request.h): the
 * fields of OpenAI's completions and chat completions, their types and
 * ranges, and the prompt (text pieces, a chat rendering, or token ids).
 * No nginx dependency, no shared state: safe on any thread.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ngx_nalar_request.h"
#include "grammar.h"

#define NALAR_API_MAX_TOOLS  128


static int
api_fail(nalar_api_request *req, int status, const char *type,
         const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));


static int
api_fail(nalar_api_request *req, int status, const char *type,
         const char *param, const char *code, const char *fmt, ...)
{
    va_list  args;

    req->err.status = status;
    req->err.type = type;
    req->err.param = param;
    req->err.code = code;

    va_start(args, fmt);
    vsnprintf(req->err.message, sizeof(req->err.message), fmt, args);
    va_end(args);

    return -1;
}


#define api_bad(req, param, ...)                                              \
    api_fail(req, 400, "invalid_request_error", param, "invalid_value",       \
             __VA_ARGS__)

#define api_oom(req)                                                          \
    api_fail(req, 500, "server_error", NULL, "out_of_memory",                 \
             "The server is out of memory")


static int
api_logit_bias(nalar_api_request *req, const nalar_api_model *m)
{
    char         *end;
    long          id;
    json_t       *v, *e;
    double        d;
    const char   *key;
    nalar_sampling  *s = &req->params.sampling;

    v = json_object_get(req->root, "logit_bias");

    if (v == NULL || json_is_null(v)) {
        return 0;
    }

    if (!json_is_object(v)) {
        return api_bad(req, "logit_bias", "logit_bias must be an object "
                       "mapping token ids to numbers");
    }

    if (json_object_size(v) > NALAR_MAX_LOGIT_BIAS) {
        return api_bad(req, "logit_bias", "logit_bias has more than %d "
                       "entries", NALAR_MAX_LOGIT_BIAS);
    }

    json_object_foreach(v, key, e) {
        errno = 0;
        id = strtol(key, &end, 10);

        if (*key < '0' || *key > '9' || *end != '\0' || errno != 0
            || id > INT32_MAX
            || (m->state == 1 && id >= m->n_vocab))
        {
            return api_bad(req, "logit_bias", "logit_bias: \"%s\" is not a "
                           "token id of the model", key);
        }

        d = json_is_number(e) ? json_number_value(e) : -1000;

        if (!(d >= -100 && d <= 100)) {
            return api_bad(req, "logit_bias", "logit_bias: the bias of token "
                           "%s must be a number from -100 to 100", key);
        }

        s->bias_id[s->n_bias] = (int32_t) id;
        s->bias[s->n_bias] = (float) d;
        s->n_bias++;
    }

    return 0;
}


/* The model, the sampling and the output fields. */

static int
api_fields(nalar_api_request *req, const nalar_api_in *in)
{
    int                     have_seed;
    json_t                 *root, *v, *e;
    size_t                  i, n, len;
    double                  d;
    const char             *name;
    nalar_request_params   *p;
    const nalar_api_model  *m;

    root = req->root;
    p = &req->params;

    /* model: the first configured one when absent */

    v = json_object_get(root, "model");

    if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
        return api_bad(req, "model", "model must be a string");
    }

    name = json_is_string(v) ? json_string_value(v) : NULL;
    len = name ? json_string_length(v) : 0;

    req->model = -1;

    for (i = 0; i < in->n_models; i++) {
        if (name == NULL
            || (in->models[i].name_len == len
                && memcmp(in->models[i].name, name, len) == 0))
        {
            req->model = (int) i;
            break;
        }
    }

    if (req->model < 0) {
        return api_fail(req, 404, "invalid_request_error", "model",
                        "model_not_found", "The model `%s` does not exist",
                        name ? name : "");
    }

    m = &in->models[req->model];

    /* booleans */

    v = json_object_get(root, "stream");
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            return api_bad(req, "stream", "stream must be a boolean");
        }
        req->stream = json_is_true(v);
    }

    v = json_object_get(root, "stream_options");
    if (v && !json_is_null(v)) {
        if (!json_is_object(v)) {
            return api_bad(req, "stream_options",
                           "stream_options must be an object");
        }

        e = json_object_get(v, "include_usage");
        if (e && !json_is_boolean(e)) {
            return api_bad(req, "stream_options.include_usage",
                           "include_usage must be a boolean");
        }

        req->include_usage = (e && json_is_true(e));
    }

    v = json_object_get(root, "echo");
    if (v && json_is_true(v)) {
        return api_bad(req, "echo", "echo is not supported");
    }

    /* what cannot be honoured is refused, not ignored */

    v = json_object_get(root, "best_of");
    if (v && !json_is_null(v)
        && !(json_is_integer(v) && json_integer_value(v) == 1))
    {
        return api_bad(req, "best_of", "best_of is not supported");
    }

    v = json_object_get(root, "suffix");
    if (v && !json_is_null(v)
        && !(json_is_string(v) && json_string_length(v) == 0))
    {
        return api_bad(req, "suffix", "suffix is not supported");
    }

    if (api_logit_bias(req, m) != 0) {
        return -1;
    }

    /* vLLM's extensions: logprobs tokens as "token_id:N", and generating
     * max_tokens whatever the model says */

    v = json_object_get(root, "return_tokens_as_token_ids");
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            return api_bad(req, "return_tokens_as_token_ids",
                           "return_tokens_as_token_ids must be a boolean");
        }
        req->token_ids = json_is_true(v);
    }

    v = json_object_get(root, "ignore_eos");
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            return api_bad(req, "ignore_eos", "ignore_eos must be a boolean");
        }
        p->ignore_eos = json_is_true(v);
    }

    v = json_object_get(root, "user");
    if (v && !json_is_null(v) && !json_is_string(v)) {
        return api_bad(req, "user", "user must be a string");
    }

    /* max_tokens: 16 for completions as OpenAI, the context for chat */

    p->max_tokens = in->chat ? 0 : 16;
    p->max_tokens_fit = 1;

    v = json_object_get(root, "max_completion_tokens");
    if (v == NULL || json_is_null(v)) {
        v = json_object_get(root, "max_tokens");
    }

    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1
            || json_integer_value(v) > 0x7fffffff)
        {
            return api_bad(req, "max_tokens",
                           "max_tokens must be a positive integer");
        }

        p->max_tokens = (int32_t) json_integer_value(v);
    }

    /* numbers with their OpenAI ranges */

#define API_NUMBER(field, lo, hi, dst)                                        \
    v = json_object_get(root, field);                                         \
    if (v && !json_is_null(v)) {                                              \
        if (!json_is_number(v)) {                                             \
            return api_bad(req, field, field " must be a number");            \
        }                                                                     \
        d = json_number_value(v);                                             \
        if (!(d >= lo && d <= hi)) {                                          \
            return api_bad(req, field, field " must be between " #lo " and "  \
                           #hi);                                              \
        }                                                                     \
        dst = (float) d;                                                      \
    }

    API_NUMBER("temperature", 0, 2, p->sampling.temperature);
    API_NUMBER("top_p", 0, 1, p->sampling.top_p);
    API_NUMBER("min_p", 0, 1, p->sampling.min_p);
    API_NUMBER("presence_penalty", -2, 2, p->sampling.presence_penalty);
    API_NUMBER("frequency_penalty", -2, 2, p->sampling.frequency_penalty);

#undef API_NUMBER

    v = json_object_get(root, "top_k");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < -1
            || json_integer_value(v) > 0x7fffffff)
        {
            return api_bad(req, "top_k", "top_k must be -1 or a non-negative "
                           "integer");
        }

        p->sampling.top_k = (int32_t) json_integer_value(v);
    }

    have_seed = 0;

    v = json_object_get(root, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v)) {
            return api_bad(req, "seed", "seed must be an integer");
        }

        p->sampling.seed = (uint64_t) json_integer_value(v);
        have_seed = 1;
    }

    if (!have_seed) {
        p->sampling.seed = in->seed;
    }

    req->n = 1;

    v = json_object_get(root, "n");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1
            || json_integer_value(v) > NALAR_API_MAX_N)
        {
            return api_bad(req, "n", "n must be an integer from 1 to %d",
                           NALAR_API_MAX_N);
        }

        req->n = (int) json_integer_value(v);
    }

    /* logprobs: an integer for completions, a boolean plus top_logprobs
     * for chat */

    v = json_object_get(root, "logprobs");

    if (in->chat) {
        if (v && !json_is_null(v) && !json_is_boolean(v)) {
            return api_bad(req, "logprobs", "logprobs must be a boolean");
        }

        e = json_object_get(root, "top_logprobs");

        if (e && !json_is_null(e) && !(v && json_is_true(v))) {
            return api_bad(req, "top_logprobs",
                           "top_logprobs needs logprobs: true");
        }

        if (v && json_is_true(v)) {
            req->logprobs = 0;

            if (e && !json_is_null(e)) {
                if (!json_is_integer(e) || json_integer_value(e) < 0
                    || json_integer_value(e) > NALAR_API_MAX_LOGPROBS)
                {
                    return api_bad(req, "top_logprobs", "top_logprobs must "
                                   "be an integer from 0 to 20");
                }

                req->logprobs = (int) json_integer_value(e);
            }
        }

    } else if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0
            || json_integer_value(v) > 5)
        {
            return api_bad(req, "logprobs", "logprobs must be an integer "
                           "from 0 to 5");
        }

        req->logprobs = (int) json_integer_value(v);
    }

    p->sampling.n_logprobs = req->logprobs > 0 ? (int32_t) req->logprobs : 0;
    p->logprobs = (req->logprobs >= 0);

    /* stop: a string or up to 4 strings */

    v = json_object_get(root, "stop");

    if (v && !json_is_null(v)) {
        if (json_is_string(v)) {
            n = 1;

        } else if (json_is_array(v)
                   && json_array_size(v) <= NALAR_API_MAX_STOP)
        {
            n = json_array_size(v);

        } else {
            return api_bad(req, "stop", "stop must be a string or an array "
                           "of at most %d strings", NALAR_API_MAX_STOP);
        }

        for (i = 0; i < n; i++) {
            e = json_is_string(v) ? v : json_array_get(v, i);

            if (!json_is_string(e)) {
                return api_bad(req, "stop", "stop must be a string or an "
                               "array of strings");
            }

            len = json_string_length(e);

            if (len == 0 || strlen(json_string_value(e)) != len) {
                return api_bad(req, "stop", "stop strings must be non-empty "
                               "and contain no NUL");
            }

            req->stops[p->n_stop++] = json_string_value(e);
        }
    }

    return 0;
}


/*
 * `response_format`: {"type": "text"}, {"type": "json_object"} or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}.  The
 * schema is checked here (nalar_schema_check, no vocabulary needed), so an
 * unsupported keyword is a 400 that names it; the engine compiles it again
 * for the model's vocabulary, from its cache.
 */

static int
api_response_format(nalar_api_request *req)
{
    char        err[512];
    json_t     *v, *t, *js, *sc, *nm, *st;
    const char *type;

    v = json_object_get(req->root, "response_format");

    if (v == NULL || json_is_null(v)) {
        return 0;
    }

    t = json_object_get(v, "type");

    if (!json_is_object(v) || !json_is_string(t)) {
        return api_bad(req, "response_format", "response_format must be an "
                       "object with a type: \"text\", \"json_object\" or "
                       "\"json_schema\"");
    }

    type = json_string_value(t);

    if (strcmp(type, "text") == 0) {
        return 0;
    }

    if (strcmp(type, "json_object") == 0) {
        req->params.grammar = NALAR_GRAMMAR_JSON_OBJECT;
        return 0;
    }

    if (strcmp(type, "json_schema") != 0) {
        return api_bad(req, "response_format", "response_format.type `%s` is "
                       "not supported (\"text\", \"json_object\" or "
                       "\"json_schema\")", type);
    }

    js = json_object_get(v, "json_schema");

    if (!json_is_object(js)) {
        return api_bad(req, "response_format", "response_format.json_schema "
                       "must be an object with name and schema");
    }

    nm = json_object_get(js, "name");
    sc = json_object_get(js, "schema");
    st = json_object_get(js, "strict");

    if (!json_is_string(nm) || json_string_length(nm) == 0
        || json_string_length(nm) > 64)
    {
        return api_bad(req, "response_format", "response_format.json_schema"
                       ".name must be a string of 1 to 64 characters");
    }

    if (st != NULL && !json_is_null(st) && !json_is_boolean(st)) {
        return api_bad(req, "response_format", "response_format.json_schema"
                       ".strict must be a boolean");
    }

    if (sc != NULL && !json_is_null(sc) && !json_is_object(sc)) {
        return api_bad(req, "response_format", "response_format.json_schema"
                       ".schema must be an object");
    }

    req->schema_text = (sc == NULL || json_is_null(sc))
                       ? strdup("{}") : json_dumps(sc, JSON_COMPACT);
    if (req->schema_text == NULL) {
        return api_oom(req);
    }

    if (nalar_schema_check(req->schema_text, strlen(req->schema_text), err,
                           sizeof(err))
        != 0)
    {
        return api_bad(req, "response_format", "response_format.json_schema"
                       ".schema: %s", err);
    }

    req->params.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
    req->params.json_schema = req->schema_text;

    return 0;
}


/*
 * `prediction`: {"type": "content", "content": string or text parts}, for
 * the engine to tokenize (see prediction_text in engine.h), dropped under
 * `nalar_speculative off`.
 */

static int
api_prediction(nalar_api_request *req, const nalar_api_in *in)
{
    int        k;
    json_t    *v, *content, *t;
    nalar_err  err;

    v = json_object_get(req->root, "prediction");

    if (v == NULL || json_is_null(v)) {
        return 0;
    }

    content = json_object_get(v, "content");
    t = json_object_get(v, "type");

    if (!json_is_object(v)
        || !json_is_string(t)
        || strcmp(json_string_value(t), "content") != 0
        || !(json_is_string(content) || json_is_array(content)))
    {
        return api_bad(req, "prediction", "prediction must be {\"type\": "
                       "\"content\", \"content\": string or array of text "
                       "parts}");
    }

    req->prediction_text = malloc((nalar_chat_n_parts(content) + 1)
                                  * sizeof(nalar_tok_text));
    if (req->prediction_text == NULL) {
        return api_oom(req);
    }

    k = nalar_chat_content(content, req->prediction_text, &err);
    if (k < 0) {
        return api_bad(req, "prediction", "prediction.%s", err.msg);
    }

    if (in->spec_off) {
        return 0;
    }

    req->params.prediction_text = req->prediction_text;
    req->params.n_prediction_text = k;

    return 0;
}


/* OpenAI's function names: 1 to 64 letters, digits, '_' and '-'. */

static int
api_tool_name(const json_t *v)
{
    size_t       i, n;
    const char  *s;

    if (!json_is_string(v)) {
        return 0;
    }

    s = json_string_value(v);
    n = json_string_length(v);

    if (n == 0 || n > 64) {
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')
              || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
        {
            return 0;
        }
    }

    return 1;
}


/* One tool: {"type": "function", "function": {"name", "description",
 * "parameters", "strict"}}, its parameters a schema the grammar takes. */

static int
api_tool(nalar_api_request *req, json_t *tools, size_t i)
{
    char     msg[256], *text;
    int      rc;
    size_t   j;
    json_t  *t, *f, *v, *name;

    t = json_array_get(tools, i);
    v = json_object_get(t, "type");
    f = json_object_get(t, "function");

    if (!json_is_object(t) || !json_is_string(v)
        || strcmp(json_string_value(v), "function") != 0
        || !json_is_object(f))
    {
        return api_bad(req, "tools", "tools[%zu] must be {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}", i);
    }

    name = json_object_get(f, "name");

    if (!api_tool_name(name)) {
        return api_bad(req, "tools", "tools[%zu].function.name must be 1 to "
                       "64 letters, digits, underscores or dashes", i);
    }

    for (j = 0; j < i; j++) {
        if (json_equal(name, json_object_get(json_object_get(
                           json_array_get(tools, j), "function"), "name")))
        {
            return api_bad(req, "tools", "tools[%zu].function.name: the "
                           "function `%s` is already in tools", i,
                           json_string_value(name));
        }
    }

    v = json_object_get(f, "description");
    if (v && !json_is_null(v) && !json_is_string(v)) {
        return api_bad(req, "tools", "tools[%zu].function.description must "
                       "be a string", i);
    }

    v = json_object_get(f, "strict");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        return api_bad(req, "tools", "tools[%zu].function.strict must be a "
                       "boolean", i);
    }

    v = json_object_get(f, "parameters");
    if (v == NULL || json_is_null(v)) {
        return 0;
    }

    if (!json_is_object(v)) {
        return api_bad(req, "tools", "tools[%zu].function.parameters must be "
                       "a JSON Schema object", i);
    }

    text = json_dumps(v, JSON_COMPACT);
    if (text == NULL) {
        return api_oom(req);
    }

    rc = nalar_schema_check(text, strlen(text), msg, sizeof(msg));
    free(text);

    if (rc != 0) {
        return api_bad(req, "tools", "tools[%zu].function.parameters: %s", i,
                       msg);
    }

    return 0;
}


/*
 * A tool's parameters moved into the call's schema: their $ref pointers
 * ("#", "#/$defs/NAME", "#/definitions/NAME") become pointers into the
 * call schema's $defs, where the definitions go under the names
 * "tN_NAME" (and the parameters themselves, when "#" refers to them, as
 * "tN"), N the tool's index.  -1: out of memory.
 */

static int
api_refs(json_t *v, size_t tool, json_t *params, json_t *defs)
{
    char         buf[128];
    size_t       i;
    json_t      *e;
    const char  *key, *ref;

    if (json_is_array(v)) {
        json_array_foreach(v, i, e) {
            if (api_refs(e, tool, params, defs) != 0) {
                return -1;
            }
        }
        return 0;
    }

    if (!json_is_object(v)) {
        return 0;
    }

    json_object_foreach(v, key, e) {
        if (strcmp(key, "$ref") != 0 || !json_is_string(e)) {
            if (api_refs(e, tool, params, defs) != 0) {
                return -1;
            }
            continue;
        }

        ref = json_string_value(e);

        if (strcmp(ref, "#") == 0) {
            snprintf(buf, sizeof(buf), "t%zu", tool);
            if (json_object_set(defs, buf, params) != 0) {
                return -1;
            }
            snprintf(buf, sizeof(buf), "#/$defs/t%zu", tool);

        } else if (strncmp(ref, "#/$defs/", 8) == 0) {
            snprintf(buf, sizeof(buf), "#/$defs/t%zu_%.100s", tool, ref + 8);

        } else if (strncmp(ref, "#/definitions/", 14) == 0) {
            snprintf(buf, sizeof(buf), "#/$defs/t%zu_%.100s", tool, ref + 14);

        } else {
            continue;
        }

        if (json_string_set(e, buf) != 0) {
            return -1;
        }
    }

    return 0;
}


static json_t *
api_params(json_t *f, size_t tool, json_t *defs)
{
    char         buf[128];
    json_t      *params, *d, *e;
    const char  *key, **k, *keys[] = { "$defs", "definitions", NULL };

    params = json_object_get(f, "parameters");

    if (params == NULL || json_is_null(params)) {
        return json_pack("{s:s,s:{},s:b}", "type", "object", "properties",
                         "additionalProperties", 0);
    }

    params = json_deep_copy(params);
    if (params == NULL || api_refs(params, tool, params, defs) != 0) {
        json_decref(params);
        return NULL;
    }

    for (k = keys; *k; k++) {
        d = json_object_get(params, *k);

        json_object_foreach(d, key, e) {
            snprintf(buf, sizeof(buf), "t%zu_%.100s", tool, key);
            if (json_object_set(defs, buf, e) != 0) {
                json_decref(params);
                return NULL;
            }
        }

        json_object_del(params, *k);
    }

    return params;
}


/*
 * The grammar of the one call a request must make (tool_choice "required":
 * any of the tools; a named function: that one): the style's call object,
 * {"name": <the name>, <args_key>: <the parameters>}.
 */

static int
api_call_schema(nalar_api_request *req, json_t *tools, const json_t *want,
                const nalar_chat_call_format *fmt)
{
    char     msg[256];
    size_t   i;
    json_t  *any, *f, *params, *one, *schema, *defs;

    any = json_array();
    defs = json_object();
    if (any == NULL || defs == NULL) {
        json_decref(any);
        json_decref(defs);
        return api_oom(req);
    }

    for (i = 0; i < json_array_size(tools); i++) {
        f = json_object_get(json_array_get(tools, i), "function");

        if (want && !json_equal(want, json_object_get(f, "name"))) {
            continue;
        }

        params = api_params(f, i, defs);

        one = json_pack("{s:s,s:{s:{s:O},s:o},s:[s,s],s:b}",
                        "type", "object",
                        "properties",
                        "name", "const", json_object_get(f, "name"),
                        fmt->args_key, params,
                        "required", "name", fmt->args_key,
                        "additionalProperties", 0);

        if (one == NULL || json_array_append_new(any, one) != 0) {
            json_decref(any);
            json_decref(defs);
            return api_oom(req);
        }
    }

    if (json_array_size(any) == 1) {
        schema = json_incref(json_array_get(any, 0));
        json_decref(any);

    } else {
        schema = json_pack("{s:o}", "anyOf", any);
    }

    if (schema != NULL && json_object_size(defs) > 0
        && json_object_set(schema, "$defs", defs) != 0)
    {
        json_decref(schema);
        schema = NULL;
    }

    json_decref(defs);

    if (schema == NULL) {
        return api_oom(req);
    }

    req->tool_schema = json_dumps(schema, JSON_COMPACT);
    json_decref(schema);

    if (req->tool_schema == NULL) {
        return api_oom(req);
    }

    if (nalar_schema_check(req->tool_schema, strlen(req->tool_schema), msg,
                           sizeof(msg))
        != 0)
    {
        return api_bad(req, "tools", "the tool call's schema: %s", msg);
    }

    req->params.grammar = NALAR_GRAMMAR_JSON_SCHEMA;
    req->params.json_schema = req->tool_schema;

    return 0;
}


/*
 * `tools` and `tool_choice` (with `parallel_tool_calls`, which changes
 * nothing here).  *render: the tools the prompt shows (NULL: none, as with
 * tool_choice "none").
 */

static int
api_tools(nalar_api_request *req, int style, json_t **render)
{
    size_t                         i, n;
    json_t                        *tools, *tc, *v, *want;
    const char                    *s;
    const nalar_chat_call_format  *fmt;

    *render = NULL;

    tools = json_object_get(req->root, "tools");

    if (tools != NULL && json_is_null(tools)) {
        tools = NULL;
    }

    if (tools != NULL && !json_is_array(tools)) {
        return api_bad(req, "tools", "tools must be an array of "
                       "{\"type\": \"function\", \"function\": {...}} "
                       "objects");
    }

    n = json_array_size(tools);

    if (n > NALAR_API_MAX_TOOLS) {
        return api_bad(req, "tools", "tools has more than %d functions",
                       NALAR_API_MAX_TOOLS);
    }

    for (i = 0; i < n; i++) {
        if (api_tool(req, tools, i) != 0) {
            return -1;
        }
    }

    v = json_object_get(req->root, "parallel_tool_calls");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        return api_bad(req, "parallel_tool_calls",
                       "parallel_tool_calls must be a boolean");
    }

    req->tool_mode = n ? NALAR_API_TOOLS_AUTO : NALAR_API_TOOLS_NONE;
    want = NULL;

    tc = json_object_get(req->root, "tool_choice");

    if (tc != NULL && !json_is_null(tc)) {
        s = json_string_value(tc);

        if (s && strcmp(s, "none") == 0) {
            req->tool_mode = NALAR_API_TOOLS_NONE;

        } else if (s && strcmp(s, "auto") == 0) {
            req->tool_mode = NALAR_API_TOOLS_AUTO;

        } else if (s && strcmp(s, "required") == 0) {
            req->tool_mode = NALAR_API_TOOLS_CALL;

        } else if (json_is_object(tc)
                   && json_is_string(json_object_get(tc, "type"))
                   && strcmp(json_string_value(json_object_get(tc, "type")),
                             "function") == 0
                   && json_is_string(json_object_get(
                          json_object_get(tc, "function"), "name")))
        {
            want = json_object_get(json_object_get(tc, "function"), "name");
            req->tool_mode = NALAR_API_TOOLS_CALL;

        } else {
            return api_bad(req, "tool_choice", "tool_choice must be "
                           "\"none\", \"auto\", \"required\" or "
                           "{\"type\": \"function\", \"function\": "
                           "{\"name\": ...}}");
        }

        if (n == 0 && !(s && strcmp(s, "none") == 0)) {
            return api_bad(req, "tool_choice", "tool_choice is only allowed "
                           "when tools are given");
        }

        for (i = 0; want && i < n; i++) {
            if (json_equal(want, json_object_get(json_object_get(
                               json_array_get(tools, i), "function"), "name")))
            {
                break;
            }
        }

        if (want && i == n) {
            return api_bad(req, "tool_choice", "tool_choice names the "
                           "function `%s`, which is not in tools",
                           json_string_value(want));
        }
    }

    if (req->tool_mode == NALAR_API_TOOLS_NONE) {
        return 0;
    }

    fmt = nalar_chat_call_format_of((nalar_chat_style) style);

    if (fmt == NULL) {
        return api_bad(req, "tools", "the %s chat template has no tool "
                       "format (tools work with the chatml, llama3, mistral, "
                       "mistral-v3, mistral-v7 and mistral-v7-spm templates; "
                       "tool_choice \"none\" leaves them out)",
                       nalar_chat_style_name((nalar_chat_style) style));
    }

    *render = tools;

    if (req->tool_mode != NALAR_API_TOOLS_CALL) {
        return 0;
    }

    if (req->params.grammar != NALAR_GRAMMAR_NONE) {
        return api_bad(req, "response_format", "response_format cannot be "
                       "combined with a tool call that must be made");
    }

    return api_call_schema(req, tools, want, fmt);
}


/* An assistant's tool_calls and a tool message's tool_call_id. */

static int
api_tool_msg(nalar_api_request *req, json_t *e, size_t i)
{
    size_t   j;
    json_t  *v, *c, *f, *t;

    v = json_object_get(e, "tool_calls");

    if (v != NULL && !json_is_null(v)) {
        if (!json_is_array(v)
            || strcmp(req->msgs[i].role, "assistant") != 0)
        {
            return api_bad(req, "messages", "messages[%zu].tool_calls must "
                           "be an array, in an assistant message", i);
        }

        for (j = 0; j < json_array_size(v); j++) {
            c = json_array_get(v, j);
            f = json_object_get(c, "function");
            t = json_object_get(c, "type");

            if (!json_is_string(json_object_get(c, "id"))
                || (t != NULL && !(json_is_string(t)
                                   && strcmp(json_string_value(t),
                                             "function") == 0))
                || !json_is_string(json_object_get(f, "name"))
                || !json_is_string(json_object_get(f, "arguments")))
            {
                return api_bad(req, "messages", "messages[%zu].tool_calls[%zu] "
                               "must be {\"id\": string, \"type\": "
                               "\"function\", \"function\": {\"name\": "
                               "string, \"arguments\": string}}", i, j);
            }
        }

        req->tool_msgs[i].tool_calls = v;
    }

    v = json_object_get(e, "tool_call_id");

    if (v != NULL && !json_is_null(v)) {
        if (!json_is_string(v)) {
            return api_bad(req, "messages", "messages[%zu].tool_call_id must "
                           "be a string", i);
        }

        req->tool_msgs[i].tool_call_id = v;
    }

    return 0;
}


/* An id prompt of n tokens against the model's context: -1 refused. */

static int
api_ids_fit(nalar_api_request *req, const nalar_api_model *m, size_t n)
{
    int32_t  count;

    count = n > INT32_MAX ? INT32_MAX : (int32_t) n;

    if (count >= m->n_ctx) {
        req->prompt_tokens = count;

        return api_fail(req, 400, "invalid_request_error", "prompt",
                        "context_length_exceeded",
                        "This model's maximum context length is %d "
                        "tokens. However, your prompt has %d tokens.",
                        m->n_ctx, count);
    }

    return 0;
}


static int
api_not_id(nalar_api_request *req, const nalar_api_model *m, size_t i)
{
    return api_bad(req, "prompt", "prompt[%zu] is not a token id of this "
                   "model (0..%d)", i, m->n_vocab - 1);
}


/*
 * The prompt: `prompt` (a string, a one-element array of a string, or an
 * array of ids) or `messages` rendered with the chat template.  Text goes
 * to the engine as pieces, which it tokenizes on its thread, bounded by
 * the context; an id array is counted against the context before it is
 * copied.
 *
 * counted: NULL, or a completions prompt of ids that the body scan
 * counted (the tree holds a placeholder for them): then the answer is the
 * refusal of a prompt that long, or of arrays for ids (-1), or 1 when the
 * ids fit and the full parse must decide.
 */

static int
api_prompt(nalar_api_request *req, const nalar_api_in *in,
    const nalar_api_ids *counted)
{
    int                     k, style;
    json_t                 *v, *e, *t, *tools;
    size_t                  i, n, n_pieces;
    nalar_err               err;
    nalar_tok_text         *rendered;
    nalar_chat_tools        tool_info;
    nalar_request_params   *p;
    const nalar_api_model  *m;

    p = &req->params;
    m = &in->models[req->model];

    /* the model must be ready for its tokenizer */

    if (m->state == 0) {
        return api_fail(req, 503, "server_error", NULL, "model_loading",
                        "The model `%.*s` is loading", (int) m->name_len,
                        m->name);
    }

    if (m->state == -1) {
        return api_fail(req, 503, "server_error", NULL, "model_failed",
                        "The model `%.*s` failed to load: %s",
                        (int) m->name_len, m->name, m->error);
    }

    if (m->state != 1) {
        return api_fail(req, 503, "server_error", NULL, "model_failed",
                        "The model `%.*s` is not available in this worker",
                        (int) m->name_len, m->name);
    }

    /* OpenAI's predicted output: verified as speculative proposals */

    if (api_prediction(req, in) != 0) {
        return -1;
    }

    if (!in->chat) {
        if (counted) {
            if (api_ids_fit(req, m, counted->count) != 0) {
                return -1;
            }

            return counted->arrays ? api_not_id(req, m, 0) : 1;
        }

        v = json_object_get(req->root, "prompt");

        if (json_is_array(v) && json_array_size(v) == 1
            && (json_is_string(json_array_get(v, 0))
                || json_is_array(json_array_get(v, 0))))
        {
            v = json_array_get(v, 0);
        }

        if (json_is_string(v)) {
            /* completions take the text literally: "<s>" is not BOS */

            req->prompt_text = malloc(sizeof(nalar_tok_text));
            if (req->prompt_text == NULL) {
                return api_oom(req);
            }

            req->prompt_text->text = json_string_value(v);
            req->prompt_text->len = json_string_length(v);
            req->prompt_text->special = 0;

            p->prompt_text = req->prompt_text;
            p->n_prompt_text = 1;

            return 0;
        }

        if (!json_is_array(v) || json_array_size(v) == 0) {
            return api_bad(req, "prompt", "prompt must be a string or a "
                           "non-empty array of token ids");
        }

        /* counted before anything is copied */

        n = json_array_size(v);

        if (api_ids_fit(req, m, n) != 0) {
            return -1;
        }

        req->ids = malloc(n * sizeof(int32_t));
        if (req->ids == NULL) {
            return api_oom(req);
        }

        for (i = 0; i < n; i++) {
            e = json_array_get(v, i);

            if (!json_is_integer(e) || json_integer_value(e) < 0
                || json_integer_value(e) >= m->n_vocab)
            {
                return api_not_id(req, m, i);
            }

            req->ids[i] = (int32_t) json_integer_value(e);
        }

        p->prompt = req->ids;
        p->n_prompt = (int32_t) n;

        return 0;
    }

    /* chat */

    v = json_object_get(req->root, "messages");

    if (!json_is_array(v) || json_array_size(v) == 0) {
        return api_bad(req, "messages", "messages must be a non-empty array");
    }

    n = json_array_size(v);

    req->msgs = calloc(n, sizeof(nalar_chat_msg));
    req->tool_msgs = calloc(n, sizeof(nalar_chat_tool_msg));
    if (req->msgs == NULL || req->tool_msgs == NULL) {
        return api_oom(req);
    }

    for (i = 0; i < n; i++) {
        e = json_array_get(v, i);
        t = json_object_get(e, "role");

        if (!json_is_object(e) || !json_is_string(t)) {
            return api_bad(req, "messages", "messages[%zu] must be an object "
                           "with a string role", i);
        }

        req->msgs[i].role = json_string_value(t);
        req->msgs[i].role_len = json_string_length(t);

        t = json_object_get(e, "content");

        rendered = malloc((nalar_chat_n_parts(t) + 1)
                          * sizeof(nalar_tok_text));
        if (rendered == NULL) {
            return api_oom(req);
        }

        /* owned by the message from here on */
        req->msgs[i].parts = rendered;
        req->msgs[i].n_parts = 0;

        k = nalar_chat_content(t, rendered, &err);
        if (k < 0) {
            return api_bad(req, "messages", "messages[%zu].%s", i, err.msg);
        }

        req->msgs[i].n_parts = (size_t) k;

        if (api_tool_msg(req, e, i) != 0) {
            return -1;
        }
    }

    /* the template: the location's override, else the model's own */

    style = in->chat_style != NALAR_CHAT_AUTO ? in->chat_style
                                              : m->chat_style;
    req->chat_style = style;

    if (api_tools(req, style, &tools) != 0) {
        return -1;
    }

    tool_info.tools = tools;
    tool_info.msgs = req->tool_msgs;
    tool_info.open_call = (req->tool_mode == NALAR_API_TOOLS_CALL);

    rendered = nalar_chat_render_tools((nalar_chat_style) style, req->msgs,
                                       n, &tool_info, &n_pieces, &err);
    if (rendered == NULL) {
        return api_bad(req, "messages", "%s", err.msg);
    }

    req->prompt_text = rendered;

    p->prompt_text = rendered;
    p->n_prompt_text = (int32_t) n_pieces;
    p->prompt_param = "messages";

    /* the end-of-turn marker stops generation even where the vocabulary
     * has no single token for it */

    req->stops[p->n_stop++] = nalar_chat_stop((nalar_chat_style) style);

    return 0;
}


/*
 * The body scan (see nalar_api_count_ids in ngx_nalar_request.h): one
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


/* the body without the prompt's ids: a placeholder in their place */

typedef struct {
    const char  *piece[3];
    size_t       len[3];
    unsigned     i;
} api_rest;


static size_t
api_rest_read(void *buf, size_t size, void *data)
{
    size_t     n;
    api_rest  *r;

    r = data;

    while (r->i < 3 && r->len[r->i] == 0) {
        r->i++;
    }

    if (r->i == 3) {
        return 0;
    }

    n = r->len[r->i] < size ? r->len[r->i] : size;
    memcpy(buf, r->piece[r->i], n);
    r->piece[r->i] += n;
    r->len[r->i] -= n;

    return n;
}


/*
 * A large completions body whose prompt is ids: where their count decides
 * the answer, the answer (-1), from the body's other fields parsed as
 * usual and the count; 1: the full parse decides.
 */

static int
api_parse_counted(const char *body, size_t len, const nalar_api_in *in,
    nalar_api_request *req)
{
    int            rc;
    size_t         i;
    api_rest       rest;
    json_error_t   jerr;
    nalar_api_ids  ids;

    if (nalar_api_count_ids(body, len, &ids) != 1) {
        return 1;
    }

    /* only where some model's answer would not need the ids' values */

    for (i = 0; i < in->n_models && !ids.arrays; i++) {
        if (in->models[i].state != 1
            || ids.count >= (size_t) in->models[i].n_ctx)
        {
            break;
        }
    }

    if (i == in->n_models && !ids.arrays) {
        return 1;
    }

    rest.piece[0] = body;
    rest.len[0] = ids.start;

    /* jansson reads past a number or a word and drops a NUL byte there:
     * a placeholder that ends at its own closing byte, as the ids do */

    rest.piece[1] = "[]";
    rest.len[1] = 2;
    rest.piece[2] = body + ids.end;
    rest.len[2] = len - ids.end;
    rest.i = 0;

    req->root = json_load_callback(api_rest_read, &rest,
                                   JSON_REJECT_DUPLICATES, &jerr);

    if (req->root == NULL || !json_is_object(req->root)) {
        return 1;
    }

    if (api_fields(req, in) != 0 || api_response_format(req) != 0) {
        return -1;
    }

    rc = api_prompt(req, in, &ids);

    return rc == 0 ? 1 : rc;
}


static void
api_init(nalar_api_request *req)
{
    memset(req, 0, sizeof(*req));
    req->model = -1;
    req->logprobs = -1;
    req->n = 1;
    nalar_sampling_default(&req->params.sampling);
    req->params.stop = req->stops;
}


int
nalar_api_parse(const char *body, size_t len, const nalar_api_in *in,
                nalar_api_request *req)
{
    json_error_t  jerr;

    api_init(req);

    /* a large prompt of ids refused from its count, never a tree */

    if (!in->chat && len >= nalar_api_count_min) {
        if (api_parse_counted(body, len, in, req) != 1) {
            return -1;
        }

        nalar_api_request_free(req);
        api_init(req);
    }

    req->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);

    if (req->root == NULL || !json_is_object(req->root)) {
        return api_fail(req, 400, "invalid_request_error", NULL,
                        "invalid_json", "We could not parse the JSON body of "
                        "your request: %s (line %d, column %d)",
                        req->root ? "not a JSON object" : jerr.text,
                        jerr.line, jerr.column);
    }

    if (api_fields(req, in) != 0 || api_response_format(req) != 0) {
        return -1;
    }

    return api_prompt(req, in, NULL);
}


void
nalar_api_request_free(nalar_api_request *req)
{
    size_t  i, n;

    if (req->msgs) {
        n = json_array_size(json_object_get(req->root, "messages"));

        for (i = 0; i < n; i++) {
            free((void *) req->msgs[i].parts);
        }

        free(req->msgs);
    }

    free(req->tool_msgs);
    free(req->tool_schema);
    free(req->prompt_text);
    free(req->prediction_text);
    free(req->schema_text);
    free(req->ids);
    json_decref(req->root);

    memset(req, 0, sizeof(*req));
    req->model = -1;
}
