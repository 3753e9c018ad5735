/*
 * Tools on chat (see api/request.h): `tools`, `tool_choice` and
 * `parallel_tool_calls` checked and turned into the schema the grammar
 * holds a call to, and the tool calls and tool answers of earlier turns.
 * No nginx dependency, no shared state: safe on any thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request_internal.h"
#include "grammar.h"


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

int
nalar_api_tools(nalar_api_request *req, int style, json_t **render)
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

int
nalar_api_tool_msg(nalar_api_request *req, json_t *e, size_t i)
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
