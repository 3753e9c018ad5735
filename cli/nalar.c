/*
 * nalar: command-line tool over the engine.
 *
 *   nalar generate -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K]
 *                  [--top-p P] [--min-p P] [--seed S] [--ids] [--ignore-eos]
 *                  [--stop STR] [-t THREADS] [--chunk N] [--backend NAME]
 *                  [--kv-type f32|f16|bf16]
 *                  [--lora NAME=PATH[:SCALE] ...] [--adapter NAME]
 *   nalar tokenize -m MODEL [--no-bos] [--special] TEXT
 *   nalar eval -m MODEL --ids "ID ..." [--top K] [--backend NAME]
 *              [--device N] [-t THREADS] [--lora PATH[:SCALE]]
 *   nalar inspect MODEL
 *   nalar mkmodel [--dim D --layers L --heads H --kv-heads K --ffn F
 *                  --vocab V --ctx C --type TYPE --seed S
 *                  --bpe --chatml --pre NAME --control-tokens A,B
 *                  --vocab-from FILE --chat-template FILE
 *                  --arch llama|qwen2|qwen3|gemma2|phi3 --window N]
 *                  -o FILE
 *   nalar mkmodel --lora-of BASE --rank R [--alpha A] [--seed S]
 *                 [--type f32|f16|bf16|q8_0] [--targets q,k,v,o,gate,up,down]
 *                 -o FILE
 *   nalar mkmodel --merge BASE --lora ADAPTER [--scale S] -o FILE
 *   nalar bench -m MODEL [-p 128] [-n 128] [-b 1,4,16] [-t THREADS] [--json]
 *               [--cpu-activations f32|i16|q8|pairs] [--kv-type f32|f16|bf16]
 *               [--ctx 16]
 */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_backend.h"
#include "clock.h"
#ifdef NALAR_CUDA
#include "cuda_backend.h"
#endif
#include "bench.h"
#include "engine.h"
#include "eval.h"
#include "gguf.h"
#include "mkmodel.h"
#include "opts.h"
#include "render.h"
#include "model.h"
#include "sampler.h"
#include "tokenizer.h"


static void
usage(FILE *out)
{
    fprintf(out,
        "usage:\n"
        "  nalar generate -m MODEL [-p PROMPT] [-n N] [--temp T] [--top-k K]"
        " [--top-p P]\n"
        "                 [--min-p P] [--seed S] [--ids] [--ignore-eos]"
        " [--stop STR]\n"
        "                 [-t THREADS] [--chunk N] [--backend cpu|cuda]"
        " [--device N]\n"
        "                 [--gpu-memory FRACTION|BYTES] [--gpu-gemv-max N]"
        " [--draft FILE]\n"
        "                 [--spec off|draft|ngram|auto] [--spec-k K]"
        " [--cpu-activations f32|i16|q8|pairs]\n"
        "                 [--kv-type f32|f16|bf16]"
        " [--lora NAME=PATH[:SCALE] ...] [--adapter NAME]\n"
        "  nalar tokenize -m MODEL [--no-bos] [--special] TEXT\n"
        "  nalar eval -m MODEL --ids \"ID ...\" [--top K] [--backend cpu|cuda]"
        " [--device N]\n"
        "                 [-t THREADS] [--cpu-activations f32|i16|q8|pairs]"
        " [--kv-type f32|f16|bf16]\n"
        "                 [--lora PATH[:SCALE]]\n"
        "  nalar inspect MODEL\n"
        "  nalar render [-m MODEL] [--template FILE] --messages FILE.json"
        " [--tools FILE.json]\n"
        "                 [--kwargs JSON] [--bos TEXT] [--eos TEXT]"
        " [--now SECONDS]\n"
        "                 [--no-generation-prompt] [--openai]"
        " [--spans | --ids]\n"
        "  nalar mkmodel [--dim D --layers L --heads H --kv-heads K --ffn F"
        " --vocab V\n"
        "                 --ctx C --type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k"
        "|q4_k_m|q5_k_m\n"
        "                 --seed S --bpe --chatml --pre NAME --control-tokens A,B\n"
        "                 --vocab-from FILE --chat-template FILE\n"
        "                 --arch llama|qwen2|qwen3|gemma2|phi3 --window N] -o FILE\n"
        "  nalar mkmodel --lora-of BASE --rank R [--alpha A] [--seed S]"
        " [--type f32|f16|bf16|q8_0]\n"
        "                 [--targets q,k,v,o,gate,up,down] -o FILE"
        "   (a random LoRA adapter)\n"
        "  nalar mkmodel --merge BASE --lora ADAPTER [--scale S] -o FILE"
        "   (base + scale B A;\n"
        "                 adapted matrices written in F32, whatever the base's"
        " type)\n"
        "  nalar bench -m MODEL [-p 128] [-n 128] [-b 1,4,16] [-t THREADS]"
        " [--json]\n"
        "                 [--cpu-activations f32|i16|q8|pairs]"
        " [--kv-type f32|f16|bf16] [--ctx 16]\n"
        "  nalar bench --backend cuda [-m MODEL | --synthetic"
        " llama3-8b|llama3-1b|tiny]\n"
        "                 [-b 1,8,32] [--gpu-gemv-max N] [--json]"
        "   (CUDA builds)\n"
        "  nalar spec-bench -m MODEL [--draft FILE]"
        " [--task prompts|edit|edit-spans|edit-rename]\n"
        "                 [-b 1,4,16] [-k 0,1,2,4,8] [-n 96] [-t THREADS]"
        " [--reps 5]\n"
        "                 [--only draft|auto|ngram|prediction...] [--json]\n"
        "  nalar prefix-bench -m MODEL [-p 1500] [-n 16] [-t THREADS]"
        " [--json]\n"
        "  nalar verify-bench -m MODEL [--pos 200] [-t THREADS] [--json]\n"
        "  nalar --help\n");
}


static int32_t *
tokenize_text(const nalar_tokenizer *tok, const char *text, int add_bos,
              int special, int *n)
{
    nalar_tok_text  piece = { text, strlen(text), special };
    int32_t        *ids;
    int             more;

    *n = nalar_tokenize_bounded(tok, &piece, 1, add_bos, INT_MAX - 1, &ids,
                                &more);
    if (*n < 0 || more) {
        free(ids);
        return NULL;
    }
    if (ids == NULL) {
        ids = malloc(sizeof(int32_t));
    }
    return ids;
}


/* --- generate --- */

typedef struct {
    int print_ids;
    int first_id;
    int failed;
} gen_state;


static void
gen_notify(nalar_request *r, void *ctx)
{
    gen_state   *g = ctx;
    nalar_output out;

    if (!nalar_request_take(r, &out)) {
        nalar_output_free(&out);
        return;
    }
    if (g->print_ids) {
        for (int32_t i = 0; i < out.n_ids; i++) {
            printf(g->first_id ? "%d" : " %d", out.ids[i]);
            g->first_id = 0;
        }
    } else {
        fwrite(out.text, 1, out.text_len, stdout);
    }
    fflush(stdout);
    if (out.finish == NALAR_FINISH_ERROR) {
        fprintf(stderr, "nalar: %s\n", out.error.message);
        g->failed = 1;
    }
    nalar_output_free(&out);
}


/*
 * --lora NAME=PATH[:SCALE] into lo[] (names and paths in buf, which the
 * caller frees), and --adapter NAME into its id (0: none).  0, or 2 after
 * a message.
 */
static int
parse_loras(const char **specs, int n, nalar_engine_lora *lo, const char *adapter,
            int32_t *id, char **buf)
{
    size_t len = 0;
    char  *p;

    *id = 0;
    for (int i = 0; i < n; i++) {
        len += strlen(specs[i]) + 1;
    }
    *buf = p = malloc(len + 1);
    if (p == NULL) {
        fprintf(stderr, "nalar: out of memory\n");
        return 2;
    }
    for (int i = 0; i < n; i++) {
        char *eq, *colon, *end;

        strcpy(p, specs[i]);
        eq = strchr(p, '=');
        if (eq == NULL || eq == p || eq[1] == '\0') {
            fprintf(stderr, "nalar generate: --lora NAME=PATH[:SCALE], not "
                    "'%s'\n", specs[i]);
            return 2;
        }
        *eq = '\0';
        lo[i].name = p;
        lo[i].path = eq + 1;
        lo[i].scale = 1;
        colon = strrchr(eq + 1, ':');
        if (colon != NULL) {
            double s = strtod(colon + 1, &end);

            if (end != colon + 1 && *end == '\0') {
                if (!(s > 0) || !isfinite(s)) {
                    fprintf(stderr, "nalar generate: --lora %s: scale must "
                            "be > 0\n", specs[i]);
                    return 2;
                }
                lo[i].scale = s;
                *colon = '\0';
            }
        }
        if (adapter != NULL && strcmp(adapter, lo[i].name) == 0) {
            *id = i + 1;
        }
        p += strlen(specs[i]) + 1;
    }
    if (adapter != NULL && *id == 0) {
        fprintf(stderr, "nalar generate: --adapter %s names no --lora\n",
                adapter);
        return 2;
    }
    return 0;
}


static int
cmd_generate(int argc, char **argv)
{
    const char          *model = NULL, *prompt = "";
    const char          *stops[16];
    nalar_engine_opts    eo;
    nalar_request_params rp;
    nalar_engine        *e;
    nalar_request       *r;
    nalar_err            err;
    nalar_model         *m;
    gen_state            g = { 0, 1, 0 };
    int32_t             *ids;
    int                  n_ids, n_stop = 0, n_lora = 0;
    const char          *lora_specs[8];
    char                *lora_buf = NULL;
    nalar_engine_lora    loras[8];

    memset(&eo, 0, sizeof(eo));
    memset(&rp, 0, sizeof(rp));
    nalar_sampling_default(&rp.sampling);
    rp.max_tokens = 128;
    {
        const char      *spec = NULL, *act = NULL, *adapter = NULL;
        const char      *kvt = NULL;
        const nalar_opt  opts[] = {
            { "-m", NULL, NALAR_OPT_STR, &model, NULL, 0 },
            { "--lora", NULL, NALAR_OPT_STRS, lora_specs, &n_lora, 8 },
            { "--adapter", NULL, NALAR_OPT_STR, &adapter, NULL, 0 },
            { "-p", NULL, NALAR_OPT_STR, &prompt, NULL, 0 },
            { "-n", NULL, NALAR_OPT_INT, &rp.max_tokens, NULL, 0 },
            { "--temp", NULL, NALAR_OPT_FLOAT, &rp.sampling.temperature,
              NULL, 0 },
            { "--top-k", NULL, NALAR_OPT_INT, &rp.sampling.top_k, NULL, 0 },
            { "--top-p", NULL, NALAR_OPT_FLOAT, &rp.sampling.top_p, NULL,
              0 },
            { "--min-p", NULL, NALAR_OPT_FLOAT, &rp.sampling.min_p, NULL,
              0 },
            { "--seed", NULL, NALAR_OPT_U64, &rp.sampling.seed, NULL, 0 },
            { "--stop", NULL, NALAR_OPT_STRS, stops, &n_stop, 16 },
            { "-t", "--threads", NALAR_OPT_INT, &eo.n_threads, NULL, 0 },
            { "--chunk", NULL, NALAR_OPT_INT, &eo.max_batch_tokens, NULL,
              0 },
            { "--backend", NULL, NALAR_OPT_STR, &eo.backend, NULL, 0 },
            { "--device", NULL, NALAR_OPT_INT, &eo.device, NULL, 0 },
            { "--gpu-memory", NULL, NALAR_OPT_DOUBLE, &eo.gpu_memory, NULL,
              0 },
            { "--gpu-gemv-max", NULL, NALAR_OPT_INT, &eo.gpu_gemv_max, NULL,
              0 },
            { "--draft", NULL, NALAR_OPT_STR, &eo.draft_path, NULL, 0 },
            { "--spec", NULL, NALAR_OPT_STR, &spec, NULL, 0 },
            { "--spec-k", NULL, NALAR_OPT_INT, &eo.spec_fixed_k, NULL, 0 },
            { "--ids", NULL, NALAR_OPT_FLAG, &g.print_ids, NULL, 0 },
            { "--ignore-eos", NULL, NALAR_OPT_FLAG, &rp.ignore_eos, NULL,
              0 },
            { "--cpu-activations", NULL, NALAR_OPT_STR, &act, NULL, 0 },
            { "--kv-type", NULL, NALAR_OPT_STR, &kvt, NULL, 0 },
        };

        if (NALAR_OPTS_PARSE("generate", argc, argv, opts) != 0) {
            usage(stderr);
            return 2;
        }
        eo.act_i16 = nalar_opt_activations("generate", act, eo.backend);
        eo.kv_type = nalar_opt_kv_type("generate", kvt);
        if (eo.act_i16 < 0 || eo.kv_type < 0) {
            return 2;
        }
        if (parse_loras(lora_specs, n_lora, loras, adapter, &rp.adapter,
                        &lora_buf) != 0)
        {
            free(lora_buf);
            return 2;
        }
        eo.loras = loras;
        eo.n_loras = n_lora;
        /* --spec, else the draft when one is given */
        eo.spec_mode = spec != NULL ? nalar_bench_spec_mode(spec)
                       : eo.draft_path != NULL ? NALAR_SPEC_DRAFT : 0;
        if (eo.spec_mode < 0) {
            fprintf(stderr, "nalar generate: --spec off|draft|ngram|auto\n");
            free(lora_buf);
            return 2;
        }
    }
    if (model == NULL) {
        fprintf(stderr, "nalar generate: -m MODEL is required\n");
        free(lora_buf);
        return 2;
    }
    eo.model_path = model;
    e = nalar_engine_create(&eo, &err);
    free(lora_buf);     /* the engine keeps its own copies */
    if (e == NULL || nalar_engine_run_sync(e, NULL, 0, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        nalar_engine_destroy(e);
        return 1;
    }
    m = nalar_engine_model(e);
    ids = tokenize_text(m->tok, prompt, nalar_tok_add_bos(m->tok), 0, &n_ids);
    if (ids == NULL || n_ids == 0) {
        fprintf(stderr, "nalar: the prompt tokenizes to nothing (and the "
                "model adds no BOS)\n");
        free(ids);
        nalar_engine_destroy(e);
        return 1;
    }
    rp.prompt = ids;
    rp.n_prompt = n_ids;
    rp.stop = stops;
    rp.n_stop = n_stop;
    r = nalar_request_create(&rp, gen_notify, &g, &err);
    free(ids);
    if (r == NULL || nalar_engine_run_sync(e, &r, 1, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        nalar_request_unref(r);
        nalar_engine_destroy(e);
        return 1;
    }
    gen_notify(r, &g);
    printf("\n");
    nalar_request_unref(r);
    nalar_engine_destroy(e);
    return g.failed ? 1 : 0;
}


/* --- tokenize / inspect --- */

static int
cmd_tokenize(int argc, char **argv)
{
    const char       *model = NULL, *text = NULL;
    int               no_bos = 0, special = 0, n;
    gguf_file        *f;
    nalar_tokenizer  *tok;
    nalar_err         err;
    int32_t          *ids;
    const nalar_opt   opts[] = {
        { "-m", NULL, NALAR_OPT_STR, &model, NULL, 0 },
        { "--no-bos", NULL, NALAR_OPT_FLAG, &no_bos, NULL, 0 },
        { "--special", NULL, NALAR_OPT_FLAG, &special, NULL, 0 },
        { NULL, NULL, NALAR_OPT_ARG, &text, NULL, 0 },
    };

    if (NALAR_OPTS_PARSE("tokenize", argc, argv, opts) != 0) {
        return 2;
    }
    if (model == NULL || text == NULL) {
        usage(stderr);
        return 2;
    }
    /* the tokenizer alone: vocabulary-only files work too */
    f = gguf_open(model, &err);
    if (f == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    tok = nalar_tokenizer_create(f, &err);
    gguf_close(f);
    if (tok == NULL) {
        fprintf(stderr, "nalar: %s: %s\n", model, err.msg);
        return 1;
    }
    ids = tokenize_text(tok, text, !no_bos && nalar_tok_add_bos(tok), special,
                        &n);
    if (ids == NULL) {
        fprintf(stderr, "nalar: cannot tokenize\n");
        nalar_tokenizer_destroy(tok);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        printf(i ? " %d" : "%d", ids[i]);
    }
    printf("\n");
    free(ids);
    nalar_tokenizer_destroy(tok);
    return 0;
}


/*
 * The file's tensor types (count and bytes of each) and the bytes the CPU
 * backend keeps resident for the weights: every tensor's bytes as stored
 * (quantized blocks are held as they are, never widened; F16/BF16 norms
 * are widened to F32), to which the KV pool adds its configured size.
 */
static void
print_type_mix(const gguf_file *f)
{
    static const ggml_type order[] = {
        GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q6_K, GGML_Q5_K,
        GGML_Q4_K, GGML_Q4_0
    };
    uint64_t total = 0, params = 0, resident = 0;
    int      first = 1;

    printf("type mix:     ");
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
        uint64_t n = 0, bytes = 0;

        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            uint64_t           ne = 1;

            if (t->type != order[k]) {
                continue;
            }
            for (uint32_t d = 0; d < t->n_dims; d++) {
                ne *= t->ne[d];
            }
            n++;
            bytes += t->nbytes;
            params += ne;
            resident += t->n_dims == 1 && t->type != GGML_F32 ? 4 * ne
                        : t->nbytes;
        }
        if (n > 0) {
            printf("%s %s x%llu (%.2f MiB)", first ? "" : ",",
                   ggml_type_name(order[k]), (unsigned long long) n,
                   (double) bytes / 1048576.0);
            first = 0;
            total += bytes;
        }
    }
    printf("\nweights:       %llu bytes, %.2f bits per parameter\n",
           (unsigned long long) total,
           params > 0 ? 8.0 * (double) total / (double) params : 0.0);
    printf("resident:      %llu bytes of weights on the CPU backend "
           "(blocks as stored), plus the KV pool\n",
           (unsigned long long) resident);
}


static int
cmd_inspect(int argc, char **argv)
{
    nalar_model *m;
    nalar_err    err;
    char        *s;

    if (argc != 2) {
        usage(stderr);
        return 2;
    }
    m = nalar_model_load(argv[1], &err);
    if (m == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    s = nalar_model_describe(m);
    if (s != NULL) {
        fputs(s, stdout);
    }
    free(s);
    print_type_mix(m->gguf);
    nalar_model_destroy(m);
    return 0;
}


/* --- mkmodel --- */

/* The whole of a text file, NUL-terminated (malloc'd); NULL with a message. */
static char *
read_text(const char *path)
{
    FILE   *fp;
    char   *s = NULL, *ns;
    size_t  len = 0, cap = 0, n;

    fp = fopen(path, "rb");
    if (fp == NULL) {
        perror(path);
        return NULL;
    }
    do {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            ns = realloc(s, cap);
            if (ns == NULL) {
                fprintf(stderr, "nalar: %s: out of memory\n", path);
                free(s);
                fclose(fp);
                return NULL;
            }
            s = ns;
        }
        n = fread(s + len, 1, 4096, fp);
        len += n;
    } while (n == 4096);
    if (ferror(fp)) {
        perror(path);
        free(s);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    s[len] = '\0';
    if (strlen(s) != len) {
        /* a GGUF string may hold NUL, but a template never does */
        fprintf(stderr, "nalar: %s: a NUL byte in a chat template\n", path);
        free(s);
        return NULL;
    }
    return s;
}


#define MK_TYPES "f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m, " \
                 "q5_k_m"


/* --lora-of (a random adapter) or --merge (the merged model file) */
static int
mkmodel_lora(const char *lora_of, const char *merge, const char *lora,
             const char *out, const char *type, int rank, float alpha,
             float scale, const char *targets, uint64_t seed)
{
    nalar_mklora_opts o;
    nalar_err         err;
    int               rc;

    if (out == NULL || (lora_of != NULL) == (merge != NULL)) {
        fprintf(stderr, "nalar mkmodel: --lora-of BASE --rank R or --merge "
                "BASE --lora ADAPTER, and -o FILE\n");
        return 2;
    }
    if (merge != NULL) {
        if (lora == NULL || !(scale > 0)) {
            fprintf(stderr, "nalar mkmodel: --merge needs --lora ADAPTER "
                    "(and a --scale > 0)\n");
            return 2;
        }
        rc = nalar_mkmodel_merge(merge, lora, scale, out, &err);
    } else {
        memset(&o, 0, sizeof(o));
        o.base = lora_of;
        o.rank = rank;
        o.alpha = alpha;
        o.seed = seed;
        o.targets = targets;
        o.type = GGML_F32;
        if (type != NULL && strcmp(type, "f16") == 0) {
            o.type = GGML_F16;
        } else if (type != NULL && strcmp(type, "bf16") == 0) {
            o.type = GGML_BF16;
        } else if (type != NULL && strcmp(type, "q8_0") == 0) {
            o.type = GGML_Q8_0;
        } else if (type != NULL && strcmp(type, "f32") != 0) {
            fprintf(stderr, "nalar mkmodel: adapter type '%s' (f32, f16, "
                    "bf16, q8_0)\n", type);
            return 2;
        }
        rc = nalar_mkmodel_lora(&o, out, &err);
    }
    if (rc != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int
cmd_mkmodel(int argc, char **argv)
{
    nalar_mkmodel_opts o;
    const char        *out = NULL, *tmpl_path = NULL;
    char              *tmpl = NULL;
    nalar_err          err;
    int                rc;

    nalar_mkmodel_defaults(&o);
    {
        const char      *type = NULL, *lora_of = NULL, *merge = NULL;
        const char      *lora = NULL, *targets = NULL;
        int              rank = 0;
        float            alpha = 0, scale = 1;
        const nalar_opt  opts[] = {
            { "--lora-of", NULL, NALAR_OPT_STR, &lora_of, NULL, 0 },
            { "--rank", NULL, NALAR_OPT_INT, &rank, NULL, 0 },
            { "--alpha", NULL, NALAR_OPT_FLOAT, &alpha, NULL, 0 },
            { "--targets", NULL, NALAR_OPT_STR, &targets, NULL, 0 },
            { "--merge", NULL, NALAR_OPT_STR, &merge, NULL, 0 },
            { "--lora", NULL, NALAR_OPT_STR, &lora, NULL, 0 },
            { "--scale", NULL, NALAR_OPT_FLOAT, &scale, NULL, 0 },
            { "--dim", NULL, NALAR_OPT_INT, &o.dim, NULL, 0 },
            { "--layers", NULL, NALAR_OPT_INT, &o.n_layers, NULL, 0 },
            { "--heads", NULL, NALAR_OPT_INT, &o.n_heads, NULL, 0 },
            { "--kv-heads", NULL, NALAR_OPT_INT, &o.n_kv_heads, NULL, 0 },
            { "--ffn", NULL, NALAR_OPT_INT, &o.ffn_dim, NULL, 0 },
            { "--vocab", NULL, NALAR_OPT_INT, &o.n_vocab, NULL, 0 },
            { "--ctx", NULL, NALAR_OPT_INT, &o.n_ctx, NULL, 0 },
            { "--seed", NULL, NALAR_OPT_U64, &o.seed, NULL, 0 },
            { "--bpe", NULL, NALAR_OPT_FLAG, &o.bpe, NULL, 0 },
            { "--chatml", NULL, NALAR_OPT_FLAG, &o.chatml, NULL, 0 },
            { "--pre", NULL, NALAR_OPT_STR, &o.pre, NULL, 0 },
            { "--control-tokens", NULL, NALAR_OPT_STR, &o.control_tokens,
              NULL, 0 },
            { "--vocab-from", NULL, NALAR_OPT_STR, &o.vocab_from, NULL, 0 },
            { "--chat-template", NULL, NALAR_OPT_STR, &tmpl_path, NULL, 0 },
            { "-o", NULL, NALAR_OPT_STR, &out, NULL, 0 },
            { "--type", NULL, NALAR_OPT_STR, &type, NULL, 0 },
            { "--arch", NULL, NALAR_OPT_STR, &o.arch, NULL, 0 },
            { "--window", NULL, NALAR_OPT_INT, &o.window, NULL, 0 },
        };

        if (NALAR_OPTS_PARSE("mkmodel", argc, argv, opts) != 0) {
            return 2;
        }
        if (lora_of != NULL || merge != NULL) {
            return mkmodel_lora(lora_of, merge, lora, out, type, rank, alpha,
                                scale, targets, o.seed);
        }
        if (type == NULL) {
            /* the defaults' */
        } else if (strcmp(type, "f32") == 0) {
            o.type = GGML_F32;
        } else if (strcmp(type, "f16") == 0) {
            o.type = GGML_F16;
        } else if (strcmp(type, "bf16") == 0) {
            o.type = GGML_BF16;
        } else if (strcmp(type, "q8_0") == 0) {
            o.type = GGML_Q8_0;
        } else if (strcmp(type, "q4_0") == 0) {
            o.type = GGML_Q4_0;
        } else if (strcmp(type, "q4_k") == 0) {
            o.type = GGML_Q4_K;
        } else if (strcmp(type, "q5_k") == 0) {
            o.type = GGML_Q5_K;
        } else if (strcmp(type, "q6_k") == 0) {
            o.type = GGML_Q6_K;
        } else if (strcmp(type, "q4_k_m") == 0) {
            o.type = GGML_Q4_K;
            o.kmix = 1;
        } else if (strcmp(type, "q5_k_m") == 0) {
            o.type = GGML_Q5_K;
            o.kmix = 1;
        } else {
            fprintf(stderr, "nalar mkmodel: unknown type '%s' (" MK_TYPES
                    ")\n", type);
            return 2;
        }
    }
    if (out == NULL) {
        fprintf(stderr, "nalar mkmodel: -o FILE is required\n");
        return 2;
    }
    if (tmpl_path != NULL) {
        tmpl = read_text(tmpl_path);
        if (tmpl == NULL) {
            return 1;
        }
        o.chat_template = tmpl;
    }
    rc = 0;
    if (nalar_mkmodel(&o, out, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        rc = 1;
    }
    free(tmpl);
    return rc;
}


/* --- bench --- */

/*
 * Memory read bandwidth, for the decode's memory-read limit: n threads
 * each sum their share of a 256 MiB buffer (far larger than the caches),
 * best of 5 passes, in bytes per second.  The buffer is in huge pages
 * where the kernel gives them, as the backend's weights are.  The limit
 * is what the machine can read, so a pass slowed by a neighbour on a
 * shared host must not lower it: the best pass counts, and cmd_bench
 * takes the higher of a measure just before and just after the decode.
 */
typedef struct {
    const uint64_t *p;
    size_t          n;
    uint64_t        sum;
} bw_part;


static void *
bw_read(void *arg)
{
    bw_part  *b = arg;
    uint64_t  s0 = 0, s1 = 0, s2 = 0, s3 = 0;

    for (size_t i = 0; i + 4 <= b->n; i += 4) {
        s0 += b->p[i];
        s1 += b->p[i + 1];
        s2 += b->p[i + 2];
        s3 += b->p[i + 3];
    }
    b->sum = s0 + s1 + s2 + s3;
    return NULL;
}


static double
measure_read_bw(int n_threads)
{
    size_t     bytes = (size_t) 256 << 20, words = bytes / 8;
    uint64_t  *buf;
    pthread_t  th[64];
    bw_part    part[64];
    double     best = 0;

    if (posix_memalign((void **) &buf, (size_t) 2 << 20, bytes) != 0) {
        return 0;
    }
#if defined(MADV_HUGEPAGE)
    (void) madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    n_threads = n_threads < 1 ? 1 : n_threads > 64 ? 64 : n_threads;
    for (size_t i = 0; i < words; i++) {
        buf[i] = i;
    }
    for (int rep = 0; rep < 5; rep++) {
        double t0 = nalar_now_s(), dt;
        int    started = 0;

        for (int k = 0; k < n_threads; k++) {
            part[k].p = buf + words / n_threads * k;
            part[k].n = words / n_threads;
            if (pthread_create(&th[k], NULL, bw_read, &part[k]) != 0) {
                break;
            }
            started++;
        }
        for (int k = 0; k < started; k++) {
            pthread_join(th[k], NULL);
        }
        dt = nalar_now_s() - t0;
        if (started == n_threads && bytes / dt > best) {
            best = (double) bytes / dt;
        }
    }
    free(buf);
    return best;
}


/* this process's resident set (VmRSS), in bytes; 0 if unknown */
static int64_t
resident_bytes(void)
{
    FILE   *fp = fopen("/proc/self/status", "r");
    char    line[256];
    int64_t kb = 0;

    if (fp == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), fp) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = strtoll(line + 6, NULL, 10);
            break;
        }
    }
    fclose(fp);
    return kb * 1024;
}


/*
 * Untimed decode steps before a timed measure, as llama-bench warms up:
 * the backend measures its ways of running a pass of each size in turn
 * before it keeps the fastest (cpu_backend.c: choose_way), and at batch 1
 * the way on the calling thread alone runs at about half the pool's
 * speed on an idle machine, so timing those first passes (5 of each way)
 * would measure the choice, not the steady decode.
 */
#define BENCH_WARM_STEPS 16


typedef struct {
    nalar_model   *m;
    nalar_backend *be;
    nalar_kv_pool  kv;
    nalar_batch    b;
    float         *logits;       /* (max_b, n_vocab) */
    nalar_seq_kv  *seqs;         /* (max_b) */
    int            p, n;         /* prompt and decode tokens */
    int            warm;         /* untimed decode steps before a timed
                                    measure (bench_steps) */
    int            ctx;          /* the batched decode's context per
                                    sequence before its n tokens */
    int            n_ready;      /* seqs [0, n_ready) hold that context */
    int            vocab;
} bench_ctx;

/* what `nalar bench` measured */
typedef struct {
    int     bs[16], n_bs;        /* batch sizes of the batched decode */
    double  prefill_tps, decode_tps, batched[16];
    double  batched_cpu[16];     /* process CPU seconds per token */
    double  read_bw;             /* bytes/s, the better of two */
    int64_t wbytes, rss, file_bytes, kv_bytes;
} bench_result;


static int
bench_batch(bench_ctx *c, int32_t n, nalar_err *err)
{
    c->b.n_tokens = n;
    return c->be->forward(c->be, &c->kv, &c->b, c->logits, err);
}


#ifdef NALAR_CUDA
/* --backend cuda [-m MODEL] or --synthetic SHAPE (random BF16 weights
 * made in device memory); see bench/cuda_bench.cu */
static int
bench_cuda(const char *model, const char *synthetic, int p, int n,
           const char *blist, int json, int gemv_max)
{
    nalar_cuda_bench_opts bo;
    int32_t               bb[16];
    nalar_err             err;
    char                 *dup, *tokp;

    memset(&bo, 0, sizeof(bo));
    bo.model_path = model;
    bo.synthetic = synthetic;
    bo.type = GGML_BF16;
    bo.prefill = p > 128 ? p : 0;           /* default 2048 */
    bo.n_decode = n > 128 ? n : 0;          /* default 64 */
    bo.json = json;
    bo.gemv_max = gemv_max;
    if (strcmp(blist, "1,4,16") != 0) {     /* -b given */
        dup = strdup(blist);
        for (tokp = strtok(dup, ","); tokp != NULL && bo.n_batches < 16;
             tokp = strtok(NULL, ","))
        {
            bb[bo.n_batches++] = atoi(tokp);
        }
        free(dup);
        bo.batches = bb;
    }
    if (nalar_cuda_bench(&bo, &err) != 0) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    return 0;
}
#endif


/* -b's list into r->bs; the largest in *max_b; -1 on a bad size */
static int
bench_batches(const char *blist, bench_result *r, int *max_b)
{
    char *dup = strdup(blist), *tokp;

    *max_b = 1;
    r->n_bs = 0;
    for (tokp = strtok(dup, ","); tokp != NULL && r->n_bs < 16;
         tokp = strtok(NULL, ","))
    {
        r->bs[r->n_bs] = atoi(tokp);
        if (r->bs[r->n_bs] < 1) {
            fprintf(stderr, "nalar bench: bad batch size '%s'\n", tokp);
            free(dup);
            return -1;
        }
        *max_b = r->bs[r->n_bs] > *max_b ? r->bs[r->n_bs] : *max_b;
        r->n_bs++;
    }
    free(dup);
    return 0;
}


/* The model on the CPU backend, a KV pool for max_b sequences of p + n
 * tokens, and the batch's buffers: the exit status to return, 0 when
 * ready. */
static int
bench_open(bench_ctx *c, const char *model, int max_b, int threads,
           int act_i16, ggml_type kv_type)
{
    nalar_err err;
    int       len = c->p > c->ctx ? c->p : c->ctx;
    int       rows = len > max_b ? len : max_b;

    c->m = nalar_model_load(model, &err);
    if (c->m == NULL) {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    if (len + c->n > c->m->cfg.n_ctx) {
        fprintf(stderr, "nalar bench: -p (or --ctx) + -n = %d exceeds the "
                "context of %d\n", len + c->n, c->m->cfg.n_ctx);
        nalar_model_destroy(c->m);
        return 2;
    }
    c->vocab = c->m->cfg.n_vocab;
    c->warm = c->m->cfg.n_ctx - len < BENCH_WARM_STEPS
              ? c->m->cfg.n_ctx - len : BENCH_WARM_STEPS;
    c->be = nalar_cpu_backend_create(c->m, threads, &err);
    if (c->be != NULL && act_i16) {
        nalar_cpu_backend_act_i16(c->be, act_i16);
    }
    if (c->be != NULL) {
        c->be->kv_type = kv_type;
    }
    if (c->be == NULL
        || nalar_kv_pool_init(&c->kv,
                              max_b * ((len + (c->n > c->warm ? c->n
                                                               : c->warm))
                                        / NALAR_KV_BLOCK + 2),
                              c->m->cfg.n_layers,
                              c->m->cfg.n_kv_heads * c->m->cfg.head_dim,
                              &err) != 0
        || c->be->kv_alloc(c->be, &c->kv, &err) != 0)
    {
        fprintf(stderr, "nalar: %s\n", err.msg);
        return 1;
    }
    c->b.tokens = calloc((size_t) rows, sizeof(int32_t));
    c->b.pos = calloc((size_t) rows, sizeof(int32_t));
    c->b.seq = calloc((size_t) rows, sizeof(*c->b.seq));
    c->b.want_logits = calloc((size_t) rows, 1);
    c->logits = nalar_alloc_lines((size_t) max_b * c->vocab * sizeof(float));
    c->seqs = calloc((size_t) max_b, sizeof(*c->seqs));
    if (c->b.tokens == NULL || c->b.pos == NULL || c->b.seq == NULL
        || c->b.want_logits == NULL || c->logits == NULL || c->seqs == NULL)
    {
        fprintf(stderr, "nalar: out of memory\n");
        return 1;
    }
    return 0;
}


static void
bench_close(bench_ctx *c)
{
    for (int s = 0; s < c->n_ready || s == 0; s++) {
        nalar_seq_kv_release(&c->kv, &c->seqs[s]);
    }
    free(c->seqs);
    free(c->b.tokens);
    free(c->b.pos);
    free(c->b.seq);
    free(c->b.want_logits);
    free(c->logits);
    c->be->kv_free(c->be, &c->kv);
    nalar_kv_pool_free(&c->kv);
    c->be->destroy(c->be);
    nalar_model_destroy(c->m);
}


/*
 * prefill: one p-token prompt in one pass, the best of 5 after a
 * warm-up pass (the backend tries its ways of running a pass in
 * turn, and keeps the faster; on a shared host one pass alone varied
 * 2.7x between identical runs).  Tokens per second, or -1.  Leaves
 * sequence 0 holding the prompt and its last logits.
 */
static double
bench_prefill(bench_ctx *c)
{
    double    best = 0;
    int       p = c->p;
    nalar_err err;

    for (int rep = 0; rep < 6; rep++) {
        double t0, tps;

        nalar_seq_kv_release(&c->kv, &c->seqs[0]);
        nalar_seq_kv_reserve(&c->kv, &c->seqs[0], p + c->n);
        for (int i = 0; i < p; i++) {
            c->b.tokens[i] = (int32_t) ((i * 7919 + 13) % c->vocab);
            c->b.pos[i] = i;
            c->b.seq[i] = &c->seqs[0];
            c->b.want_logits[i] = i == p - 1;
        }
        c->b.n_logits = 1;
        t0 = nalar_now_s();
        if (bench_batch(c, p, &err) != 0) {
            fprintf(stderr, "nalar: %s\n", err.msg);
            return -1;
        }
        tps = p / (nalar_now_s() - t0);
        if (rep > 0 && tps > best) {
            best = tps;
        }
    }
    return best;
}


/* steps decode steps of sequences [0, b) from position pos0 (each
 * continuing from its logits; first the tokens of first[], where not
 * NULL); 0, or -1 */
static int
bench_steps(bench_ctx *c, int b, int pos0, int steps, const int32_t *first)
{
    nalar_err err;

    for (int i = 0; i < steps; i++) {
        for (int s = 0; s < b; s++) {
            c->b.tokens[s] = i == 0 && first != NULL
                             ? first[s]
                             : nalar_argmax(c->logits
                                            + (size_t) s * c->vocab,
                                            c->vocab);
            c->b.pos[s] = pos0 + i;
            c->b.seq[s] = &c->seqs[s];
            c->b.want_logits[s] = 1;
        }
        c->b.n_logits = b;
        if (bench_batch(c, b, &err) != 0) {
            fprintf(stderr, "nalar: %s\n", err.msg);
            return -1;
        }
    }
    return 0;
}


/* decode at batch 1, greedy, continuing the prefill's prompt (after
 * c->warm untimed steps from the same place, taken back):
 * tokens per second, or -1 */
static double
bench_decode(bench_ctx *c)
{
    int32_t tok = nalar_argmax(c->logits, c->vocab);
    double  t0;

    if (nalar_seq_kv_reserve(&c->kv, &c->seqs[0], c->p + c->warm) != 0
        || bench_steps(c, 1, c->p, c->warm, &tok) != 0)
    {
        fprintf(stderr, "nalar bench: the warm-up failed\n");
        return -1;
    }
    nalar_seq_kv_truncate(&c->kv, &c->seqs[0], c->p);
    if (nalar_seq_kv_reserve(&c->kv, &c->seqs[0], c->p + c->n) != 0) {
        fprintf(stderr, "nalar bench: the KV pool is short\n");
        return -1;
    }
    t0 = nalar_now_s();
    if (bench_steps(c, 1, c->p, c->n, &tok) != 0) {
        return -1;
    }
    return c->n / (nalar_now_s() - t0);
}


/* batched decode: b sequences, each with a context of c->ctx tokens
 * (--ctx, 16 by default; each prefilled in one pass, not timed), step
 * together for n tokens (after c->warm untimed steps from the same
 * place, taken back); aggregate tokens per second, or -1 */
static double
bench_batched(bench_ctx *c, int b, double *cpu_per_token)
{
    int             ctx0 = c->ctx, n = c->n, vocab = c->vocab;
    double          t0, tps;
    struct timespec c0, c1;
    nalar_err       err;
    int32_t        *first;

    /* the contexts of the sizes before are kept (truncated back to ctx0) */
    for (int s = 0; s < b; s++) {
        if (nalar_seq_kv_reserve(&c->kv, &c->seqs[s],
                                 ctx0 + (n > c->warm ? n : c->warm)) != 0)
        {
            fprintf(stderr, "nalar bench: the KV pool is short\n");
            return -1;
        }
        if (s < c->n_ready) {
            continue;
        }
        for (int i = 0; i < ctx0; i++) {
            c->b.tokens[i] = (int32_t) ((s * 31 + i * 7) % vocab);
            c->b.pos[i] = i;
            c->b.seq[i] = &c->seqs[s];
            c->b.want_logits[i] = i == ctx0 - 1;
        }
        c->b.n_logits = 1;
        if (bench_batch(c, ctx0, &err) != 0) {
            fprintf(stderr, "nalar: %s\n", err.msg);
            return -1;
        }
    }
    c->n_ready = b > c->n_ready ? b : c->n_ready;
    first = malloc((size_t) b * sizeof(int32_t));
    if (first == NULL) {
        return -1;
    }
    for (int s = 0; s < b; s++) {
        first[s] = (int32_t) ((s * 17 + 5) % vocab);
    }
    if (bench_steps(c, b, ctx0, c->warm, first) != 0) {
        free(first);
        return -1;
    }
    for (int s = 0; s < b; s++) {
        nalar_seq_kv_truncate(&c->kv, &c->seqs[s], ctx0);
        if (nalar_seq_kv_reserve(&c->kv, &c->seqs[s], ctx0 + n) != 0) {
            fprintf(stderr, "nalar bench: the KV pool is short\n");
            free(first);
            return -1;
        }
    }
    t0 = nalar_now_s();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    if (bench_steps(c, b, ctx0, n, first) != 0) {
        free(first);
        return -1;
    }
    free(first);
    tps = (double) b * n / (nalar_now_s() - t0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    *cpu_per_token = ((double) (c1.tv_sec - c0.tv_sec)
                      + (double) (c1.tv_nsec - c0.tv_nsec) / 1e9)
                     / ((double) b * n);
    for (int s = 0; s < b; s++) {
        nalar_seq_kv_truncate(&c->kv, &c->seqs[s], ctx0);
    }
    return tps;
}


/* Weight bytes one decode step reads (the embedding is gathered, not
 * read, unless it is also the output head). */
static int64_t
bench_weight_bytes(const nalar_model *m)
{
    int64_t wbytes = 0;

    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];

        if (t->name.len != 17
            || memcmp(t->name.ptr, "token_embd.weight", 17) != 0
            || m->output.data == m->tok_embd.data)
        {
            wbytes += (int64_t) t->nbytes;
        }
    }
    return wbytes;
}


static void
bench_report(const bench_result *r, const char *model, int threads, int p,
             int n, int json)
{
    if (json) {
        printf("{\"resident_bytes\": %lld, \"file_bytes\": %lld, "
               "\"kv_pool_bytes\": %lld, \"read_bytes_per_s\": %.0f, ",
               (long long) r->rss, (long long) r->file_bytes,
               (long long) r->kv_bytes, r->read_bw);
        printf("\"prefill_tokens_per_s\": %.1f, \"decode_tokens_per_s\": "
               "%.1f, \"batched\": {", r->prefill_tps, r->decode_tps);
        for (int k = 0; k < r->n_bs; k++) {
            printf("%s\"%d\": %.1f", k ? ", " : "", r->bs[k], r->batched[k]);
        }
        printf("}, \"batched_cpu_ms_per_token\": {");
        for (int k = 0; k < r->n_bs; k++) {
            printf("%s\"%d\": %.3f", k ? ", " : "", r->bs[k],
                   r->batched_cpu[k] * 1e3);
        }
        printf("}, \"weight_bytes_per_s\": %.0f}\n",
               (double) r->wbytes * r->decode_tps);
        return;
    }
    printf("model %s: %d threads\n", model, threads);
    printf("prefill %d tokens: %.1f tokens/s\n", p, r->prefill_tps);
    printf("decode %d tokens, batch 1: %.1f tokens/s (%.2f GB/s of "
           "weights)\n", n, r->decode_tps, r->wbytes * r->decode_tps / 1e9);
    printf("memory read: %.2f GB/s; memory-read limit %.1f tokens/s "
           "(%lld weight bytes per token); decode at %.0f%% of it\n",
           r->read_bw / 1e9, r->read_bw / (double) r->wbytes,
           (long long) r->wbytes,
           100.0 * r->decode_tps * (double) r->wbytes / r->read_bw);
    printf("resident after load: %lld bytes (file %lld, KV pool "
           "%lld)\n", (long long) r->rss, (long long) r->file_bytes,
           (long long) r->kv_bytes);
    for (int k = 0; k < r->n_bs; k++) {
        printf("decode batch %d: %.1f tokens/s aggregate (%.3f ms of CPU "
               "time per token)\n", r->bs[k], r->batched[k],
               r->batched_cpu[k] * 1e3);
    }
}


/* The CPU measures of `nalar bench`: prefill, decode at batch 1 between
 * two measures of the read bandwidth, batched decode. */
static int
bench_cpu(bench_ctx *c, bench_result *r, int threads)
{
    int    bw_threads;
    double bw;

    r->rss = resident_bytes();
    r->prefill_tps = bench_prefill(c);
    if (r->prefill_tps < 0) {
        return 1;
    }
    bw_threads = threads > 0 ? threads
                 : (int) sysconf(_SC_NPROCESSORS_ONLN);
    r->read_bw = measure_read_bw(bw_threads);
    r->decode_tps = bench_decode(c);
    if (r->decode_tps < 0) {
        return 1;
    }
    bw = measure_read_bw(bw_threads);
    r->read_bw = bw > r->read_bw ? bw : r->read_bw;
    nalar_seq_kv_release(&c->kv, &c->seqs[0]);
    for (int k = 0; k < r->n_bs; k++) {
        r->batched[k] = bench_batched(c, r->bs[k], &r->batched_cpu[k]);
        if (r->batched[k] < 0) {
            return 1;
        }
    }
    r->wbytes = bench_weight_bytes(c->m);
    r->file_bytes = (int64_t) c->m->gguf->map_size;
    r->kv_bytes = 2 * (int64_t) c->kv.n_blocks * c->kv.n_layers
                  * NALAR_KV_BLOCK * c->kv.kv_dim * c->kv.elem_bytes;
    return 0;
}


static int
cmd_bench(int argc, char **argv)
{
    const char   *model = NULL, *blist = "1,4,16", *act = NULL, *kvt = NULL;
    int           p = 128, n = 128, threads = 0, json = 0, act_i16, kt;
    int           ctx = 16;
    int           max_b, rc;
    bench_ctx     c;
    bench_result  r;
#ifdef NALAR_CUDA
    const char   *cu_backend = NULL, *cu_synthetic = NULL;  /* CUDA bench */
    int           cu_gemv_max = 0;
#endif
    const nalar_opt opts[] = {
        { "-m", NULL, NALAR_OPT_STR, &model, NULL, 0 },
        { "-p", NULL, NALAR_OPT_INT, &p, NULL, 0 },
        { "-n", NULL, NALAR_OPT_INT, &n, NULL, 0 },
        { "-b", NULL, NALAR_OPT_STR, &blist, NULL, 0 },
        { "-t", NULL, NALAR_OPT_INT, &threads, NULL, 0 },
        { "--json", NULL, NALAR_OPT_FLAG, &json, NULL, 0 },
        { "--cpu-activations", NULL, NALAR_OPT_STR, &act, NULL, 0 },
        { "--kv-type", NULL, NALAR_OPT_STR, &kvt, NULL, 0 },
        { "--ctx", NULL, NALAR_OPT_INT, &ctx, NULL, 0 },
#ifdef NALAR_CUDA
        { "--backend", NULL, NALAR_OPT_STR, &cu_backend, NULL, 0 },
        { "--synthetic", NULL, NALAR_OPT_STR, &cu_synthetic, NULL, 0 },
        { "--gpu-gemv-max", NULL, NALAR_OPT_INT, &cu_gemv_max, NULL, 0 },
#endif
    };

    if (NALAR_OPTS_PARSE("bench", argc, argv, opts) != 0) {
        return 2;
    }
    act_i16 = nalar_opt_activations("bench", act, NULL);
    kt = nalar_opt_kv_type("bench", kvt);
    if (act_i16 < 0 || kt < 0) {
        return 2;
    }
#ifdef NALAR_CUDA
    if (cu_synthetic != NULL
        || (cu_backend != NULL && strcmp(cu_backend, "cuda") == 0))
    {
        return bench_cuda(model, cu_synthetic, p, n, blist, json,
                          cu_gemv_max);
    }
    if (cu_backend != NULL && strcmp(cu_backend, "cpu") != 0) {
        fprintf(stderr, "nalar bench: unknown backend '%s'\n", cu_backend);
        return 2;
    }
#endif
    if (model == NULL || p < 1 || n < 1 || ctx < 1) {
        usage(stderr);
        return 2;
    }
    memset(&r, 0, sizeof(r));
    if (bench_batches(blist, &r, &max_b) != 0) {
        return 2;
    }
    memset(&c, 0, sizeof(c));
    c.p = p;
    c.n = n;
    c.ctx = ctx;
    rc = bench_open(&c, model, max_b, threads, act_i16, (ggml_type) kt);
    if (rc != 0) {
        return rc;
    }
    if (bench_cpu(&c, &r, threads) != 0) {
        return 1;
    }
    if (!json) {
        printf("isa: %s; activations %s; KV %s; batched decode at a "
               "context of %d\n", nalar_cpu_isa(),
               nalar_act_name(act_i16),
               nalar_kv_type_name(&c.kv), ctx);
    }
    bench_report(&r, model, threads, p, n, json);
    bench_close(&c);
    return 0;
}


int
main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0
        || strcmp(argv[1], "help") == 0)
    {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "generate") == 0) {
        return cmd_generate(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "tokenize") == 0) {
        return cmd_tokenize(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "eval") == 0) {
        return nalar_cmd_eval(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "render") == 0) {
        return nalar_cmd_render(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "inspect") == 0) {
        return cmd_inspect(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "mkmodel") == 0) {
        return cmd_mkmodel(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "bench") == 0) {
        return cmd_bench(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "spec-bench") == 0) {
        return nalar_cmd_spec_bench(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "verify-bench") == 0) {
        return nalar_cmd_verify_bench(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "prefix-bench") == 0) {
        return nalar_cmd_prefix_bench(argc - 1, argv + 1);
    }
    usage(stderr);
    return 2;
}
