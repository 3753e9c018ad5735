/*
 * Tool calls in a chat answer, as the response writes them: each choice's
 * tool parser fed with the engine's output (api/tools.c), the
 * calls streamed as OpenAI's tool_calls deltas, or whole in
 * message.tool_calls, and their ids.
 *
 * Event loop only, called from ngx_nalar_response.c; touches the
 * request's ctx, its choices and its pool, never an engine lock.
 */

#include "ngx_nalar_module.h"


static void ngx_http_nalar_call_id(ngx_http_nalar_ctx_t *ctx,
    nalar_tool_call *c);
static void ngx_http_nalar_tools_cleanup(void *data);


/*
 * A take of a chat answer with tools through the choice's tool parser
 * (made on the first take): *text becomes the content part of what is
 * confirmed so far; the calls stay in the parser.
 */

ngx_int_t
ngx_http_nalar_tools_take(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch, nalar_output *o, const char **text,
    size_t *len)
{
    ngx_pool_cleanup_t            *cln;
    const nalar_chat_call_format  *fmt;

    if (ch->tools == NULL) {
        fmt = nalar_chat_call_format_of((nalar_chat_style) ctx->chat_style);
        if (fmt == NULL) {
            return NGX_OK;
        }

        cln = ngx_pool_cleanup_add(ctx->request->pool,
                                   sizeof(nalar_tool_parser));
        if (cln == NULL) {
            return NGX_ERROR;
        }

        ch->tools = cln->data;
        nalar_toolp_init(ch->tools, fmt,
                         nalar_model_tokenizer(
                             nalar_engine_model(ctx->model->engine)),
                         ctx->tool_mode == NALAR_API_TOOLS_CALL);
        cln->handler = ngx_http_nalar_tools_cleanup;
    }

    if (nalar_toolp_feed(ch->tools, o->text, o->text_len, o->ids, o->n_ids)
        != 0)
    {
        return NGX_ERROR;
    }

    if (o->finish != NALAR_FINISH_NONE
        && nalar_toolp_finish(ch->tools) != 0)
    {
        return NGX_ERROR;
    }

    *text = nalar_toolp_take_content(ch->tools, len);

    return NGX_OK;
}


static void
ngx_http_nalar_tools_cleanup(void *data)
{
    nalar_toolp_free(data);
}


/*
 * The calls of a streamed answer as OpenAI streams them: a call's first
 * chunk, once its name is complete, with its index, id, type and name;
 * then its arguments as they come, in fragments.
 */

ngx_int_t
ngx_http_nalar_call_chunks(ngx_http_nalar_ctx_t *ctx, ngx_uint_t i,
    ngx_chain_t ***ll)
{
    size_t                    k, n;
    json_t                   *choice;
    nalar_tool_call          *c;
    ngx_http_nalar_choice_t  *ch;

    ch = &ctx->choices[i];
    n = nalar_toolp_n_named(ch->tools);

    for (k = 0; k < n; k++) {
        c = &ch->tools->calls[k];

        if (!c->announced) {
            ngx_http_nalar_call_id(ctx, c);
            c->announced = 1;

            choice = json_pack("{s:I,s:{s:[{s:I,s:s,s:s,s:{s:s%,s:s}}]},"
                               "s:n,s:n}",
                               "index", (json_int_t) i,
                               "delta", "tool_calls",
                               "index", (json_int_t) k,
                               "id", c->id,
                               "type", "function",
                               "function", "name", c->name, c->name_len,
                               "arguments", "",
                               "logprobs", "finish_reason");

            if (ngx_http_nalar_append_chunk(ctx, ll, choice) != NGX_OK) {
                return NGX_ERROR;
            }
        }

        if (c->args_len > c->args_sent) {
            choice = json_pack("{s:I,s:{s:[{s:I,s:{s:s%}}]},s:n,s:n}",
                               "index", (json_int_t) i,
                               "delta", "tool_calls",
                               "index", (json_int_t) k,
                               "function", "arguments",
                               c->args + c->args_sent,
                               c->args_len - c->args_sent,
                               "logprobs", "finish_reason");

            if (ngx_http_nalar_append_chunk(ctx, ll, choice) != NGX_OK) {
                return NGX_ERROR;
            }

            c->args_sent = c->args_len;
        }
    }

    return NGX_OK;
}


/* The calls of an answer that is not streamed: message.tool_calls. */

json_t *
ngx_http_nalar_tool_calls_json(ngx_http_nalar_ctx_t *ctx,
    ngx_http_nalar_choice_t *ch)
{
    size_t            k, n;
    json_t           *calls;
    nalar_tool_call  *c;

    calls = json_array();
    if (calls == NULL) {
        return NULL;
    }

    n = nalar_toolp_n_named(ch->tools);

    for (k = 0; k < n; k++) {
        c = &ch->tools->calls[k];
        ngx_http_nalar_call_id(ctx, c);

        if (json_array_append_new(calls,
                json_pack("{s:s,s:s,s:{s:s%,s:s%}}",
                          "id", c->id,
                          "type", "function",
                          "function", "name", c->name, c->name_len,
                          "arguments", c->args ? c->args : "",
                          c->args_len))
            != 0)
        {
            json_decref(calls);
            return NULL;
        }
    }

    return calls;
}


/* "call_" and 24 random letters and digits; Mistral's templates take ids
 * of 9 letters and digits, and get those. */

static void
ngx_http_nalar_call_id(ngx_http_nalar_ctx_t *ctx, nalar_tool_call *c)
{
    size_t                         k, n;
    u_char                        *p;
    const nalar_chat_call_format  *fmt;
    static const char              alnum[] = "abcdefghijklmnopqrstuvwxyz"
                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                             "0123456789";

    fmt = nalar_chat_call_format_of((nalar_chat_style) ctx->chat_style);

    p = (u_char *) c->id;
    n = 24;

    if (fmt && fmt->id_len) {
        n = (size_t) fmt->id_len;

    } else {
        p = ngx_cpymem(p, "call_", 5);
    }

    for (k = 0; k < n; k++) {
        *p++ = alnum[ngx_random() % (sizeof(alnum) - 1)];
    }

    *p = '\0';
}
