/*
 * The request: an OpenAI completions or chat completions body (JSON
 * bytes) becomes the engine's nalar_request_params and what the response
 * needs (n, stream, logprobs), or an OpenAI-shaped error (status, type,
 * param, code, message).
 *
 * This file owns the body's fields and their rules; it knows nothing of
 * nginx or of a running engine.  What it must know of the models comes in
 * as a snapshot (nalar_api_model), so a parse may run on any thread: the
 * module runs it off the event loop for a large body, since its work grows
 * with the body (the JSON parse, walks over messages, token ids, stop
 * strings).  Everything a parse makes hangs off its nalar_api_request and
 * is freed by nalar_api_request_free, on any thread.
 */
#ifndef NGX_NALAR_REQUEST_H
#define NGX_NALAR_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine.h"
#include "chat.h"
#include "chat_template.h"

#define NALAR_API_MAX_N         16      /* choices per request */
#define NALAR_API_MAX_STOP      4       /* user stop strings, as OpenAI */
#define NALAR_API_MAX_STOP_LEN  256     /* bytes of each (the matcher's
                                           work per token grows with it) */
#define NALAR_API_MAX_LOGPROBS  20

/* what a parse knows of a configured model */
typedef struct {
    const char  *name;
    size_t       name_len;
    int          state;         /* 1 ready, 0 loading, -1 failed to load,
                                   -2 not started in this worker */
    char         error[256];    /* why it failed (state -1) */
    nalar_limits limits;        /* once ready */
    int          chat_style;    /* its template's style, once ready */
    const nalar_chat_template *tmpl;    /* its own chat template compiled
                                           (tokenizer.chat_template), or
                                           NULL: chat_style renders */
    const char  *bos;           /* its BOS and EOS tokens' text, once
                                   ready ("" or NULL: none) */
    const char  *eos;
} nalar_api_model;

/*
 * A LoRA adapter a parse may serve: its name, its base (an index in the
 * models) and what the engine calls it (nalar_request_params.adapter: its
 * index + 1 in the base's adapters).  The caller chooses which the list
 * holds: the parse never serves an adapter that is not in it.
 */
typedef struct {
    const char  *name;
    size_t       name_len;
    int          model;         /* index in models */
    int32_t      adapter;       /* > 0 */
} nalar_api_lora;

typedef struct {
    int                    chat;        /* 1: chat completions */
    const nalar_api_model *models;      /* the first is the default */
    size_t                 n_models;
    int                    chat_style;  /* the location's; NALAR_CHAT_AUTO:
                                           the model's */
    const nalar_chat_template *tmpl;    /* the location's template (file=),
                                           or NULL: as chat_style says */
    int                    spec_off;    /* a prediction is checked, then
                                           dropped */
    int                    tokenize;    /* /tokenize: the prompt only (chat
                                           when the body has messages, else
                                           completions), its ids the answer
                                           (params.tokenize_only) */
    uint64_t               seed;        /* when the body names none */
    const nalar_api_lora  *loras;       /* adapters a body may name */
    size_t                 n_loras;
    int                    lora_forced; /* 1: loras[0] (n_loras 1) serves
                                           every request, whose `model`
                                           may name it, its base or
                                           nothing; any other name is
                                           unknown */
} nalar_api_in;

/* what the answer of a chat request with tools is */
#define NALAR_API_TOOLS_NONE    0   /* text */
#define NALAR_API_TOOLS_AUTO    1   /* text, or calls if it opens with one */
#define NALAR_API_TOOLS_CALL    2   /* one call: tool_choice "required" or
                                       a named function; the prompt ends
                                       with the style's call opener and the
                                       grammar holds the answer to a call */

typedef struct {
    /* the prompt's and prediction's text, and the stop strings, point
     * into the JSON and the arrays below (nalar_request_create copies
     * them); the location's speculation and the cache scope are the
     * caller's to fill */
    nalar_request_params  params;

    int                   model;        /* index in models; -1: none */
    int                   lora;         /* index in the input's loras;
                                           -1: the base alone
                                           (params.adapter is its
                                           adapter) */
    int                   n;            /* choices */
    int                   logprobs;     /* top-N, or -1: off */
    unsigned              stream:1;
    unsigned              include_usage:1;
    unsigned              token_ids:1;  /* logprobs tokens as ids */
    int32_t               prompt_tokens;    /* counted where a prompt of
                                               ids was refused as too long */
    int                   chat_style;   /* the rendering's (chat) */
    int                   tool_mode;    /* NALAR_API_TOOLS_* */
    nalar_failure         err;          /* status 0: none */

    /* owned */
    json_t               *root;
    nalar_tok_text       *prompt_text;
    nalar_prompt         *prompt;       /* a chat template's render, for
                                           intake (params.prompt_shared) */
    nalar_tok_text       *prediction_text;
    nalar_chat_msg       *msgs;
    int32_t              *ids;
    nalar_chat_tool_msg  *tool_msgs;
    char                 *tool_schema;  /* the call's JSON Schema */
    char                 *schema_text;  /* response_format's schema */
    const char           *stops[NALAR_API_MAX_STOP + 1];
} nalar_api_request;

/*
 * Parses `body` (len bytes) into *req (which it initialises).  0, or -1
 * with req->err: a status of 503 (code model_loading or model_failed)
 * says the model was not ready in the snapshot; a 400 with code
 * context_length_exceeded for an id array counted req->prompt_tokens ids
 * (its message the engine's, from the snapshot's limits).
 * Either way the request is freed with nalar_api_request_free.
 */
int nalar_api_parse(const char *body, size_t len, const nalar_api_in *in,
                    nalar_api_request *req);
void nalar_api_request_free(nalar_api_request *req);

/*
 * A completions body of at least nalar_api_count_min bytes is scanned
 * first (nalar_api_count_ids): where its prompt is ids whose count alone
 * decides the answer (context_length_exceeded; prompt[0] is not an id,
 * for arrays of ids; an error of the other fields, which are parsed with
 * a placeholder for the ids; the model not ready), that is the answer,
 * and the ids never become a tree; anything else takes the full parse.
 * Either way the answer is the full parse's.  Below the minimum the ids'
 * tree is some MB at most; above it, it grows to about 10 times the body.
 * A variable for the tests.
 */
#define NALAR_API_COUNT_MIN  (1024 * 1024)

extern size_t  nalar_api_count_min;

typedef struct {
    size_t       start;         /* the prompt value's bytes in the body */
    size_t       end;
    size_t       count;         /* its ids, as the context check counts */
    unsigned     arrays:1;      /* two or more arrays of ids: count is
                                   theirs, and prompt[0] is not an id */
} nalar_api_ids;

/*
 * One pass over `body` with a fixed state: 1 where it opens as a JSON
 * object whose first top-level "prompt" member (a key without escapes),
 * after valid JSON, is an array of one or more integers (of at most 18
 * digits), or an array of such arrays; 0 otherwise.  It checks the
 * grammar up to the prompt's end only, and no string's UTF-8 or key's
 * uniqueness.
 */
int nalar_api_count_ids(const char *body, size_t len, nalar_api_ids *ids);

#endif
