
/*
 * What the nginx side of Nalar shares between its files: the limits and
 * the configuration, model, per-request and per-worker structures, the
 * worker's state (defined in ngx_nalar_module.c) and the functions one
 * file calls in another, listed by the file that defines them.  Every
 * function here runs on the event loop unless its comment says otherwise.
 */
#ifndef NGX_NALAR_MODULE_H
#define NGX_NALAR_MODULE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include "engine.h"
#include "engine_test.h"
#include "jwt.h"
#include "model.h"
#include "tokenizer.h"
#include "chat.h"
#include "error_json.h"
#include "request.h"
#include "tools.h"


#define NGX_HTTP_NALAR_API          1
#define NGX_HTTP_NALAR_METRICS      2

#define NGX_HTTP_NALAR_EP_NONE         0
#define NGX_HTTP_NALAR_EP_COMPLETIONS  1
#define NGX_HTTP_NALAR_EP_CHAT         2
#define NGX_HTTP_NALAR_EP_MODELS       3
#define NGX_HTTP_NALAR_EP_HEALTH       4
#define NGX_HTTP_NALAR_EP_MODEL        5      /* /models/{id} */
#define NGX_HTTP_NALAR_EP_TOKENIZE     6      /* vLLM's /tokenize */

/*
 * Bodies up to this size are parsed on the event loop, a bounded cost of
 * about a millisecond at most (jansson parses some 10-20 MB/s of request
 * JSON), which spares the common small request two thread wakeups; it is
 * nginx's default client_body_buffer_size on 64-bit systems, so these
 * bodies are normally in memory.  Larger bodies go to the parse threads.
 */
#define NGX_HTTP_NALAR_PARSE_INLINE   (16 * 1024)

/*
 * Two parse threads per worker, the jobs queued smallest first: one takes
 * any body, the other only bodies up to NGX_HTTP_NALAR_PARSE_SMALL, so
 * that a request of a few kilobytes never waits for the parse of
 * megabytes.
 */
#define NGX_HTTP_NALAR_PARSE_LANES    2
#define NGX_HTTP_NALAR_PARSE_SMALL    (256 * 1024)
#define NGX_HTTP_NALAR_PARSE_NICE     10    /* the parse thread's nice,
                                                 above the worker's */

#define NGX_HTTP_NALAR_SCOPE_TENANT   0     /* nalar_prefix_cache_scope */
#define NGX_HTTP_NALAR_SCOPE_GLOBAL   1

#define NGX_HTTP_NALAR_TENANT_UNKNOWN 0     /* not established yet */
#define NGX_HTTP_NALAR_TENANT_OK      1     /* verified, or single-tenant */
#define NGX_HTTP_NALAR_TENANT_ANON    2     /* nalar_tenant is empty: no
                                               prefix cache */
#define NGX_HTTP_NALAR_TENANT_MISSING 3     /* no bearer token */
#define NGX_HTTP_NALAR_TENANT_INVALID 4     /* a token that did not verify */
#define NGX_HTTP_NALAR_TENANT_REFUSED 5     /* nalar_edge_tenant: no edge
                                               identity, or one that did
                                               not verify: 403 */

/* how $nalar_edge_identity came out, for nalar_edge_zone's counters */
#define NGX_HTTP_NALAR_SIGN_NONE      0     /* not asked for */
#define NGX_HTTP_NALAR_SIGN_OK        1
#define NGX_HTTP_NALAR_SIGN_NO_KEY    2     /* no nalar_edge_key */
#define NGX_HTTP_NALAR_SIGN_NO_IDENTITY 3   /* no valid token or tenant */
#define NGX_HTTP_NALAR_SIGN_TOO_LONG  4
#define NGX_HTTP_NALAR_SIGN_ERROR     5     /* no memory, HMAC failed */

#define NGX_HTTP_NALAR_MAX_TENANT     256   /* bytes of a tenant claim */
#define NGX_HTTP_NALAR_MAX_SHARED     (64 * 1024)  /* nalar_shared_prefix */
#define NGX_HTTP_NALAR_MAX_TEMPLATE   (1024 * 1024) /* nalar_chat_template
                                                       file= */


typedef struct {
    ngx_str_t                  name;
    ngx_str_t                  path;        /* NUL-terminated */
    ngx_str_t                  draft;       /* NUL-terminated, or empty */
    int64_t                    kv_block;    /* bytes of one KV block */
    int64_t                    draft_kv_block;
    nalar_chat_template       *tmpl;        /* its tokenizer.chat_template,
                                               compiled; NULL: none, or it
                                               did not compile */
    ngx_pool_cleanup_t        *lora_base;   /* while the http block is
                                               read: the model opened for
                                               checking its adapters (its
                                               data, a nalar_model); NULL
                                               before the first and after
                                               ngx_http_nalar_lora_close */
} ngx_http_nalar_model_t;


/*
 * nalar_lora: an adapter of a configured model.  `api` is what a parse is
 * given of it; api.model is the index of its base in the main conf's
 * models, api.adapter its index + 1 among that base's adapters in the
 * order of the configuration, which is the order of the base engine's
 * opts.loras (ngx_http_nalar_lora_opts).
 */
typedef struct {
    ngx_str_t                  name;        /* NUL-terminated */
    ngx_str_t                  path;        /* NUL-terminated */
    double                     scale;       /* > 0, finite */
    nalar_api_lora             api;
} ngx_http_nalar_lora_t;


typedef struct {
    ngx_array_t                models;      /* ngx_http_nalar_model_t */
    ngx_array_t                loras;       /* ngx_http_nalar_lora_t */
    ngx_array_t                shared;      /* ngx_http_nalar_shared_t *,
                                               every nalar_shared_prefix */
    ngx_int_t                  threads;
    off_t                      kv_cache;
    ngx_uint_t                 kv_type;     /* nalar_kv_cache dtype=: a
                                               ggml_type, GGML_F32 (0,
                                               zeroed), GGML_F16 or
                                               GGML_BF16 */
    ngx_uint_t                 cpu_act_i16; /* nalar_cpu_activations: 0 f32,
                                               1 i16, 2 q8 */
    ngx_int_t                  max_batch_tokens;  /* 0: auto */
    ngx_msec_t                 itl_target;  /* nalar_itl_target; 0: off */
    ngx_int_t                  max_queue;
    ngx_int_t                  max_running;
    ngx_flag_t                 prefix_cache;
    ngx_str_t                  backend;
    ngx_int_t                  device;      /* unset: worker mod count */
    double                     gpu_memory;  /* (0,1] fraction, > 1 bytes,
                                               0: the engine's 0.9 */
    ngx_uint_t                 spec_mode;   /* http-level nalar_speculative,
                                               the engines' default */
    ngx_int_t                  spec_max_k;
    ngx_flag_t                 spec_draft;  /* nalar_speculative draft
                                               somewhere */
#ifdef NALAR_TEST_HOOKS
    ngx_int_t                  test_fault;  /* nalar_test_fault_forward:
                                               the module's tests only */
    ngx_str_t                  test_hold;   /* nalar_test_hold_parse: the
                                               module's tests only */
#endif
    time_t                     created;     /* for /v1/models */
} ngx_http_nalar_main_conf_t;


/*
 * nalar_shared_prefix: the operator's text, tokenized in each worker once
 * per model and per tokenization (literal for completions, control tokens
 * parsed for chat) when the model is ready.
 */
typedef struct {
    int32_t                   *ids;         /* (n) */
    int32_t                    n;
} ngx_http_nalar_prefix_ids_t;


typedef struct {
    ngx_str_t                  file;
    ngx_str_t                  text;
    ngx_uint_t                 index;       /* in the main conf's shared */
} ngx_http_nalar_shared_t;


/*
 * A model in a worker: its engine and what is learnt from the model once
 * it is loaded.  Configuration is read-only in workers; what they change
 * lives in the runtime, made in init_process and freed in exit_process.
 */
typedef struct {
    ngx_str_t                  name;        /* the configuration's */
    nalar_engine              *engine;      /* NULL: did not start */
    nalar_chat_style           style;       /* from the GGUF, once ready */
    const char                *bos;         /* its BOS and EOS tokens' text,
                                               once ready (for templates) */
    const char                *eos;
    ngx_http_nalar_prefix_ids_t  *prefix;   /* (shared prefixes, 2), once
                                               the model is ready */
    unsigned                   style_known:1;
    unsigned                   load_logged:1;
} ngx_http_nalar_model_rt_t;


typedef struct {
    ngx_pool_t                *pool;
    ngx_http_nalar_main_conf_t  *conf;
    ngx_http_nalar_model_rt_t *models;      /* (conf->models.nelts) */
    ngx_uint_t                 n_models;
    ngx_event_t                load_ev;
    ngx_connection_t           load_conn;   /* load_ev's data, for logging */
} ngx_http_nalar_runtime_t;


/* nalar_edge_key: the secret an edge signs identities with and its
 * nodes verify them with (ngx_nalar_edge.c) */
typedef struct {
    ngx_str_t                  key;         /* 32 to 4096 bytes */
    time_t                     skew;        /* how far a signature's time
                                               may be from the node's */
} ngx_http_nalar_edge_key_t;


typedef struct {
    ngx_uint_t                 handler;     /* NGX_HTTP_NALAR_API, ... */
    ngx_uint_t                 chat_style;  /* nalar_chat_style */
    nalar_chat_template       *chat_tmpl;   /* file=PATH, compiled; NULL:
                                               as chat_style says */
    ngx_msec_t                 keepalive;   /* SSE comment interval */

    /* tenant and prefix cache scope */
    ngx_http_complex_value_t  *tenant;      /* nalar_tenant */
    nalar_jwt_keyset          *jwt;         /* nalar_jwt_key, or NULL */
    ngx_str_t                  jwt_id;      /* SHA-256 of its file, hex */
    ngx_str_t                  jwt_claim;   /* NUL-terminated, or empty */
    ngx_str_t                  jwt_issuer;
    ngx_str_t                  jwt_audience;
    time_t                     jwt_leeway;
    ngx_uint_t                 cache_scope; /* NGX_HTTP_NALAR_SCOPE_* */
    ngx_http_nalar_edge_key_t *edge_key;    /* nalar_edge_key, or NULL */
    ngx_http_complex_value_t  *edge_tenant; /* nalar_edge_tenant, or NULL:
                                               the signed identity header */
    ngx_http_nalar_shared_t   *shared;      /* nalar_shared_prefix */
    ngx_uint_t                 spec_mode;   /* nalar_spec_mode */
    ngx_int_t                  spec_max_k;  /* most proposals per step */
    ngx_flag_t                 spec_fixed;  /* "fixed": always max */
    size_t                     route_prefix;    /* nalar_route_prefix */
    ngx_flag_t                 route_edge;  /* nalar_route_prefix here or
                                               above: an edge location */
    ngx_shm_zone_t            *edge_zone;   /* nalar_edge_zone: where this
                                               location's requests are
                                               counted, or NULL */
    ngx_shm_zone_t            *edge_metrics;    /* nalar_edge_metrics */
    ngx_http_upstream_srv_conf_t  *edge_health; /* nalar_edge_health */

    /* LoRA adapters: the server's choice, or which a body may name */
    ngx_http_complex_value_t  *adapter;     /* nalar_adapter, or NULL */
    ngx_array_t               *lora_allow;  /* nalar_lora_allow's words
                                               (ngx_str_t); NULL: none */
    nalar_api_lora            *lora_list;   /* what lora_allow allows,
                                               made at merge */
    ngx_uint_t                 n_lora_list;
} ngx_http_nalar_loc_conf_t;


typedef struct ngx_http_nalar_ctx_s  ngx_http_nalar_ctx_t;


/* What nginx wrote of a body to its temporary file, for the parse thread. */
typedef struct {
    int                        fd;          /* a dup() of the file's */
    off_t                      offset;
    size_t                     size;
    size_t                     at;          /* in the job's body */
} ngx_http_nalar_segment_t;


/*
 * What a finished parse is handed to on the event loop: the content
 * handler's ngx_http_nalar_parsed, given with the job so that the done
 * handler, below the content handler, calls it without naming it.
 */
typedef ngx_int_t (*ngx_http_nalar_parsed_pt)(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_api_request *req);


/*
 * A body for the parse thread and, when parsed, its result.  `queue` is
 * on the job queue or the parsed queue, under the worker's mutex; `ctx`
 * is read and written on the event loop only (the request's cleanup sets
 * it to NULL); the rest belongs to whichever side holds the job.
 */
typedef struct {
    ngx_queue_t                queue;
    ngx_http_nalar_ctx_t      *ctx;
    ngx_http_nalar_parsed_pt   parsed;      /* the result goes there */
    char                      *body;        /* (len) */
    size_t                     len;
    nalar_api_model           *models;
    nalar_api_in               in;
    nalar_api_request          req;
    ngx_http_nalar_segment_t  *segs;
    ngx_uint_t                 n_segs;
    unsigned                   release:1;   /* to be freed by the thread */
    unsigned                   read_failed:1;
} ngx_http_nalar_parse_t;


/*
 * A slot links one engine request to its choice.  `req` and `posted` are
 * read and written under the worker's mutex (the engine thread's notify
 * callback compares `req`), the rest only on the event loop.  Slots are
 * never freed while engines run, so a late notify can always read one.
 */
typedef struct {
    ngx_queue_t                queue;       /* done queue or free list */
    nalar_request             *req;
    ngx_http_nalar_ctx_t      *ctx;
    ngx_uint_t                 posted;      /* on the done queue */
} ngx_http_nalar_slot_t;


typedef struct {
    ngx_http_nalar_slot_t     *slot;        /* NULL once finished */
    nalar_finish               finish;
    ngx_array_t               *text;        /* u_char; non-streaming */
    json_t                    *logprobs;    /* accumulated; non-streaming */
    size_t                     text_offset; /* for completions logprobs */
    nalar_usage                usage;       /* the engine's, as taken;
                                               grammar_compile_ms < 0: no
                                               grammar */
    nalar_tool_parser         *tools;       /* the answer's tool calls */
    unsigned                   submitted:1;
    unsigned                   role_sent:1;
} ngx_http_nalar_choice_t;


struct ngx_http_nalar_ctx_s {
    ngx_http_request_t        *request;
    ngx_http_nalar_model_rt_t *model;
    const nalar_api_lora      *loras;       /* the adapters its parse was
                                               given (configuration) */
    const nalar_api_lora      *lora;        /* the one serving it, or
                                               NULL: the base alone */
    const char                *served;      /* the answers' `model`: the
                                               adapter's name or the
                                               model's */
    ngx_uint_t                 endpoint;
    ngx_uint_t                 n;           /* choices */
    ngx_uint_t                 n_done;
    ngx_http_nalar_choice_t   *choices;     /* (n) */
    ngx_int_t                  logprobs;    /* top-N, or -1: off */
    ngx_uint_t                 tool_mode;   /* NALAR_API_TOOLS_* */
    ngx_uint_t                 chat_style;  /* the prompt's rendering */
    u_char                     id[40];      /* "cmpl-..." NUL-terminated */
    time_t                     created;
    ngx_event_t                timer;       /* SSE keep-alive; holds an
                                               exiting worker open */
    ngx_msec_t                 last_send;

    /* the tenant, established once per request (a token is verified
     * once however often $nalar_tenant is read) */
    ngx_str_t                  tenant;      /* NUL-terminated */
    ngx_str_t                  scope;       /* the tenant and where it
                                               came from; NUL-terminated */
    ngx_uint_t                 tenant_state;    /* NGX_HTTP_NALAR_TENANT_* */
    ngx_uint_t                 edge_sign;   /* NGX_HTTP_NALAR_SIGN_*: how
                                               $nalar_edge_identity last
                                               came out */
    ngx_http_nalar_loc_conf_t *tenant_conf; /* the conf it was made with */

    /* the prompt's usage: the first choice's as taken (n_prompt, also
     * where the prompt was refused; n_cached, queue_ms, ttft_ms); each
     * choice keeps its own completion's */
    nalar_usage                usage;

    ngx_buf_t                 *error_body;  /* nginx's error page, as
                                               JSON */
    ngx_uint_t                 err_status;  /* ngx_http_nalar_error()'s */
    ngx_buf_t                 *err_body;    /* its JSON, until sent */
    ngx_chain_t               *free;        /* stream buffers to reuse */
    ngx_chain_t               *busy;        /* stream buffers in flight */
    ngx_http_nalar_parse_t    *parse;       /* the body being parsed */
    ngx_str_t                  route_key;   /* $nalar_route_key, once the
                                               body is read */
    ngx_chain_t               *route_held;  /* an edge: the beginning of
                                               the event the node is
                                               sending, not yet passed */
    ngx_chain_t               *route_free;  /* held buffers to reuse */
    ngx_chain_t               *route_busy;  /* held buffers in flight */

    unsigned                   stream:1;
    unsigned                   include_usage:1;
    unsigned                   token_ids:1; /* logprobs tokens as ids */
    unsigned                   header_sent:1;
    unsigned                   blocked:1;   /* waiting for the client */
    unsigned                   failed:1;    /* a choice failed mid-stream */
    unsigned                   done:1;
    unsigned                   cleanup:1;   /* registered */
    unsigned                   route_ended:1;   /* an edge ended a cut
                                                   stream */
    unsigned                   route_blank:1;   /* what it got ends an
                                                   empty line so far */
    unsigned                   route_raw:1;     /* it passes the stream
                                                   as it comes */
    unsigned                   route_text:1;    /* route_key read prompt
                                                   text */
};


/*
 * The worker's state (ngx_nalar_worker.c), made in init_process and torn
 * down in exit_process (ngx_nalar_process.c).  The mutex guards the done,
 * job and result queues and parser_stop; the engines' notify callbacks
 * and the parse threads touch only those and the eventfd; the rest is the
 * event loop's.
 */
typedef struct {
    ngx_http_nalar_runtime_t  *rt;          /* NULL: no model here */
    pthread_mutex_t            mutex;
    ngx_queue_t                done;        /* slots with news; mutex */
    ngx_queue_t                free_slots;  /* slots to reuse */
    ngx_array_t                all_slots;   /* every slot, freed at exit
                                               after the engines are
                                               joined */
    int                        efd;         /* the eventfd, or -1 */
    ngx_connection_t          *efd_conn;    /* its read event */
    pthread_cond_t             jobs_cond;   /* a job, or parser_stop */
    ngx_queue_t                jobs;        /* bodies to parse; mutex */
    ngx_queue_t                results;     /* parsed; mutex */
    ngx_uint_t                 parsers;     /* parse threads started */
    int                        parser_stop; /* set under the mutex, read
                                               atomically */
    pthread_t                  parser_tid[NGX_HTTP_NALAR_PARSE_LANES];
#ifdef NALAR_TEST_HOOKS
    char                      *hold_path;   /* nalar_test_hold_parse */
#endif
} ngx_http_nalar_worker_t;


extern ngx_module_t  ngx_nalar_module;

/*
 * The functions one file calls in another, by file, from the bottom of the
 * glue up: a file calls only files listed above it (t/07-layers.t checks
 * that the glue's call graph has no cycle).  Where a lower file must reach
 * a higher one, the higher one hands it a pointer: the request's write
 * event handler, a parse job's `parsed`, an event's handler.
 */

/* ngx_nalar_worker.c: the worker's state */
ngx_http_nalar_worker_t *ngx_http_nalar_worker(void);

/* ngx_nalar_ctx.c: a request's ctx and endpoint */
ngx_http_nalar_ctx_t *ngx_http_nalar_get_ctx(ngx_http_request_t *r);
ngx_uint_t ngx_http_nalar_endpoint(ngx_str_t *uri);
ngx_uint_t ngx_http_nalar_model_id(ngx_str_t *uri, ngx_str_t *id);

/* ngx_nalar_lora.c: LoRA adapters' directives, choice and counters */
char *ngx_http_nalar_lora(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
char *ngx_http_nalar_lora_allow(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
void ngx_http_nalar_lora_close(ngx_http_nalar_main_conf_t *nmcf);
char *ngx_http_nalar_lora_clash(ngx_conf_t *cf,
    ngx_http_nalar_main_conf_t *nmcf, ngx_str_t *name);
char *ngx_http_nalar_lora_merge(ngx_conf_t *cf,
    ngx_http_nalar_loc_conf_t *prev, ngx_http_nalar_loc_conf_t *conf);
ngx_int_t ngx_http_nalar_lora_in(ngx_http_request_t *r, nalar_api_in *in);
ngx_int_t ngx_http_nalar_lora_opts(ngx_pool_t *pool,
    ngx_http_nalar_main_conf_t *nmcf, ngx_uint_t model,
    nalar_engine_opts *opts);
size_t ngx_http_nalar_lora_metrics_size(ngx_http_nalar_main_conf_t *nmcf);
u_char *ngx_http_nalar_lora_metrics(ngx_pool_t *pool, u_char *p,
    u_char *end, ngx_http_nalar_main_conf_t *nmcf,
    ngx_http_nalar_model_rt_t *model);

/* ngx_nalar_output.c: JSON bodies, headers, server-sent events */
ngx_int_t ngx_http_nalar_send_json(ngx_http_request_t *r,
    ngx_uint_t status, json_t *j);
ngx_buf_t *ngx_http_nalar_json_buf(ngx_http_request_t *r, json_t *j);
ngx_int_t ngx_http_nalar_send_buf(ngx_http_request_t *r,
    ngx_uint_t status, ngx_buf_t *b);
void ngx_http_nalar_json_headers(ngx_http_request_t *r, ngx_buf_t *b);
ngx_int_t ngx_http_nalar_add_header(ngx_http_request_t *r,
    char *key, char *value);
ngx_int_t ngx_http_nalar_append_event(ngx_http_nalar_ctx_t *ctx,
    ngx_chain_t ***ll, json_t *j);
ngx_int_t ngx_http_nalar_append_chunk(ngx_http_nalar_ctx_t *ctx,
    ngx_chain_t ***ll, json_t *choice);

/* ngx_nalar_error.c: errors in OpenAI's shape */
ngx_int_t ngx_http_nalar_error(ngx_http_request_t *r,
    ngx_uint_t status, const char *type, const char *param, const char *code,
    const char *fmt, ...);
ngx_int_t ngx_http_nalar_failure(ngx_http_request_t *r,
    const nalar_failure *f);
ngx_int_t ngx_http_nalar_send_error(ngx_http_request_t *r,
    ngx_int_t rc);
ngx_int_t ngx_http_nalar_filter_init(ngx_conf_t *cf);

/* ngx_nalar_parse.c: the body and the parse threads */
void ngx_http_nalar_snapshot(nalar_api_model *models);
size_t ngx_http_nalar_body_size(ngx_chain_t *cl);
ngx_int_t ngx_http_nalar_read_body(ngx_http_request_t *r,
    u_char **data, size_t *len);
ngx_http_nalar_parse_t *ngx_http_nalar_parse_job(ngx_http_request_t *r,
    size_t len, nalar_api_in *in, ngx_http_nalar_parsed_pt parsed);
void *ngx_http_nalar_parse_thread(void *data);
void ngx_http_nalar_parse_release(ngx_http_nalar_parse_t *job);
void ngx_http_nalar_parse_post(ngx_http_nalar_parse_t *job);
void ngx_http_nalar_parse_free(ngx_http_nalar_parse_t *job);
#ifdef NALAR_TEST_HOOKS
void ngx_http_nalar_test_hold(size_t len);
#endif

/* ngx_nalar_done.c: to the engine and back */
ngx_int_t ngx_http_nalar_submit(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_request_params *p);
ngx_int_t ngx_http_nalar_add_cleanup(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx);
void ngx_http_nalar_slot_release(ngx_http_nalar_slot_t *slot);
void ngx_http_nalar_done_handler(ngx_event_t *ev);

/* ngx_nalar_response_tools.c: an answer's tool calls */
ngx_int_t ngx_http_nalar_tools_take(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch, nalar_output *o, const char **text,
    size_t *len);
ngx_int_t ngx_http_nalar_call_chunks(ngx_http_nalar_ctx_t *ctx,
    ngx_uint_t i, ngx_chain_t ***ll);
json_t *ngx_http_nalar_tool_calls_json(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch);

/* ngx_nalar_response.c: the engine's output to the client */
void ngx_http_nalar_write_handler(ngx_http_request_t *r);
void ngx_http_nalar_pump(ngx_http_nalar_ctx_t *ctx);
void ngx_http_nalar_timer_handler(ngx_event_t *ev);

/* ngx_nalar_shared.c: nalar_shared_prefix */
char *ngx_http_nalar_shared_prefix(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_nalar_tokenize_shared(
    ngx_http_nalar_model_rt_t *model, ngx_log_t *log);

/* ngx_nalar_edge.c: the edge's signed identity, made and verified */
char *ngx_http_nalar_edge_key(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_nalar_edge_sign(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, ngx_http_variable_value_t *v);
ngx_int_t ngx_http_nalar_edge_verify(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx);

/* ngx_nalar_tenancy.c: who a request is, and its cache scope */
ngx_int_t ngx_http_nalar_access_handler(ngx_http_request_t *r);
ngx_http_nalar_ctx_t *ngx_http_nalar_tenant(ngx_http_request_t *r);
ngx_int_t ngx_http_nalar_unauthorized(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx);
ngx_int_t ngx_http_nalar_scope(ngx_http_request_t *r,
    ngx_http_nalar_ctx_t *ctx, nalar_request_params *p);
char *ngx_http_nalar_jwt_key(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_nalar_route.c: an edge's route key and stream */
ngx_int_t ngx_http_nalar_route_init(ngx_conf_t *cf);
char *ngx_http_nalar_route_prefix(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_nalar_route_key_variable(ngx_http_request_t *r,
    ngx_http_variable_value_t *v, uintptr_t data);

/* ngx_nalar_status.c: /models, /health, /metrics */
ngx_int_t ngx_http_nalar_models(ngx_http_request_t *r);
ngx_int_t ngx_http_nalar_health(ngx_http_request_t *r);
ngx_int_t ngx_http_nalar_metrics_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_nalar_send_metrics(ngx_http_request_t *r, ngx_buf_t *b);

/* ngx_nalar_edge_status.c: an edge's counters, /metrics and health */
ngx_int_t ngx_http_nalar_edge_status_init(ngx_conf_t *cf);
char *ngx_http_nalar_edge_zone(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_edge_metrics(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_edge_health(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_nalar_variables.c: the $nalar_* variables */
ngx_int_t ngx_http_nalar_add_variables(ngx_conf_t *cf);

/* ngx_nalar_handler.c: the content handler */
ngx_int_t ngx_http_nalar_content_handler(ngx_http_request_t *r);

/* ngx_nalar_engine_conf.c: the engine's directives */
char *ngx_http_nalar_kv_cache(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_gpu_memory(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_speculative(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_max_batch_tokens(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_nalar_itl_target(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* ngx_nalar_template.c: nalar_chat_template and a model's own template */
char *ngx_http_nalar_chat_template(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_nalar_model_template(ngx_conf_t *cf,
    ngx_http_nalar_model_t *model);

/* ngx_nalar_process.c: a worker's life */
ngx_int_t ngx_http_nalar_init_process(ngx_cycle_t *cycle);
void ngx_http_nalar_exit_process(ngx_cycle_t *cycle);


#endif /* NGX_NALAR_MODULE_H */
