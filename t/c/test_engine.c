/*
 * Engine tests on the bundled demo models: greedy continuations equal the
 * reference ids of models/README.md (PyTorch F32, verified with llama.cpp),
 * batch invariance (alone, batched with other lengths, chunked prefill,
 * under preemption), paged-KV bookkeeping, and the KV pool's invariants;
 * a failed step (an allocation or the backend failing, injected) finishes
 * every running request with the error and returns its KV; submitting and
 * cancelling from several threads at once never fails a request.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "engine_test.h"
#include "kv.h"
#include "mkmodel.h"
#include "model.h"
#include "collect.h"
#include "tap.h"
#include "tokenizer.h"
#include "engine_helpers.h"

#define N_REF 48

typedef struct {
    const char *prompt;
    int32_t     prompt_ids[8];
    int         n_prompt;
    int32_t     target[N_REF];
    int32_t     draft[N_REF];
} ref_case;

static const ref_case refs[] = {
    { "In the beginning", { 1, 780, 262, 1794, 1046 }, 5,
      { 272, 262, 893, 322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416,
        1978, 1953, 793, 1967, 13, 843, 356, 388, 722, 323, 1962, 398, 2, 1,
        375, 767, 823, 313, 262, 893, 322, 349, 261, 416, 517, 322, 261, 416,
        517, 322, 261, 13, 1965, 369 },
      { 272, 262, 893, 322, 261, 13, 1966, 317, 272, 262, 893, 1967, 13, 843,
        356, 1616, 1552, 293, 706, 1999, 2008, 2008, 2018, 2006, 2007, 1999,
        1999, 1999, 2008, 2006, 2006, 2006, 2006, 2006, 2006, 2006, 2006, 2006,
        2006, 2006, 2006, 2006, 2006, 2006, 2006, 2006, 2006, 2006 } },
    { "And it came to pass", { 1, 327, 337, 559, 292, 718 }, 6,
      { 1963, 313, 1963, 313, 1963, 313, 1963, 463, 262, 581, 272, 262, 822,
        389, 566, 292, 262, 485, 1963, 313, 306, 389, 566, 292, 262, 485, 1963,
        274, 292, 262, 485, 1963, 274, 292, 262, 485, 1963, 274, 292, 262, 485,
        1963, 274, 292, 262, 485, 1963, 274 },
      { 1963, 313, 262, 485, 430, 357, 262, 485, 272, 529, 1963, 1181, 710,
        262, 386, 1963, 304, 410, 349, 418, 292, 262, 485, 272, 1542, 1963, 768,
        262, 485, 272, 1542, 1963, 768, 262, 485, 272, 1542, 1963, 768, 262,
        485, 272, 1542, 1963, 768, 262, 485, 272 } },
    { "A wise man", { 1, 298, 1540, 416 }, 4,
      { 322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416, 517, 322, 261,
        416, 517, 322, 261, 416, 1978, 1953, 793, 13, 329, 261, 416, 517, 322,
        261, 416, 517, 322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416,
        1978, 1953, 13, 1965, 369, 956 },
      { 322, 261, 416, 517, 322, 261, 416, 517, 322, 261, 416, 517, 322, 261,
        416, 517, 322, 261, 416, 1967, 13, 843, 356, 1318, 644, 1967, 370, 1967,
        370, 1967, 2, 1, 375, 416, 517, 322, 261, 416, 517, 322, 261, 416, 517,
        322, 261, 416, 517, 322 } },
};
#define N_CASES ((int) (sizeof(refs) / sizeof(refs[0])))



static nalar_engine *
engine(const char *path, int chunk, int64_t kv_bytes, int threads)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.max_batch_tokens = chunk;
    o.kv_bytes = kv_bytes;
    o.n_threads = threads;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/* Run the 3 reference prompts (plus `extra` filler requests of other
 * lengths) in one batch; check each against its reference. */
static void
check_batch(nalar_engine *e, int draft, const char *what, int extra)
{
    nalar_request *reqs[16];
    collected     *out = calloc(16, sizeof(collected));
    int32_t        filler[300];
    int            n = 0, good = 0;
    nalar_err      err;

    for (int i = 0; i < 300; i++) {
        filler[i] = 300 + (i * 37) % 1500;
    }
    for (int i = 0; i < extra; i++) {
        reqs[n] = greedy_req(filler, 20 + 45 * i, 10 + 7 * i, &out[n]);
        n++;
    }
    for (int k = 0; k < N_CASES; k++) {
        reqs[n] = greedy_req(refs[k].prompt_ids, refs[k].n_prompt, N_REF,
                             &out[n]);
        n++;
    }
    if (nalar_engine_run_sync(e, reqs, n, &err) != 0) {
        diag("run: %s", err.msg);
    }
    for (int k = 0; k < N_CASES; k++) {
        collected *c = &out[extra + k];
        int        eq = c->n == N_REF
                        && same(c->ids, draft ? refs[k].draft
                                              : refs[k].target, N_REF);

        good += eq;
        if (!eq) {
            diag("%s: '%s' got %d ids, first %d %d %d", what, refs[k].prompt,
                 c->n, c->ids[0], c->ids[1], c->ids[2]);
        }
    }
    is_int(good, N_CASES, "%s: greedy ids equal the reference", what);
    for (int i = 0; i < n; i++) {
        nalar_request_unref(reqs[i]);
    }
    ok(kv_all_free(e), "%s: every KV block is back on the free list", what);
    free(out);
}


/* On a pool smaller than the context (cap tokens): what can never fit is
 * refused at submit, naming the numbers; what fits runs to its end, and
 * without max_tokens the pool bounds the sequence as the context does. */
static void
check_kv_admission(nalar_engine *e, int cap)
{
    int32_t        prompt[100];
    collected      c[3];
    nalar_request *r[3];
    nalar_err      err;
    char           want[160];
    int            rc;

    memset(&err, 0, sizeof(err));
    for (int i = 0; i < 100; i++) {
        prompt[i] = 300 + i;
    }
    r[0] = greedy_req(prompt, 100, cap - 100 + 1, &c[0]);
    rc = nalar_engine_submit(e, r[0], &err);
    nalar_engine_run_sync(e, NULL, 0, &err);
    snprintf(want, sizeof(want), "the KV cache holds %d tokens but %d "
             "tokens were requested (100 in the prompt, %d in the "
             "completion)", cap, cap + 1, cap - 100 + 1);
    ok(rc == 0 && c[0].finish == NALAR_FINISH_ERROR
       && c[0].last.error.status == 400
       && strcmp(c[0].last.error.code, "context_length_exceeded") == 0
       && strcmp(c[0].last.error.param, "max_tokens") == 0
       && strcmp(c[0].last.error.message, want) == 0,
       "prompt + max_tokens one beyond the KV cache refused at intake: %s",
       c[0].last.error.message);
    ok(!c[0].last.accepted, "never accepted");
    nalar_request_unref(r[0]);
    ok(kv_all_free(e), "the refused request took no KV block");

    /* exactly the pool, three at once: they take turns */
    for (int i = 0; i < 3; i++) {
        r[i] = greedy_req(prompt, 100, cap - 100, &c[i]);
    }
    ok(nalar_engine_run_sync(e, r, 3, &err) == 0,
       "the pool's worth, three times, runs");
    for (int i = 0; i < 3; i++) {
        ok(c[i].n == cap - 100 && c[i].finish == NALAR_FINISH_LENGTH,
           "choice %d: %d tokens (want %d), finish %d", i, c[i].n,
           cap - 100, c[i].finish);
        nalar_request_unref(r[i]);
    }

    /* no max_tokens: until the pool is full */
    r[0] = greedy_req(prompt, 100, 0, &c[0]);
    ok(nalar_engine_run_sync(e, r, 1, &err) == 0
       && c[0].n == cap - 100 && c[0].finish == NALAR_FINISH_LENGTH,
       "without max_tokens the KV cache bounds the sequence: %d tokens "
       "(want %d), finish %d", c[0].n, cap - 100, c[0].finish);
    nalar_request_unref(r[0]);
    ok(kv_all_free(e), "every KV block is back after the admission checks");
}


static void
test_kv_pool(void)
{
    nalar_kv_pool p;
    nalar_seq_kv  a, b;
    nalar_err     err;
    int           copies = 0;

    ok(nalar_kv_pool_init(&p, 8, 2, 4, &err) == 0, "pool of 8 blocks");
    nalar_seq_kv_init(&a);
    nalar_seq_kv_init(&b);
    ok(nalar_seq_kv_reserve(&p, &a, 40) == 0 && a.n_blocks == 3,
       "40 positions take 3 blocks");
    a.n_pos = 40;
    is_int(p.n_free, 5, "5 blocks left");
    ok(nalar_seq_kv_share(&p, &b, &a, 40) == 0, "share 40 positions");
    is_int(p.refcount[a.blocks[0]], 2, "shared block has refcount 2");
    is_int(p.n_free, 5, "sharing takes no block");
    /* appending to b writes into the shared partial last block: COW */
    p.copy = NULL;
    (void) copies;
    ok(nalar_seq_kv_reserve(&p, &b, 41) == 0, "reserve past the share");
    ok(b.blocks[2] != a.blocks[2], "partial last block was copied on write");
    ok(b.blocks[0] == a.blocks[0], "full blocks stay shared");
    is_int(p.refcount[a.blocks[2]], 1, "old block back to one owner");
    ok(nalar_kv_check(&p, &err) == 0, "invariants hold after COW");
    nalar_seq_kv_truncate(&p, &a, 17);
    is_int(a.n_blocks, 2, "truncate to 17 keeps 2 blocks");
    is_int(a.n_pos, 17, "truncate sets n_pos");
    ok(nalar_seq_kv_reserve(&p, &a, 16 * 9) == -1, "over-reserve fails");
    is_int(a.n_blocks, 2, "a failed reserve allocates nothing");
    nalar_seq_kv_release(&p, &a);
    nalar_seq_kv_release(&p, &b);
    is_int(p.n_free, 8, "all blocks free after release");
    ok(nalar_kv_check(&p, &err) == 0, "invariants hold at the end");

    /* a sliding window's dropped blocks go back to the pool; their table
     * entries name the first block still held */
    ok(nalar_seq_kv_reserve(&p, &a, 80) == 0, "80 positions: 5 blocks");
    a.n_pos = 80;
    is_int(nalar_seq_kv_drop_before(&p, &a, 47), 2,
           "positions before 47: 2 whole blocks given back");
    is_int(p.n_free, 5, "5 blocks free");
    ok(a.n_dead == 2 && a.blocks[0] == a.blocks[2]
       && a.blocks[1] == a.blocks[2], "their entries name block 2's");
    is_int(nalar_seq_kv_drop_before(&p, &a, 40), 0, "dropping less: none");
    ok(nalar_seq_kv_share(&p, &b, &a, 80) == -1,
       "a table with dropped blocks is not shared");
    is_int(nalar_seq_kv_drop_before(&p, &a, 1000), 2,
           "the last block is kept");
    nalar_seq_kv_truncate(&p, &a, 70);
    is_int(a.n_blocks, 5, "truncate within the last block keeps it");
    ok(nalar_seq_kv_reserve(&p, &a, 100) == 0 && a.n_blocks == 7,
       "and the table grows after the dropped blocks");
    a.n_pos = 100;
    ok(nalar_kv_check(&p, &err) == 0, "invariants hold with dropped blocks");
    nalar_seq_kv_truncate(&p, &a, 60);
    is_int(a.n_blocks, 4, "truncate into the dropped blocks");
    is_int(a.n_dead, 4, "leaves only dropped entries");
    nalar_seq_kv_release(&p, &a);
    is_int(p.n_free, 8, "release gives back only what it held");
    ok(nalar_kv_check(&p, &err) == 0, "invariants hold after release");
    nalar_kv_pool_free(&p);
}


/*
 * Greedy steps take the backend's argmax (forward_argmax) when every row is
 * greedy and plain; a row that needs its distribution (here: logprobs)
 * sends the whole step through logits.  Either way the tokens are the
 * reference's.
 */
static void
check_argmax_path(const char *path)
{
    for (int off = 0; off < 2; off++) {
        nalar_engine  *e;
        nalar_metrics  mt;
        int            good = 0;

        e = engine(path, 512, 0, 2);
        if (e == NULL) {
            ok(0, "engine for the argmax path");
            return;
        }
        for (int k = 0; k < N_CASES; k++) {
            collected      c;
            /* off: asking for logprobs takes the logits path */
            nalar_request *r = greedy_req_lp(refs[k].prompt_ids,
                                             refs[k].n_prompt, N_REF, off,
                                             &c);
            nalar_err      err;

            nalar_engine_run_sync(e, &r, 1, &err);
            good += c.n == N_REF && same(c.ids, refs[k].target, N_REF);
            nalar_request_unref(r);
        }
        nalar_engine_metrics(e, &mt);
        is_int(good, N_CASES, "argmax path %s: the reference tokens",
               off ? "off" : "on");
        if (off) {
            ok(mt.argmax_steps_total == 0, "off: no step took it (%llu)",
               (unsigned long long) mt.argmax_steps_total);
        } else {
            ok(mt.steps_total > 0 && mt.argmax_steps_total == mt.steps_total,
               "on: every greedy step took it (%llu of %llu)",
               (unsigned long long) mt.argmax_steps_total,
               (unsigned long long) mt.steps_total);
        }
        if (!off) {
            /* a greedy request beside one asking for logprobs */
            nalar_request *rs[2];
            collected      c[2];
            nalar_err      err;
            uint64_t       before = mt.argmax_steps_total;

            rs[0] = greedy_req(refs[0].prompt_ids, refs[0].n_prompt, N_REF,
                               &c[0]);
            rs[1] = greedy_req_lp(refs[1].prompt_ids, refs[1].n_prompt,
                                  N_REF, 1, &c[1]);
            nalar_engine_run_sync(e, rs, 2, &err);
            nalar_engine_metrics(e, &mt);
            ok(c[0].n == N_REF && same(c[0].ids, refs[0].target, N_REF)
               && c[1].n == N_REF && same(c[1].ids, refs[1].target, N_REF),
               "beside a logprobs request: the reference tokens");
            ok(mt.argmax_steps_total == before,
               "steps with a logprobs row take logits (%llu argmax steps "
               "of %llu)", (unsigned long long) mt.argmax_steps_total,
               (unsigned long long) mt.steps_total);
            nalar_request_unref(rs[0]);
            nalar_request_unref(rs[1]);
        }
        nalar_engine_destroy(e);
    }
}


/* a request whose prompt is text, tokenized by the engine at intake, with
 * its notify callback */
static nalar_request *
text_req_fn(const nalar_tok_text *pc, int n_pc, int n, int fit,
            const char *param, nalar_notify_fn fn, void *ctx)
{
    nalar_request_params p;
    nalar_err            err;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt_text = pc;
    p.n_prompt_text = n_pc;
    p.prompt_param = param;
    p.max_tokens = n;
    p.max_tokens_fit = fit;
    p.ignore_eos = 1;
    return nalar_request_create(&p, fn, ctx, &err);
}


/* the same, collected */
static nalar_request *
text_req(const nalar_tok_text *pc, int n_pc, int n, int fit, collected *c)
{
    memset(c, 0, sizeof(*c));
    return text_req_fn(pc, n_pc, n, fit, "messages", collect, c);
}


static void
test_text_prompts(nalar_engine *e)
{
    collected       c;
    nalar_err       err;
    nalar_request  *r;
    nalar_tok_text  pc[3];
    char           *big;
    size_t          n_big = 4 << 20;

    /* the same generation as from the reference ids, from text cut into
     * pieces anywhere */
    pc[0] = (nalar_tok_text) { refs[0].prompt, 3, 0 };
    pc[1] = (nalar_tok_text) { refs[0].prompt + 3, 5, 1 };
    pc[2] = (nalar_tok_text) { refs[0].prompt + 8,
                               strlen(refs[0].prompt) - 8, 0 };
    r = text_req(pc, 3, N_REF, 1, &c);
    nalar_engine_run_sync(e, &r, 1, &err);
    ok(c.n == N_REF && same(c.ids, refs[0].target, N_REF),
       "text prompt in pieces: the reference generation");
    is_int(c.last.usage.n_prompt, refs[0].n_prompt, "its prompt length");
    ok(c.last.accepted, "accepted");
    nalar_request_unref(r);

    /* max_tokens past the context: refused with max_tokens_fit, else
     * generation stops at the context's end */
    r = text_req(pc, 3, 600, 1, &c);
    nalar_engine_run_sync(e, &r, 1, &err);
    ok(c.finish == NALAR_FINISH_ERROR
       && strcmp(c.last.error.code, "context_length_exceeded") == 0
       && strcmp(c.last.error.param, "messages") == 0
       && strstr(c.last.error.message, "600 in the completion") != NULL,
       "prompt + max_tokens over the context: %s", c.last.error.message);
    nalar_request_unref(r);

    /* 4 MB of text: counting stops past the context */
    big = malloc(n_big);
    if (big == NULL) {
        return;
    }
    for (size_t i = 0; i < n_big; i++) {
        big[i] = "abc def "[i % 8];
    }
    pc[0] = (nalar_tok_text) { big, n_big, 0 };
    r = text_req(pc, 1, 4, 1, &c);
    nalar_engine_run_sync(e, &r, 1, &err);
    ok(c.finish == NALAR_FINISH_ERROR && c.last.error.status == 400
       && strcmp(c.last.error.code, "context_length_exceeded") == 0
       && strstr(c.last.error.message, "at least 513 in the prompt") != NULL,
       "4 MB prompt refused: %s", c.last.error.message);
    is_int(c.last.usage.n_prompt, 513, "counted up to the context + 1");
    ok(kv_all_free(e), "no KV block held");
    nalar_request_unref(r);
    free(big);
}


/*
 * Intake order: a short request is tokenized before long prompts submitted
 * ahead of it (each is tokenized up to the context), and a long prompt
 * waits at most 16 short requests.  Each request's place is when intake
 * accepted or refused it.
 */
typedef struct {
    collected  c;
    int       *seq;
    int        at;       /* 1-based place at intake, 0 before */
} ordered;


static void
ordered_collect(nalar_request *r, void *ctx)
{
    ordered *o = ctx;

    collect(r, &o->c);
    if (o->at == 0
        && (o->c.last.accepted || o->c.finish != NALAR_FINISH_NONE))
    {
        o->at = ++*o->seq;
    }
}


static nalar_request *
ordered_req(const nalar_tok_text *pc, int n, ordered *o, int *seq)
{
    memset(o, 0, sizeof(*o));
    o->seq = seq;
    return text_req_fn(pc, n, 2, 0, "prompt", ordered_collect, o);
}


static void
test_intake_order(nalar_engine *e)
{
    enum { N_SHORT = 20 };
    nalar_tok_text  small, large;
    nalar_request  *r[3 + N_SHORT + 1];
    ordered         o[3 + N_SHORT + 1];
    nalar_err       err;
    size_t          n_large = 128 * 1024;
    char           *text = malloc(n_large);
    int             seq = 0, good = 1;

    if (text == NULL) {
        return;
    }
    for (size_t i = 0; i < n_large; i++) {
        text[i] = "abc def "[i % 8];
    }
    small = (nalar_tok_text) { refs[0].prompt, strlen(refs[0].prompt), 0 };
    large = (nalar_tok_text) { text, n_large, 0 };

    /* three long prompts, then a short one */
    for (int i = 0; i < 3; i++) {
        r[i] = ordered_req(&large, 1, &o[i], &seq);
    }
    r[3] = ordered_req(&small, 1, &o[3], &seq);
    nalar_engine_run_sync(e, r, 4, &err);
    is_int(o[3].at, 1, "a short prompt submitted after three 128 KiB ones "
           "is taken in first");
    ok(o[0].at == 2 && o[1].at == 3 && o[2].at == 4,
       "the long ones after it, in their order (%d %d %d)", o[0].at,
       o[1].at, o[2].at);
    ok(o[3].c.finish == NALAR_FINISH_LENGTH && o[3].c.n == 2
       && same(o[3].c.ids, refs[0].target, 2), "the short one generates");
    for (int i = 0; i < 3; i++) {
        good &= o[i].c.finish == NALAR_FINISH_ERROR
                && o[i].c.last.error.status == 400;
    }
    ok(good, "the long ones are refused as longer than the context");
    for (int i = 0; i < 4; i++) {
        nalar_request_unref(r[i]);
    }

    /* a long prompt, then more short ones than it lets pass */
    seq = 0;
    r[0] = ordered_req(&large, 1, &o[0], &seq);
    for (int i = 1; i <= N_SHORT; i++) {
        r[i] = ordered_req(&small, 1, &o[i], &seq);
    }
    nalar_engine_run_sync(e, r, N_SHORT + 1, &err);
    is_int(o[0].at, 17, "a long prompt waits for 16 short ones, no more");
    good = 1;
    for (int i = 1; i <= N_SHORT; i++) {
        good &= o[i].at == (i <= 16 ? i : i + 1);
        good &= o[i].c.finish == NALAR_FINISH_LENGTH;
    }
    ok(good, "the short ones in their order, around it; all generate");
    ok(kv_all_free(e), "no KV block held");
    for (int i = 0; i <= N_SHORT; i++) {
        nalar_request_unref(r[i]);
    }
    free(text);
}


/* --- failures and concurrency --- */

/* What a request reported, for tests where the engine thread notifies:
 * the notify callback records the finish, and a waiter waits for all. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             done;            /* requests finished */
    int             errors;          /* of them, with NALAR_FINISH_ERROR */
    char            error[256];      /* the last error */
} board;

typedef struct {
    board        *b;
    nalar_finish  finish;
    char          error[256];
} watched;


static void
board_init(board *b)
{
    memset(b, 0, sizeof(*b));
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
}


static void
watch(nalar_request *r, void *ctx)
{
    watched      *w = ctx;
    nalar_output  o;

    nalar_request_take(r, &o);
    if (o.finish != NALAR_FINISH_NONE) {
        pthread_mutex_lock(&w->b->mu);
        w->finish = o.finish;
        memcpy(w->error, o.error.message, sizeof(w->error));
        w->b->done++;
        if (o.finish == NALAR_FINISH_ERROR) {
            w->b->errors++;
            memcpy(w->b->error, o.error.message, sizeof(w->b->error));
        }
        pthread_cond_broadcast(&w->b->cv);
        pthread_mutex_unlock(&w->b->mu);
    }
    nalar_output_free(&o);
}


/* Wait until n requests have finished (a deadline only against a hang). */
static int
board_wait(board *b, int n)
{
    struct timespec ts;
    int             rc = 0;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 600;
    pthread_mutex_lock(&b->mu);
    while (b->done < n && rc == 0) {
        rc = pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
    rc = b->done >= n;
    pthread_mutex_unlock(&b->mu);
    return rc;
}


static nalar_request *
watched_req(const int32_t *prompt, int n_prompt, int n, watched *w, board *b)
{
    nalar_request_params p = greedy_params(prompt, n_prompt, n);
    nalar_err            err;

    memset(w, 0, sizeof(*w));
    w->b = b;
    return nalar_request_create(&p, watch, w, &err);
}


static nalar_engine *
engine_running(const char *path, int32_t max_running)
{
    nalar_engine_opts o;
    nalar_err         err;
    nalar_engine     *e;

    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.n_threads = 2;
    o.max_running = max_running;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        diag("engine: %s", err.msg);
        nalar_engine_destroy(e);
        return NULL;
    }
    return e;
}


/*
 * A failed step finishes every running request with its error and returns
 * their KV; run_sync then runs what was still waiting (here: the 4th
 * request, beyond max_running 3) and reports the failure.
 */
static void
check_step_failure(nalar_engine *e, nalar_fault_site site, int at,
                   int n_req, const char *what, const char *msg)
{
    nalar_request *reqs[4];
    watched        w[4];
    board          b;
    nalar_err      err;
    int            errors = 0, rc;

    board_init(&b);
    for (int i = 0; i < n_req; i++) {
        reqs[i] = watched_req(refs[i % N_CASES].prompt_ids,
                              refs[i % N_CASES].n_prompt, 12, &w[i], &b);
    }
    nalar_engine_test_fault(e, site, at);
    rc = nalar_engine_run_sync(e, reqs, n_req, &err);
    nalar_engine_test_fault(e, site, 0);
    ok(rc == -1 && strstr(err.msg, msg) != NULL,
       "%s: run_sync reports the failure (%s)", what,
       rc == -1 ? err.msg : "returned 0");
    for (int i = 0; i < 3 && i < n_req; i++) {
        errors += w[i].finish == NALAR_FINISH_ERROR
                  && strstr(w[i].error, msg) != NULL;
    }
    is_int(errors, n_req < 3 ? n_req : 3,
           "%s: every running request ends with the error", what);
    if (n_req > 3) {
        is_int(w[3].finish, NALAR_FINISH_LENGTH,
               "%s: the waiting request runs after it", what);
    }
    ok(kv_all_free(e), "%s: every KV block comes back (%d of %d free)",
       what, nalar_engine_kv(e)->n_free, nalar_engine_kv(e)->n_blocks);
    for (int i = 0; i < n_req; i++) {
        nalar_request_unref(reqs[i]);
    }
}


static void
test_step_failures(const char *path)
{
    nalar_engine *e = engine_running(path, 3);

    if (e == NULL) {
        ok(0, "engine for the failure tests");
        return;
    }
    /* a fresh engine allocates its logit rows in its first step */
    check_step_failure(e, NALAR_FAULT_LOGITS, 1, 3, "logits allocation",
                       "out of memory");
    check_step_failure(e, NALAR_FAULT_BATCH, 4, 4,
                       "batch allocation mid-generation", "out of memory");
    check_step_failure(e, NALAR_FAULT_BATCH, 1, 4, "batch allocation at "
                       "the first step", "out of memory");
    check_step_failure(e, NALAR_FAULT_FORWARD, 3, 4, "forward pass",
                       "injected failure");
    /* and the engine still works */
    check_batch(e, 0, "after the failures", 0);
    nalar_engine_destroy(e);
}


/*
 * A started engine: a request submitted just as a step found nothing to
 * run is served; submitting and cancelling from several threads at once
 * never fails a request (none ends with an error: the pool holds every
 * one of them) and leaves every KV block free; a failed step there
 * finishes its running requests with the error and the engine serves the
 * next ones.
 */
typedef struct {
    nalar_engine  *e;
    nalar_request *late;             /* submitted from the idle hook */
    int            late_rc;
    int            late_done;        /* engine thread only */
} idle_ctx;


static void
on_idle(void *arg)
{
    idle_ctx  *c = arg;
    nalar_err  err;

    if (c->late != NULL && !c->late_done) {
        /* the racy moment: a request arriving after the step found the
         * running set empty */
        c->late_done = 1;
        c->late_rc = nalar_engine_submit(c->e, c->late, &err);
        return;
    }
    /* widen the window between a step that found nothing and the engine's
     * next look at its queue, where other threads submit (the outcome
     * must not depend on it: only how often the moment is tried) */
    {
        struct timespec ts = { 0, 1000000 };

        nanosleep(&ts, NULL);
    }
}


#define STRESS_THREADS 4
#define STRESS_ITERS   40

typedef struct {
    nalar_engine  *e;
    board         *b;
    unsigned       seed;
    nalar_request *reqs[STRESS_ITERS];
    watched        w[STRESS_ITERS];
    int            n, refused;
} stress_arg;


static void *
stress_thread(void *arg)
{
    stress_arg *a = arg;

    for (int i = 0; i < STRESS_ITERS; i++) {
        int32_t        prompt[16];
        int            n_prompt = 1 + rand_r(&a->seed) % 16;
        int            how = rand_r(&a->seed) % 4;
        nalar_request *r;
        nalar_err      err;

        prompt[0] = 1;
        for (int k = 1; k < n_prompt; k++) {
            prompt[k] = 259 + rand_r(&a->seed) % 1700;
        }
        r = watched_req(prompt, n_prompt, 1 + rand_r(&a->seed) % 3,
                        &a->w[i], a->b);
        if (r == NULL || nalar_engine_submit(a->e, r, &err) != 0) {
            a->refused++;
            nalar_request_unref(r);
            continue;
        }
        a->reqs[a->n++] = r;
        if (how == 0) {
            nalar_request_cancel(r);          /* before the engine sees it */
        } else if (how == 1) {
            sched_yield();
            nalar_request_cancel(r);
        } else if (how == 2 && a->n > 1) {
            nalar_request_cancel(a->reqs[rand_r(&a->seed) % a->n]);
        }
        if (rand_r(&a->seed) % 2) {
            sched_yield();
        }
    }
    return NULL;
}


static void
test_concurrency(const char *path)
{
    nalar_engine   *e = engine_running(path, 0);
    idle_ctx        ic;
    board           b;
    watched         wa, wl;
    nalar_request  *a, *late;
    nalar_err       err;
    stress_arg     *sa;
    pthread_t       th[STRESS_THREADS];
    int             total = 0, refused = 0, bad = 0, started;

    if (e == NULL) {
        ok(0, "engine for the concurrency tests");
        return;
    }
    board_init(&b);
    memset(&ic, 0, sizeof(ic));
    ic.e = e;
    /* a cancelled request wakes the engine, whose step then finds
     * nothing to run; the idle hook submits `late` at that moment */
    a = watched_req(refs[0].prompt_ids, refs[0].n_prompt, 4, &wa, &b);
    late = watched_req(refs[1].prompt_ids, refs[1].n_prompt, 4, &wl, &b);
    ic.late = late;
    nalar_engine_test_idle(e, on_idle, &ic);
    nalar_request_cancel(a);
    ok(nalar_engine_submit(e, a, &err) == 0, "submit a cancelled request");
    started = nalar_engine_start(e, &err) == 0;
    ok(started, "engine starts");
    if (!started) {
        nalar_request_unref(a);
        nalar_request_unref(late);
        nalar_engine_destroy(e);
        return;
    }
    ok(board_wait(&b, 2), "both finish");
    is_int(ic.late_rc, 0, "the late request was submitted from the idle "
           "moment");
    is_int(wa.finish, NALAR_FINISH_CANCELLED, "the cancelled one ends "
           "cancelled");
    is_int(wl.finish, NALAR_FINISH_LENGTH, "the late one is served, not "
           "failed ('%s')", wl.error);
    nalar_request_unref(a);
    nalar_request_unref(late);

    /* several threads submitting and cancelling at random */
    board_init(&b);
    sa = calloc(STRESS_THREADS, sizeof(*sa));
    for (int t = 0; t < STRESS_THREADS; t++) {
        sa[t].e = e;
        sa[t].b = &b;
        sa[t].seed = 1234u + 7u * (unsigned) t;
        pthread_create(&th[t], NULL, stress_thread, &sa[t]);
    }
    for (int t = 0; t < STRESS_THREADS; t++) {
        pthread_join(th[t], NULL);
        total += sa[t].n;
        refused += sa[t].refused;
    }
    ok(board_wait(&b, total), "stress: all %d requests finish", total);
    is_int(refused, 0, "stress: no submission refused");
    is_int(b.errors, 0, "stress: no request failed (last error: '%s')",
           b.error);
    for (int t = 0; t < STRESS_THREADS; t++) {
        for (int i = 0; i < sa[t].n; i++) {
            nalar_finish f = sa[t].w[i].finish;

            bad += f != NALAR_FINISH_LENGTH && f != NALAR_FINISH_CANCELLED;
            nalar_request_unref(sa[t].reqs[i]);
        }
    }
    is_int(bad, 0, "stress: each ends by length or cancelled");
    ok(kv_all_free(e), "stress: every KV block is free at the end");
    free(sa);

    /* a failed step on the engine thread */
    {
        nalar_request *r[3];
        watched        w[3];
        int            errors = 0;

        board_init(&b);
        nalar_engine_test_fault(e, NALAR_FAULT_BATCH, 3);
        for (int i = 0; i < 2; i++) {
            r[i] = watched_req(refs[i].prompt_ids, refs[i].n_prompt, 12,
                               &w[i], &b);
            nalar_engine_submit(e, r[i], &err);
        }
        ok(board_wait(&b, 2), "started engine, failed step: both finish");
        for (int i = 0; i < 2; i++) {
            errors += w[i].finish == NALAR_FINISH_ERROR;
        }
        is_int(errors, 2, "started engine, failed step: both end with the "
               "error ('%s')", w[0].error);
        ok(kv_all_free(e), "started engine, failed step: every KV block "
           "comes back");
        r[2] = watched_req(refs[2].prompt_ids, refs[2].n_prompt, 4, &w[2],
                           &b);
        nalar_engine_submit(e, r[2], &err);
        ok(board_wait(&b, 3), "the next request finishes");
        is_int(w[2].finish, NALAR_FINISH_LENGTH, "and is served");
        for (int i = 0; i < 3; i++) {
            nalar_request_unref(r[i]);
        }
    }
    nalar_engine_destroy(e);
}


/*
 * n requests made with one shared prompt text (nalar_prompt_create) hold
 * one copy between them, which the engine frees with the last of them
 * (the creator lets go first; ASan sees no leak and no use after free),
 * and each answers as a request given its own copy of the text.
 */
static void
test_shared_prompt(nalar_engine *e)
{
    enum { NCH = 8 };
    static const char    line[] = "And God said, Let there be light: and "
                                  "there was light. ";
    char                 text[30 * sizeof(line)];
    nalar_tok_text       piece;
    nalar_prompt        *pr;
    nalar_request       *rs[NCH + 1];
    nalar_request_params p;
    nalar_err            err;
    collected           *c = calloc(NCH + 1, sizeof(collected));
    uint64_t             before, copies;
    int                  good = 1;

    if (c == NULL) {
        ok(0, "shared prompt: memory");
        return;
    }
    text[0] = '\0';
    for (int i = 0; i < 30; i++) {
        strcat(text, line);
    }
    piece.text = text;
    piece.len = strlen(text);
    piece.special = 0;
    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.max_tokens = 8;
    p.ignore_eos = 1;

    /* the reference: the text copied into its own request */
    p.prompt_text = &piece;
    p.n_prompt_text = 1;
    before = nalar_test_prompt_copies();
    rs[NCH] = nalar_request_create(&p, collect, &c[NCH], &err);
    is_int((int) (nalar_test_prompt_copies() - before), 1,
           "a request given prompt_text copies it");

    before = nalar_test_prompt_copies();
    pr = nalar_prompt_create(&piece, 1, &err);
    p.prompt_text = NULL;
    p.prompt_shared = pr;
    for (int i = 0; i < NCH; i++) {
        rs[i] = nalar_request_create(&p, collect, &c[i], &err);
        good &= rs[i] != NULL;
    }
    nalar_prompt_unref(pr);
    copies = nalar_test_prompt_copies() - before;
    ok(good && copies == 1, "%d requests of %zu bytes of text: %llu copy",
       NCH, piece.len, (unsigned long long) copies);
    memset(text, 'x', piece.len);   /* the requests hold their own */

    nalar_engine_run_sync(e, rs, NCH + 1, &err);
    ok(c[NCH].n == 8 && c[NCH].last.usage.n_prompt > 300,
       "the reference: a %d-token prompt, 8 tokens", c[NCH].last.usage.n_prompt);
    for (int i = 0; i < NCH; i++) {
        good &= c[i].n == 8 && same(c[i].ids, c[NCH].ids, 8)
                && c[i].last.usage.n_prompt == c[NCH].last.usage.n_prompt;
    }
    ok(good, "each of the %d answers as the request with its own copy", NCH);
    for (int i = 0; i <= NCH; i++) {
        nalar_request_unref(rs[i]);
    }
    ok(kv_all_free(e), "shared prompt: every KV block free");
    free(c);
}


/* EOS stops generation unless ignored; cancellation frees KV; a prompt
 * as long as the context is refused at intake; then the text prompts,
 * the intake order and a shared prompt on the same engine */
static void
test_eos_cancel(const char *path)
{
    nalar_engine *e = engine(path, 512, 0, 2);

    if (e == NULL) {
        ok(0, "engine for EOS and cancellation");
        return;
    }
    {
    nalar_request_params p;
    nalar_request       *r, *r2;
    collected            c, c2;
    nalar_err            err;

    memset(&p, 0, sizeof(p));
    nalar_sampling_default(&p.sampling);
    p.sampling.temperature = 0;
    p.prompt = refs[0].prompt_ids;
    p.n_prompt = refs[0].n_prompt;
    p.max_tokens = N_REF;
    memset(&c, 0, sizeof(c));
    r = nalar_request_create(&p, collect, &c, &err);
    nalar_engine_run_sync(e, &r, 1, &err);
    /* reference: first EOS at generated position 26 */
    is_int(c.n, 27, "stops at EOS (26 tokens + EOS)");
    is_int(c.finish, NALAR_FINISH_STOP, "finish is stop");
    ok(strstr(c.text, "-- Mark Twain") != NULL
       && strstr(c.text, "The only") == NULL,
       "text ends at the EOS: '%s'", c.text);
    nalar_request_unref(r);

    r = greedy_req(refs[1].prompt_ids, refs[1].n_prompt, 400, &c);
    r2 = greedy_req(refs[2].prompt_ids, refs[2].n_prompt, 10, &c2);
    nalar_request_cancel(r);
    {
        nalar_request *both[2] = { r, r2 };
        nalar_engine_run_sync(e, both, 2, &err);
    }
    is_int(c.finish, NALAR_FINISH_CANCELLED, "cancelled request ends "
           "cancelled");
    is_int(c2.n, 10, "its neighbour completes");
    ok(kv_all_free(e), "cancellation returns KV blocks");
    nalar_request_unref(r);
    nalar_request_unref(r2);

    /* a prompt as long as the context is refused at intake: the
     * request finishes with the error, its status and code */
    {
        int32_t *big = calloc(600, sizeof(int32_t));

        for (int i = 0; i < 600; i++) big[i] = 300;
        r = greedy_req(big, 600, 4, &c);
        ok(nalar_engine_submit(e, r, &err) == 0, "submit takes it");
        nalar_engine_run_sync(e, NULL, 0, &err);
        ok(c.finish == NALAR_FINISH_ERROR && c.last.error.status == 400
           && strcmp(c.last.error.code, "context_length_exceeded") == 0
           && strcmp(c.last.error.param, "prompt") == 0
           && strstr(c.last.error.message, "maximum context length is 512")
              != NULL,
           "over-long prompt refused: %s", c.last.error.message);
        is_int(c.last.usage.n_prompt, 600, "with its length");
        ok(!c.last.accepted, "never accepted");
        ok(kv_all_free(e), "no KV block held");
        nalar_request_unref(r);
        free(big);
    }
    test_text_prompts(e);
    test_intake_order(e);
    test_shared_prompt(e);
    }
    nalar_engine_destroy(e);
}


int
main(void)
{
    const char   *tf32 = "models/nalar-kjv-target-f32.gguf";
    const char   *tf16 = "models/nalar-kjv-target-f16.gguf";
    const char   *df32 = "models/nalar-kjv-draft-f32.gguf";
    nalar_engine *e;

    test_kv_pool();

    /* tokenizer agrees with the reference prompt ids */
    e = engine(tf32, 512, 0, 2);
    ok(e != NULL, "target F32 loads");
    if (e == NULL) {
        return done_testing();
    }
    for (int k = 0; k < N_CASES; k++) {
        nalar_model *m = nalar_engine_model(e);
        int32_t      ids[32];
        int          n = nalar_tokenize(m->tok, refs[k].prompt,
                                        strlen(refs[k].prompt), 1, 0, ids,
                                        32);

        ok(n == refs[k].n_prompt && same(ids, refs[k].prompt_ids, n),
           "prompt '%s' tokenizes to the reference ids", refs[k].prompt);
    }

    /* each prompt alone */
    for (int k = 0; k < N_CASES; k++) {
        collected      c;
        nalar_request *r = greedy_req(refs[k].prompt_ids, refs[k].n_prompt,
                                      N_REF, &c);
        nalar_err      err;

        nalar_engine_run_sync(e, &r, 1, &err);
        ok(c.n == N_REF && same(c.ids, refs[k].target, N_REF),
           "target F32 alone: '%s'", refs[k].prompt);
        is_int(c.finish, NALAR_FINISH_LENGTH, "finish is length");
        nalar_request_unref(r);
    }
    check_argmax_path(tf32);
    check_batch(e, 0, "target F32 batched (3)", 0);
    check_batch(e, 0, "target F32 batched with 5 others", 5);
    nalar_engine_destroy(e);

    e = engine(tf32, 3, 0, 2);
    check_batch(e, 0, "target F32 chunked prefill (3 tokens/step)", 3);
    nalar_engine_destroy(e);

    e = engine(tf32, 512, 0, 1);
    check_batch(e, 0, "target F32 one thread", 2);
    nalar_engine_destroy(e);

    /* a pool of 12 blocks forces preemption and recompute */
    {
        nalar_model *m;
        int64_t      bb;

        e = engine(tf32, 64, 1 << 20, 2);
        m = nalar_engine_model(e);
        bb = 2LL * m->cfg.n_layers * NALAR_KV_BLOCK * m->cfg.n_kv_heads
             * m->cfg.head_dim * 4;
        nalar_engine_destroy(e);
        e = engine(tf32, 64, 12 * bb, 2);
        check_batch(e, 0, "target F32 with preemption (12 KV blocks)", 4);
        {
            nalar_metrics mt;

            nalar_engine_metrics(e, &mt);
            ok(mt.preemptions_total > 0, "preemption happened (%llu)",
               (unsigned long long) mt.preemptions_total);
        }
        check_kv_admission(e, 12 * NALAR_KV_BLOCK);
        nalar_engine_destroy(e);
    }

    e = engine(tf16, 512, 0, 2);
    ok(e != NULL, "target F16 loads");
    if (e != NULL) {
        check_batch(e, 0, "target F16 batched", 2);
        nalar_engine_destroy(e);
    }
    e = engine(df32, 512, 0, 2);
    ok(e != NULL, "draft F32 loads");
    if (e != NULL) {
        check_batch(e, 1, "draft F32 batched", 2);
        nalar_engine_destroy(e);
    }

    test_eos_cancel(tf32);

    test_step_failures(tf32);
    test_concurrency(tf32);
    return done_testing();
}
