/*
 * nalar-cuda-check: greedy generation with the CUDA backend against the
 * CPU backend, token for token, and the model conformance kit's files
 * teacher-forced on the CUDA backend.
 */
#include "cuda_check.h"


/* --- greedy generation: the CUDA backend against the CPU backend --- */

#include "collect.h"


/* four prompts (5..300 tokens, chunked at 64 tokens a step, so prefill
 * chunks meet decode steps in one batch) generating 48 tokens each */
static int
generate(const char *path, const char *backend, int32_t gemv_max,
         collected out[4])
{
    static const int   lens[4] = { 5, 40, 120, 300 };
    nalar_engine_opts  o;
    nalar_engine      *e;
    nalar_request     *reqs[4];
    int32_t            prompt[300];
    nalar_err          err;
    int                rc = 0;

    prompt[0] = 1;                              /* BOS */
    for (int i = 1; i < 300; i++) {
        prompt[i] = 259 + (i * 37 + 11) % 1700;
    }
    memset(&o, 0, sizeof(o));
    o.model_path = path;
    o.backend = backend;
    o.max_batch_tokens = 64;
    o.gpu_gemv_max = gemv_max;
    e = nalar_engine_create(&o, &err);
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        printf("#    %s on %s: %s\n", backend, path, err.msg);
        nalar_engine_destroy(e);
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        nalar_request_params p;

        memset(&p, 0, sizeof(p));
        nalar_sampling_default(&p.sampling);
        p.sampling.temperature = 0;
        p.prompt = prompt;
        p.n_prompt = lens[k];
        p.max_tokens = 48;
        p.ignore_eos = 1;
        memset(&out[k], 0, sizeof(out[k]));
        reqs[k] = nalar_request_create(&p, collect, &out[k], &err);
        if (reqs[k] == NULL) {
            die("request", err.msg);
        }
    }
    if (nalar_engine_run_sync(e, reqs, 4, &err) != 0) {
        printf("#    %s run: %s\n", backend, err.msg);
        rc = -1;
    }
    for (int k = 0; k < 4; k++) {
        nalar_request_unref(reqs[k]);
    }
    nalar_engine_destroy(e);
    return rc;
}


void
check_greedy(const char *dir, const char *file, int strict,
             int32_t gemv_max)
{
    char      path[1024], shape[128];
    collected cpu[4], gpu[4];
    int       first = -1, which = -1;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    if (generate(path, "cpu", 0, cpu) != 0
        || generate(path, "cuda", gemv_max, gpu) != 0)
    {
        report_eq("greedy", file, 0, "generation failed");
        return;
    }
    for (int k = 0; k < 4 && first < 0; k++) {
        for (int i = 0; i < 48; i++) {
            if (i >= cpu[k].n || i >= gpu[k].n
                || cpu[k].ids[i] != gpu[k].ids[i])
            {
                first = i;
                which = k;
                break;
            }
        }
    }
    snprintf(shape, sizeof(shape), "%s, 4 prompts x 48 tokens, gemv<=%d",
             file, gemv_max > 0 ? (int) gemv_max : 8);
    if (first >= 0 && !strict) {
        printf("WARN %-14s %-58s prompt %d differs from token %d (not "
               "counted)\n", "greedy", shape, which, first);
        return;
    }
    report_eq("greedy", shape, first < 0, "token ids differ from the CPU");
    if (first >= 0) {
        printf("#    prompt %d, first difference at token %d: cpu %d, cuda "
               "%d\n", which, first, cpu[which].ids[first],
               gpu[which].ids[first]);
    }
}


/*
 * The kit's files and their types' tolerances (t/c/test_conformance.c's).
 * blocked: ggml's block types (Q4_0, Q4_K, Q5_K, Q6_K; a Q4_K_M file
 * mixes Q4_K and Q6_K, its output head and fused q|k|v parts included):
 * their greedy run is compared with the CPU's but not counted, as the two
 * backends' products of dequantized weights sum in different orders and
 * a random-weight model's near-ties may fall either way; the logits'
 * tolerance is what holds them.
 */
static const struct {
    const char *file;
    double      tol;
    int         blocked;
} conf_files[] = {
    { "llama-F16", 0.027, 0 }, { "llama3-F32", 0.015, 0 },
    { "llama3-F16", 0.027, 0 }, { "llama3-BF16", 0.083, 0 },
    { "llama3-Q8_0", 0.25, 0 }, { "qwen2-F16", 0.027, 0 },
    { "qwen3-F16", 0.027, 0 }, { "gemma2-F16", 0.027, 0 },
    { "phi3-F16", 0.027, 0 },
    { "llama-Q4_K_M", 0.65, 1 }, { "qwen2-Q4_K_M", 0.65, 1 },
    { "llama3-Q4_0", 0.27, 1 }, { "llama3-Q4_K_M", 0.65, 1 },
    { "llama3-Q5_K_M", 0.37, 1 }, { "llama3-Q6_K", 0.38, 1 },
    { "qwen3-Q4_K_M", 0.65, 1 }, { "gemma2-Q4_K_M", 0.65, 1 },
    { "phi3-Q4_K_M", 0.65, 1 },
};


/* One file's three 64-position sequences on the CUDA backend, one pass
 * each; the largest |logit - reference| at the reference's top-16 ids
 * (INFINITY when something fails) */
static double
conformance_err(const char *dir, const char *base, ggml_type kv_type)
{
    char               path[1024];
    json_t            *ref, *seqs, *tch;
    json_error_t       jerr;
    nalar_model       *m;
    nalar_backend     *be = NULL;
    nalar_backend_opts bo;
    nalar_kv_pool      kv;
    nalar_err          err;
    float             *logits = NULL;
    double             worst = 0;
    int32_t            V;

    snprintf(path, sizeof(path), "%s/%s.ref.json", dir, base);
    ref = json_load_file(path, 0, &jerr);
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, base);
    m = ref != NULL ? nalar_model_load(path, &err) : NULL;
    if (m == NULL) {
        printf("#    %s: %s\n", base, ref == NULL ? jerr.text : err.msg);
        json_decref(ref);
        return INFINITY;
    }
    memset(&bo, 0, sizeof(bo));
    memset(&kv, 0, sizeof(kv));
    bo.name = "cuda";
    bo.gemv_max = 1000000;                 /* FP32 activations */
    bo.kv_type = kv_type;
    V = m->cfg.n_vocab;
    seqs = json_object_get(ref, "sequences");
    tch = json_object_get(ref, "teacher");
    be = nalar_backend_create(m, &bo, &err);
    logits = malloc((size_t) 64 * V * sizeof(float));
    if (be == NULL || logits == NULL
        || nalar_kv_pool_init(&kv, 4, m->cfg.n_layers,
                              m->cfg.n_kv_heads * m->cfg.head_dim, &err) != 0
        || be->kv_alloc(be, &kv, &err) != 0)
    {
        printf("#    %s: %s\n", base, err.msg);
        worst = INFINITY;
    }
    for (size_t s = 0; worst < INFINITY && s < json_array_size(seqs); s++) {
        json_t       *ids = json_object_get(json_array_get(seqs, s), "ids");
        json_t       *ti = json_object_get(json_array_get(tch, s), "top_ids");
        json_t       *tl = json_object_get(json_array_get(tch, s),
                                           "top_logits");
        int32_t       tok[64], pos[64];
        int8_t        want[64];
        nalar_seq_kv *seq[64], sq;
        nalar_batch   b;

        nalar_seq_kv_init(&sq);
        if (json_array_size(ids) != 64 || nalar_seq_kv_reserve(&kv, &sq, 64))
        {
            worst = INFINITY;
            break;
        }
        for (int i = 0; i < 64; i++) {
            tok[i] = (int32_t) json_integer_value(json_array_get(ids, i));
            pos[i] = i;
            want[i] = 1;
            seq[i] = &sq;
        }
        b.n_tokens = 64;
        b.tokens = tok;
        b.pos = pos;
        b.seq = seq;
        b.want_logits = want;
        b.n_logits = 64;
        b.adapter = NULL;
        if (be->forward(be, &kv, &b, logits, &err) != 0) {
            printf("#    %s: %s\n", base, err.msg);
            worst = INFINITY;
        }
        for (int p = 0; worst < INFINITY && p < 64; p++) {
            for (int k = 0; k < 16; k++) {
                json_int_t id = json_integer_value(
                    json_array_get(json_array_get(ti, p), k));
                double     want_l = json_number_value(
                    json_array_get(json_array_get(tl, p), k));
                double     e = id >= 0 && id < V
                               ? fabs(logits[(size_t) p * V + id] - want_l)
                               : INFINITY;

                worst = e <= worst ? worst : (isnan(e) ? INFINITY : e);
            }
        }
        nalar_seq_kv_release(&kv, &sq);
    }
    if (kv.k != NULL) {
        be->kv_free(be, &kv);
    }
    nalar_kv_pool_free(&kv);
    if (be != NULL) {
        be->destroy(be);
    }
    free(logits);
    nalar_model_destroy(m);
    json_decref(ref);
    return worst;
}


void
check_conformance(const char *dir)
{
    for (size_t i = 0; i < sizeof(conf_files) / sizeof(conf_files[0]); i++)
    {
        char gguf[256];

        report("conformance", conf_files[i].file,
               conformance_err(dir, conf_files[i].file, GGML_F32),
               conf_files[i].tol);
        snprintf(gguf, sizeof(gguf), "%s.gguf", conf_files[i].file);
        check_greedy(dir, gguf, !conf_files[i].blocked, 1000000);
    }
    /* a BF16 KV cache: K and V rounded to 8 significant bits (relative
     * error up to 2^-9) before attention reads them; the logits may move
     * by that much of their attention's share more than the type's own
     * tolerance */
    for (size_t i = 0; i < sizeof(conf_files) / sizeof(conf_files[0]); i++)
    {
        char name[128];

        snprintf(name, sizeof(name), "%s, kv bf16", conf_files[i].file);
        report("conformance", name,
               conformance_err(dir, conf_files[i].file, GGML_BF16),
               conf_files[i].tol + THR_KV_BF16);
    }
}
