/*
 * The request body -> engine parameters (see api/request.h): the
 * fields of OpenAI's completions and chat completions, their types and
 * ranges, and the prompt (text pieces, a chat rendering, or token ids).
 * No nginx dependency, no shared state: safe on any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request_internal.h"
#include "grammar.h"


static int api_model(nalar_api_request *req, const nalar_api_in *in);
static int api_stream(nalar_api_request *req);
static int api_options(nalar_api_request *req, const nalar_api_in *in);
static int api_sampling(nalar_api_request *req, const nalar_api_in *in);
static int api_logprobs(nalar_api_request *req, const nalar_api_in *in);
static int api_stop(nalar_api_request *req);


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
            || (m->state == 1 && id >= m->limits.n_vocab))
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


/*
 * The body's fields but the prompt, each step in the order a client sees
 * its errors: the model, how the answer is sent, logit_bias, the options,
 * sampling, logprobs, stop.  0, or -1 with req->err.
 */

static int
api_fields(nalar_api_request *req, const nalar_api_in *in)
{
    if (api_model(req, in) != 0
        || api_stream(req) != 0
        || api_logit_bias(req, &in->models[req->model]) != 0
        || api_options(req, in) != 0
        || api_sampling(req, in) != 0
        || api_logprobs(req, in) != 0
        || api_stop(req) != 0)
    {
        return -1;
    }

    return 0;
}


/*
 * model: a configured model (the first when absent), or a LoRA adapter of
 * the input's list; where the input forces its adapter, that adapter
 * whether the body names it, its base or nothing.  Every other name gets
 * the same answer, whether or not an adapter of that name exists, so that
 * the answer never tells which adapters are configured.
 */

static int
api_model(nalar_api_request *req, const nalar_api_in *in)
{
    json_t                *v;
    size_t                 i, len;
    const char            *name;
    const nalar_api_lora  *a;

    v = json_object_get(req->root, "model");

    if (v != NULL && !json_is_null(v) && !json_is_string(v)) {
        return api_bad(req, "model", "model must be a string");
    }

    name = json_is_string(v) ? json_string_value(v) : NULL;
    len = name ? json_string_length(v) : 0;

    req->model = -1;
    req->lora = -1;
    req->params.adapter = 0;

    if (in->lora_forced && in->n_loras == 1) {
        a = &in->loras[0];

        if (name == NULL
            || (a->name_len == len && memcmp(a->name, name, len) == 0)
            || (in->models[a->model].name_len == len
                && memcmp(in->models[a->model].name, name, len) == 0))
        {
            req->model = a->model;
            req->lora = 0;
            req->params.adapter = a->adapter;
        }

        goto done;
    }

    for (i = 0; i < in->n_models; i++) {
        if (name == NULL
            || (in->models[i].name_len == len
                && memcmp(in->models[i].name, name, len) == 0))
        {
            req->model = (int) i;
            goto done;
        }
    }

    for (i = 0; i < in->n_loras; i++) {
        a = &in->loras[i];

        if (name != NULL && a->name_len == len
            && memcmp(a->name, name, len) == 0)
        {
            req->model = a->model;
            req->lora = (int) i;
            req->params.adapter = a->adapter;
            break;
        }
    }

done:

    if (req->model < 0) {
        return api_fail(req, 404, "invalid_request_error", "model",
                        "model_not_found", "The model `%s` does not exist "
                        "or you do not have access to it.",
                        name ? name : "");
    }

    return 0;
}


/* stream, stream_options, and what cannot be honoured */

static int
api_stream(nalar_api_request *req)
{
    json_t  *root, *v, *e;

    root = req->root;

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

    return 0;
}


static int
api_options(nalar_api_request *req, const nalar_api_in *in)
{
    json_t                *root, *v;
    nalar_request_params  *p;

    root = req->root;
    p = &req->params;

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

    return 0;
}


static int
api_sampling(nalar_api_request *req, const nalar_api_in *in)
{
    int                    have_seed;
    json_t                *root, *v;
    double                 d;
    nalar_request_params  *p;

    root = req->root;
    p = &req->params;

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

    return 0;
}


static int
api_logprobs(nalar_api_request *req, const nalar_api_in *in)
{
    json_t                *root, *v, *e;
    nalar_request_params  *p;

    root = req->root;
    p = &req->params;

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

    return 0;
}


static int
api_stop(nalar_api_request *req)
{
    json_t                *v, *e;
    size_t                 i, n, len;
    nalar_request_params  *p;

    p = &req->params;

    /* stop: a string or up to 4 strings of up to 256 bytes each */

    v = json_object_get(req->root, "stop");

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

            if (len > NALAR_API_MAX_STOP_LEN) {
                return api_bad(req, "stop", "each stop string may be at "
                               "most %d bytes long (UTF-8); one has %zu",
                               NALAR_API_MAX_STOP_LEN, len);
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


/*
 * An id prompt of n tokens against the model's context: -1 refused, in
 * the engine's words (nalar_limits_check on the snapshot's limits, with
 * max_tokens, which api_fields read first), so that the error is built
 * once, here.
 */

static int
api_ids_fit(nalar_api_request *req, const nalar_api_model *m, size_t n)
{
    int32_t  count;
    char     msg[256];

    count = n > INT32_MAX ? INT32_MAX : (int32_t) n;

    if (count >= m->limits.n_ctx) {
        req->prompt_tokens = count;

        (void) nalar_limits_check(&m->limits, count, 0,
                                  req->params.max_tokens, msg, sizeof(msg));

        return api_fail(req, 400, "invalid_request_error", "prompt",
                        "context_length_exceeded", "%s", msg);
    }

    return 0;
}


static int
api_not_id(nalar_api_request *req, const nalar_api_model *m, size_t i)
{
    return api_bad(req, "prompt", "prompt[%zu] is not a token id of this "
                   "model (0..%d)", i, m->limits.n_vocab - 1);
}


/* The model must be ready for its tokenizer: 0, or -1 with a 503. */

static int
api_ready(nalar_api_request *req, const nalar_api_model *m)
{
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

    return 0;
}


/*
 * A completions prompt: a string, a one-element array of a string, or an
 * array of ids.  Text goes to the engine, which tokenizes it on its thread,
 * bounded by the context; an id array is counted against the context
 * before it is copied.
 *
 * counted: NULL, or a prompt of ids that the body scan counted (the tree
 * holds a placeholder for them): then the answer is the refusal of a
 * prompt that long, or of arrays for ids (-1), or 1 when the ids fit and
 * the full parse must decide.
 */

static int
api_completion(nalar_api_request *req, const nalar_api_model *m,
    const nalar_api_ids *counted)
{
    json_t                 *v, *e;
    size_t                  i, n;
    nalar_request_params   *p;

    p = &req->params;

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
            || json_integer_value(e) >= m->limits.n_vocab)
        {
            return api_not_id(req, m, i);
        }

        req->ids[i] = (int32_t) json_integer_value(e);
    }

    p->prompt = req->ids;
    p->n_prompt = (int32_t) n;

    return 0;
}


/* `messages`, checked: roles, contents of text parts, tool calls and
 * their ids, into req->msgs and req->tool_msgs. */

static int
api_messages(nalar_api_request *req)
{
    int              k;
    json_t          *v, *e, *t;
    size_t           i, n;
    nalar_err        err;
    nalar_tok_text  *parts;

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

        parts = malloc((nalar_chat_n_parts(t) + 1) * sizeof(nalar_tok_text));
        if (parts == NULL) {
            return api_oom(req);
        }

        /* owned by the message from here on */
        req->msgs[i].parts = parts;
        req->msgs[i].n_parts = 0;

        k = nalar_chat_content(t, parts, &err);
        if (k < 0) {
            return api_bad(req, "messages", "messages[%zu].%s", i, err.msg);
        }

        req->msgs[i].n_parts = (size_t) k;

        if (nalar_api_tool_msg(req, e, i) != 0) {
            return -1;
        }
    }

    return 0;
}


/*
 * vLLM's fields for the template: add_generation_prompt (default true)
 * into *gen, chat_template_kwargs (an object whose members become the
 * template's variables; not the names the request itself gives).  A
 * style has no template to take them: refused there.  vLLM's per-request
 * chat_template is refused.
 */

static const char  *api_reserved[] = {
    "messages", "tools", "documents", "add_generation_prompt", NULL
};

static int
api_template_fields(nalar_api_request *req, int jinja, int *gen)
{
    size_t       i;
    json_t      *v, *e;
    const char  *key;

    *gen = 1;

    /* a template is the operator's code, never a client's */

    v = json_object_get(req->root, "chat_template");
    if (v && !json_is_null(v)) {
        return api_bad(req, "chat_template", "chat_template in a request is "
                       "not supported: the server runs the model's template "
                       "or its operator's (nalar_chat_template)");
    }

    v = json_object_get(req->root, "add_generation_prompt");
    if (v && !json_is_null(v)) {
        if (!json_is_boolean(v)) {
            return api_bad(req, "add_generation_prompt",
                           "add_generation_prompt must be a boolean");
        }

        *gen = json_is_true(v);

        if (!*gen && !jinja) {
            return api_bad(req, "add_generation_prompt", "add_generation_"
                           "prompt: false needs a Jinja chat template (the "
                           "model's own, or nalar_chat_template file=PATH)");
        }
    }

    v = json_object_get(req->root, "chat_template_kwargs");
    if (v == NULL || json_is_null(v)) {
        return 0;
    }

    if (!json_is_object(v)) {
        return api_bad(req, "chat_template_kwargs",
                       "chat_template_kwargs must be an object");
    }

    if (!jinja && json_object_size(v) > 0) {
        return api_bad(req, "chat_template_kwargs", "chat_template_kwargs "
                       "needs a Jinja chat template (the model's own, or "
                       "nalar_chat_template file=PATH); this one is the %s "
                       "style", nalar_chat_style_name(req->chat_style));
    }

    json_object_foreach(v, key, e) {
        for (i = 0; api_reserved[i]; i++) {
            if (strcmp(key, api_reserved[i]) == 0) {
                return api_bad(req, "chat_template_kwargs",
                               "chat_template_kwargs may not set `%s`: it "
                               "is the request's own", key);
            }
        }
    }

    return 0;
}


/* The style's rendering, here (it is linear in the messages). */

static int
api_style_prompt(nalar_api_request *req, json_t *tools)
{
    size_t                  n_pieces;
    nalar_err               err;
    nalar_tok_text         *rendered;
    nalar_chat_tools        tool_info;
    nalar_request_params   *p;

    p = &req->params;

    tool_info.tools = tools;
    tool_info.msgs = req->tool_msgs;
    tool_info.open_call = (req->tool_mode == NALAR_API_TOOLS_CALL);

    rendered = nalar_chat_render_tools((nalar_chat_style) req->chat_style,
                                       req->msgs,
                                       json_array_size(json_object_get(
                                           req->root, "messages")),
                                       &tool_info, &n_pieces, &err);
    if (rendered == NULL) {
        return api_bad(req, "messages", "%s", err.msg);
    }

    req->prompt_text = rendered;

    p->prompt_text = rendered;
    p->n_prompt_text = (int32_t) n_pieces;

    return 0;
}


/* A Jinja template's render, handed to the engine for intake. */

static int
api_jinja_prompt(nalar_api_request *req, const nalar_chat_template *tmpl,
    const nalar_api_model *m, json_t *tools, int gen)
{
    nalar_err                      err;
    nalar_chat_job                 job;
    const nalar_chat_call_format  *fmt;

    fmt = nalar_chat_call_format_of((nalar_chat_style) req->chat_style);

    job.tmpl = tmpl;
    job.root = req->root;
    job.tools = tools;
    job.add_generation_prompt = gen;
    job.bos = m->bos;
    job.eos = m->eos;
    job.open = (req->tool_mode == NALAR_API_TOOLS_CALL && fmt != NULL)
               ? fmt->prompt_open : NULL;

    req->prompt = nalar_chat_template_prompt(&job, &err);
    if (req->prompt == NULL) {
        return api_oom(req);
    }

    req->params.prompt_shared = req->prompt;

    return 0;
}


/*
 * A chat prompt: the messages, checked here, rendered with the location's
 * template (file=), else its style, else the model's own template, else
 * the style found in it.  A style renders here; a template on the
 * engine's thread at intake.
 */

static int
api_chat(nalar_api_request *req, const nalar_api_in *in,
    const nalar_api_model *m)
{
    int                         gen;
    json_t                     *tools;
    const nalar_chat_template  *tmpl;

    if (api_messages(req) != 0) {
        return -1;
    }

    tmpl = in->tmpl;

    if (tmpl == NULL && in->chat_style == NALAR_CHAT_AUTO) {
        tmpl = m->tmpl;
    }

    req->chat_style = tmpl ? tmpl->style
                           : in->chat_style != NALAR_CHAT_AUTO
                             ? in->chat_style : m->chat_style;

    if (api_template_fields(req, tmpl != NULL, &gen) != 0
        || nalar_api_tools(req, req->chat_style, &tools) != 0)
    {
        return -1;
    }

    if ((tmpl ? api_jinja_prompt(req, tmpl, m, tools, gen)
              : api_style_prompt(req, tools))
        != 0)
    {
        return -1;
    }

    req->params.prompt_param = "messages";

    /* the end-of-turn marker stops generation even where the vocabulary
     * has no single token for it */

    req->stops[req->params.n_stop++] =
        nalar_chat_stop((nalar_chat_style) req->chat_style);

    return 0;
}


/*
 * The prompt: a completions `prompt`, or chat `messages`, once the model is
 * ready (counted: see api_completion), and OpenAI's predicted output,
 * verified as speculative proposals.
 */

static int
api_prompt(nalar_api_request *req, const nalar_api_in *in,
    const nalar_api_ids *counted)
{
    const nalar_api_model  *m;

    m = &in->models[req->model];

    if (api_ready(req, m) != 0 || api_prediction(req, in) != 0) {
        return -1;
    }

    return in->chat ? api_chat(req, in, m) : api_completion(req, m, counted);
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
            || ids.count >= (size_t) in->models[i].limits.n_ctx)
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


/*
 * vLLM's /tokenize: {"model", "messages" | "prompt",
 * "add_generation_prompt", "chat_template_kwargs"}.  The prompt is made as
 * for a completion of it (the same template, the same checks), then only
 * tokenized: one choice, no sampling, no stream, nothing generated.
 */

static int
api_tokenize(nalar_api_request *req, const nalar_api_in *in)
{
    nalar_api_in           tin;
    nalar_request_params  *p;

    tin = *in;
    tin.chat = (json_object_get(req->root, "messages") != NULL);

    if (api_fields(req, &tin) != 0 || api_prompt(req, &tin, NULL) != 0) {
        return -1;
    }

    p = &req->params;

    req->n = 1;
    req->stream = 0;
    req->logprobs = -1;
    req->tool_mode = NALAR_API_TOOLS_NONE;
    p->logprobs = 0;
    p->max_tokens = 0;
    p->max_tokens_fit = 0;
    p->grammar = NALAR_GRAMMAR_NONE;
    p->prediction_text = NULL;
    p->n_prediction_text = 0;
    p->tokenize_only = 1;

    return 0;
}


static void
api_init(nalar_api_request *req)
{
    memset(req, 0, sizeof(*req));
    req->model = -1;
    req->lora = -1;
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

    if (in->tokenize) {
        return api_tokenize(req, in);
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
    nalar_prompt_unref(req->prompt);
    free(req->prompt_text);
    free(req->prediction_text);
    free(req->schema_text);
    free(req->ids);
    json_decref(req->root);

    memset(req, 0, sizeof(*req));
    req->model = -1;
    req->lora = -1;
}
