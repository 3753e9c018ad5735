/*
 * Chat templates (see api/chat.h).  The layouts follow the reference
 * templates shipped with the model families (one turn each, then the
 * generation prompt):
 *   ChatML:  <|im_start|>{role}\n{content}<|im_end|>\n
 *            ... <|im_start|>assistant\n
 *   Llama-2: [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
 *            {assistant} </s><s>[INST] ...
 *   Llama-3: <|start_header_id|>{role}<|end_header_id|>\n\n{content}
 *            <|eot_id|> ... <|start_header_id|>assistant<|end_header_id|>
 *   Zephyr:  <|{role}|>\n{content}</s>\n ... <|assistant|>\n
 *   Mistral v1: " [INST] {user} [/INST] {assistant}</s> [INST] ..."
 *            (Mistral 7B v0.1 and v0.2, Mixtral 8x7B; the system prompt
 *            opens the first user turn)
 *   Mistral v3: [INST] {user}[/INST] {assistant}</s>[INST] ... (Mistral 7B
 *            v0.3, Mixtral 8x22B, Large 2407; the system prompt opens the
 *            last user turn; the assistant's content is trimmed)
 *   Mistral: [INST]{user}[/INST]{assistant}</s>[INST] ... (v3 tekken:
 *            Nemo, Ministral 8B 2410; the system prompt opens the last
 *            user turn)
 *   Mistral v7 (SentencePiece): [SYSTEM_PROMPT] {system}[/SYSTEM_PROMPT]
 *            [INST] {user}[/INST] {assistant}</s> ... (Large 2411)
 *   Mistral v7: [SYSTEM_PROMPT]{system}[/SYSTEM_PROMPT][INST]{user}[/INST]
 *            {assistant}</s> ... (tekken: Mistral Small 3 and later)
 *   Gemma:   <start_of_turn>{role}\n{content}<end_of_turn>\n ...
 *            <start_of_turn>model\n (assistant is "model"; no system
 *            role: the system prompt opens the first user turn)
 *   Phi-3:   <|{role}|>\n{content}<|end|>\n ... <|assistant|>\n
 */
#include <stdlib.h>
#include <string.h>

#include "chat.h"

/* The pieces rendered so far: markup or message content.  Text written
 * here (JSON) is kept in `own`; its pieces record their offset there
 * (own_at; NALAR_CHAT_NOT_OWN for the others) until the end, where the
 * pieces and that text become one allocation. */
typedef struct {
    nalar_tok_text  *v;
    size_t          *own_at;    /* (cap) */
    size_t           n;
    size_t           cap;
    char            *own;
    size_t           own_len;
    size_t           own_cap;
    int              failed;
} chat_buf;

#define NALAR_CHAT_NOT_OWN  ((size_t) -1)


static void
chat_piece_at(chat_buf *b, const char *s, size_t n, int special, size_t at)
{
    size_t           cap, *na;
    nalar_tok_text  *nv;

    if (b->failed || n == 0) {
        return;
    }

    if (b->n == b->cap) {
        cap = b->cap ? b->cap * 2 : 16;
        nv = realloc(b->v, cap * sizeof(nalar_tok_text));
        if (nv == NULL) {
            b->failed = 1;
            return;
        }
        b->v = nv;
        na = realloc(b->own_at, cap * sizeof(size_t));
        if (na == NULL) {
            b->failed = 1;
            return;
        }
        b->own_at = na;
        b->cap = cap;
    }

    b->v[b->n].text = s;
    b->v[b->n].len = n;
    b->v[b->n].special = special;
    b->own_at[b->n] = at;
    b->n++;
}


static void
chat_piece(chat_buf *b, const char *s, size_t n, int special)
{
    chat_piece_at(b, s, n, special, NALAR_CHAT_NOT_OWN);
}


/* Room for n more bytes of own text; NULL: out of memory. */

static char *
chat_own_room(chat_buf *b, size_t n)
{
    char    *p;
    size_t   cap;

    if (b->failed) {
        return NULL;
    }

    if (b->own_len + n > b->own_cap) {
        cap = b->own_cap ? b->own_cap : 256;
        while (cap < b->own_len + n) {
            cap *= 2;
        }
        p = realloc(b->own, cap);
        if (p == NULL) {
            b->failed = 1;
            return NULL;
        }
        b->own = p;
        b->own_cap = cap;
    }

    return b->own + b->own_len;
}


/* A JSON value written here, as literal text (it is the client's). */

static void
chat_json(chat_buf *b, const json_t *j, size_t flags)
{
    char    *p;
    size_t   n;

    n = json_dumpb(j, NULL, 0, flags | JSON_ENCODE_ANY);
    if (n == 0) {
        b->failed = 1;
        return;
    }

    p = chat_own_room(b, n);
    if (p == NULL) {
        return;
    }

    json_dumpb(j, p, n, flags | JSON_ENCODE_ANY);
    chat_piece_at(b, NULL, n, 0, b->own_len);
    b->own_len += n;
}


/* template markup: its control tokens are parsed */

static void
chat_puts(chat_buf *b, const char *s)
{
    chat_piece(b, s, strlen(s), 1);
}


/* the role names a template writes (checked against a fixed list first) */

static void
chat_role(chat_buf *b, const nalar_chat_msg *m)
{
    chat_piece(b, m->role, m->role_len, 1);
}


/* what a message says: literal text, never a control token */

static void
chat_content(chat_buf *b, const nalar_chat_msg *m)
{
    size_t  i;

    for (i = 0; i < m->n_parts; i++) {
        chat_piece(b, m->parts[i].text, m->parts[i].len, 0);
    }
}


static int
role_is(const nalar_chat_msg *m, const char *role)
{
    return m->role_len == strlen(role)
           && memcmp(m->role, role, m->role_len) == 0;
}


/* "developer" is OpenAI's newer name for the system role. */
static int
role_system(const nalar_chat_msg *m)
{
    return role_is(m, "system") || role_is(m, "developer");
}


/* tool calling */

static const nalar_chat_call_format  fmt_chatml =
    { "<tool_call>", "</tool_call>", "arguments", "<tool_call>\n", 0 };
static const nalar_chat_call_format  fmt_llama3 =
    { "", NULL, "parameters", "", 0 };
static const nalar_chat_call_format  fmt_mistral =
    { "[TOOL_CALLS]", NULL, "arguments", "[TOOL_CALLS][", 9 };
static const nalar_chat_call_format  fmt_mistral_spm =
    { "[TOOL_CALLS]", NULL, "arguments", "[TOOL_CALLS] [", 9 };


const nalar_chat_call_format *
nalar_chat_call_format_of(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_CHATML:
        return &fmt_chatml;
    case NALAR_CHAT_LLAMA3:
        return &fmt_llama3;
    case NALAR_CHAT_MISTRAL:
    case NALAR_CHAT_MISTRAL_V7:
        return &fmt_mistral;
    case NALAR_CHAT_MISTRAL_V3:
    case NALAR_CHAT_MISTRAL_V7_SPM:
        return &fmt_mistral_spm;
    default:
        return NULL;
    }
}


static int
tools_on(const nalar_chat_tools *t)
{
    return t != NULL && t->tools != NULL && json_array_size(t->tools) > 0;
}


/* an assistant message's tool calls, or NULL */

static const json_t *
msg_calls(const nalar_chat_tools *t, size_t i)
{
    const json_t  *c;

    if (t == NULL || t->msgs == NULL) {
        return NULL;
    }

    c = t->msgs[i].tool_calls;

    return json_array_size(c) > 0 ? c : NULL;
}


/* a tool message rendered in the style's tool format (with tool info) */

static int
msg_tool(const nalar_chat_tools *t, const nalar_chat_msg *m)
{
    return t != NULL && role_is(m, "tool");
}


static int
msg_has_text(const nalar_chat_msg *m)
{
    size_t  i;

    for (i = 0; i < m->n_parts; i++) {
        if (m->parts[i].len > 0) {
            return 1;
        }
    }

    return 0;
}


/* The name of call j (a JSON string, quoted). */

static void
chat_call_name(chat_buf *b, const json_t *calls, size_t j)
{
    chat_json(b, json_object_get(json_object_get(json_array_get(calls, j),
                                                 "function"),
                                 "name"), 0);
}


/*
 * The arguments of call j: the JSON its string holds, written as the
 * templates' tojson writes a value (", " and ": " between items); a string
 * that holds no JSON as a JSON string.
 */

static void
chat_call_args(chat_buf *b, const json_t *calls, size_t j)
{
    json_t        *v;
    const json_t  *a;
    json_error_t   e;

    a = json_object_get(json_object_get(json_array_get(calls, j), "function"),
                        "arguments");

    if (!json_is_string(a)) {
        v = json_object();
        chat_json(b, v, 0);
        json_decref(v);
        return;
    }

    v = json_loadb(json_string_value(a), json_string_length(a),
                   JSON_DECODE_ANY, &e);

    chat_json(b, v ? v : a, 0);
    json_decref(v);
}


/*
 * ChatML with tools, as Hermes and Qwen 2.5 write them: the tools, one JSON
 * object a line, within <tools></tools> in the system turn (after the
 * first system message's text), a call as
 * <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> in the
 * assistant's turn, and the answers of consecutive tool messages, each
 * within <tool_response></tool_response>, in one user turn.
 */
static void
render_chatml(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
              const nalar_chat_tools *t)
{
    size_t         i, j, first;
    const json_t  *calls;

    first = 0;

    if (tools_on(t)) {
        chat_puts(b, "<|im_start|>system\n");
        if (n > 0 && role_system(&msgs[0])) {
            chat_content(b, &msgs[0]);
            chat_puts(b, "\n\n");
            first = 1;
        }
        chat_puts(b, "# Tools\n\nYou may call one or more of the functions "
                  "below to help with the user's request. Their signatures "
                  "are within <tools></tools> XML tags:\n<tools>");
        for (j = 0; j < json_array_size(t->tools); j++) {
            chat_puts(b, "\n");
            chat_json(b, json_array_get(t->tools, j), 0);
        }
        chat_puts(b, "\n</tools>\n\nTo call a function, answer with a JSON "
                  "object of its name and arguments within "
                  "<tool_call></tool_call> XML tags, one call each:\n"
                  "<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}\n</tool_call><|im_end|>\n");
    }

    for (i = first; i < n; i++) {
        calls = msg_calls(t, i);

        if (msg_tool(t, &msgs[i])) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool")) {
                chat_puts(b, "<|im_start|>user");
            }
            chat_puts(b, "\n<tool_response>\n");
            chat_content(b, &msgs[i]);
            chat_puts(b, "\n</tool_response>");
            if (i + 1 == n || !role_is(&msgs[i + 1], "tool")) {
                chat_puts(b, "<|im_end|>\n");
            }
            continue;
        }

        if (calls != NULL) {
            chat_puts(b, "<|im_start|>assistant");
            if (msg_has_text(&msgs[i])) {
                chat_puts(b, "\n");
                chat_content(b, &msgs[i]);
            }
            for (j = 0; j < json_array_size(calls); j++) {
                chat_puts(b, "\n<tool_call>\n{\"name\": ");
                chat_call_name(b, calls, j);
                chat_puts(b, ", \"arguments\": ");
                chat_call_args(b, calls, j);
                chat_puts(b, "}\n</tool_call>");
            }
            chat_puts(b, "<|im_end|>\n");
            continue;
        }

        chat_puts(b, "<|im_start|>");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "<|im_end|>\n");
    }

    chat_puts(b, "<|im_start|>assistant\n");

    if (t != NULL && t->open_call) {
        chat_puts(b, fmt_chatml.prompt_open);
    }
}


/*
 * Llama 3.1 with tools: the tools, each as JSON indented by 4, in the
 * system turn ("Environment: ipython", then how to call, then the tools,
 * then the first system message's text); a call is the assistant's whole
 * turn, {"name": ..., "parameters": ...}, one per turn; a tool's answer is
 * an "ipython" turn.
 */
static int
render_llama3(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
              const nalar_chat_tools *t, nalar_err *err)
{
    size_t         i, j, first;
    const json_t  *calls;

    first = 0;

    if (tools_on(t)) {
        chat_puts(b, "<|start_header_id|>system<|end_header_id|>\n\n"
                  "Environment: ipython\n\n"
                  "You can call the functions below. To call one, answer "
                  "with nothing but a JSON object of the form {\"name\": "
                  "function name, \"parameters\": object of argument names "
                  "and their values}. Write the values themselves, not "
                  "variables.\n\n");
        for (j = 0; j < json_array_size(t->tools); j++) {
            chat_json(b, json_array_get(t->tools, j), JSON_INDENT(4));
            chat_puts(b, "\n\n");
        }
        if (n > 0 && role_system(&msgs[0])) {
            chat_content(b, &msgs[0]);
            first = 1;
        }
        chat_puts(b, "<|eot_id|>");
    }

    for (i = first; i < n; i++) {
        calls = msg_calls(t, i);

        if (msg_tool(t, &msgs[i])) {
            chat_puts(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            chat_content(b, &msgs[i]);
            chat_puts(b, "<|eot_id|>");
            continue;
        }

        if (calls != NULL) {
            if (json_array_size(calls) != 1) {
                return nalar_fail(err, "messages[%zu]: the llama3 chat "
                                  "template takes one tool call per "
                                  "assistant message", i);
            }
            chat_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n"
                      "{\"name\": ");
            chat_call_name(b, calls, 0);
            chat_puts(b, ", \"parameters\": ");
            chat_call_args(b, calls, 0);
            chat_puts(b, "}<|eot_id|>");
            continue;
        }

        chat_puts(b, "<|start_header_id|>");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "<|end_header_id|>\n\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "<|eot_id|>");
    }

    chat_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");

    return 0;
}


static void
render_zephyr(chat_buf *b, const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        chat_puts(b, "<|");
        if (role_is(&msgs[i], "developer")) {
            chat_puts(b, "system");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "|>\n");
        chat_content(b, &msgs[i]);
        chat_puts(b, "</s>\n");
    }

    chat_puts(b, "<|assistant|>\n");
}


static int
is_trim_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v'
           || c == '\f';
}


/* The content without the whitespace at its ends (Jinja's trim). */

static void
chat_content_trim(chat_buf *b, const nalar_chat_msg *m)
{
    size_t       i, first, last, skip_head, skip_tail;
    const char  *t;

    /* the first and last parts that hold more than whitespace */

    first = m->n_parts;
    last = 0;
    skip_head = 0;
    skip_tail = 0;

    for (i = 0; i < m->n_parts; i++) {
        for (t = m->parts[i].text; t < m->parts[i].text + m->parts[i].len;
             t++)
        {
            if (!is_trim_space(*t)) {
                break;
            }
        }
        if (t < m->parts[i].text + m->parts[i].len) {
            first = i;
            skip_head = (size_t) (t - m->parts[i].text);
            break;
        }
    }

    if (first == m->n_parts) {
        return;
    }

    for (i = m->n_parts; i-- > first; ) {
        size_t  n = m->parts[i].len;

        while (n > 0 && is_trim_space(m->parts[i].text[n - 1])) {
            n--;
        }
        if (n > 0) {
            last = i;
            skip_tail = m->parts[i].len - n;
            break;
        }
    }

    for (i = first; i <= last; i++) {
        size_t  off = i == first ? skip_head : 0;
        size_t  end = m->parts[i].len - (i == last ? skip_tail : 0);

        chat_piece(b, m->parts[i].text + off, end - off, 0);
    }
}


/* The layouts of Mistral's [INST] templates before v7. */
typedef struct {
    const char  *name;
    const char  *inst;        /* opens a user turn */
    const char  *inst_end;    /* closes it */
    const char  *reply;       /* opens an assistant turn */
    int          sys_first;   /* the system prompt opens the first user
                                 turn, not the last */
    int          trim_reply;  /* the assistant's content is trimmed */
    const char  *sp;          /* after a tool marker (SentencePiece: a
                                 space) */
} mistral_layout;


static const mistral_layout  mistral_v1 =
    { "mistral-v1", " [INST] ", " [/INST]", " ", 1, 0, " " };
static const mistral_layout  mistral_v3 =
    { "mistral-v3", "[INST] ", "[/INST]", " ", 0, 1, " " };
static const mistral_layout  mistral_v3_tekken =
    { "mistral", "[INST]", "[/INST]", "", 0, 0, "" };


/*
 * Mistral's tool format (v3 and later): the tools as one JSON array within
 * [AVAILABLE_TOOLS][/AVAILABLE_TOOLS] before the last user turn, an
 * assistant's calls as [TOOL_CALLS][{"name": ..., "arguments": ...,
 * "id": ...}, ...] closed by </s>, a tool's answer as
 * [TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS] (the
 * content as it is, as the templates write it).  SentencePiece templates
 * put a space after each opening marker.
 */

static void
mistral_tools(chat_buf *b, const nalar_chat_tools *t, const char *sp)
{
    chat_puts(b, "[AVAILABLE_TOOLS]");
    chat_puts(b, sp);
    chat_json(b, t->tools, 0);
    chat_puts(b, "[/AVAILABLE_TOOLS]");
}


static void
mistral_calls(chat_buf *b, const json_t *calls, const char *sp)
{
    size_t  j;

    chat_puts(b, "[TOOL_CALLS]");
    chat_puts(b, sp);
    chat_puts(b, "[");
    for (j = 0; j < json_array_size(calls); j++) {
        chat_puts(b, j ? ", {\"name\": " : "{\"name\": ");
        chat_call_name(b, calls, j);
        chat_puts(b, ", \"arguments\": ");
        chat_call_args(b, calls, j);
        chat_puts(b, ", \"id\": ");
        chat_json(b, json_object_get(json_array_get(calls, j), "id"), 0);
        chat_puts(b, "}");
    }
    chat_puts(b, "]</s>");
}


static int
mistral_result(chat_buf *b, const nalar_chat_tools *t,
               const nalar_chat_msg *msgs, size_t i, const char *sp,
               const char *name, nalar_err *err)
{
    const json_t  *id;

    id = t->msgs ? t->msgs[i].tool_call_id : NULL;

    if (!json_is_string(id)) {
        return nalar_fail(err, "messages[%zu]: the %s chat template needs "
                          "the tool_call_id of a tool message", i, name);
    }

    chat_puts(b, "[TOOL_RESULTS]");
    chat_puts(b, sp);
    chat_puts(b, "{\"content\": ");
    chat_content(b, &msgs[i]);
    chat_puts(b, ", \"call_id\": ");
    chat_json(b, id, 0);
    chat_puts(b, "}[/TOOL_RESULTS]");

    return 0;
}


/* the last user turn: where the tools go */

static size_t
last_user(const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = n; i-- > 0; ) {
        if (role_is(&msgs[i], "user")) {
            return i;
        }
    }

    return n;
}


/*
 * Mistral before v7: no system role; the system messages, in order, each
 * followed by a blank line, open one user turn, as mistral-common places
 * the system prompt: the first (v1), or the last message when it is a user
 * turn (the turn the model answers; v2 and later).
 */
static int
render_mistral(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
               const mistral_layout *l, const nalar_chat_tools *t,
               nalar_err *err)
{
    size_t         i, k, n_sys, sys_user, tools_user;
    const json_t  *calls;

    n_sys = 0;
    sys_user = n;
    tools_user = tools_on(t) ? last_user(msgs, n) : n;

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            n_sys++;

        } else if (msg_tool(t, &msgs[i]) || msg_calls(t, i) != NULL) {
            /* a call and its answers leave the user turn before them the
             * last one */

        } else if (l->sys_first) {
            if (sys_user == n && role_is(&msgs[i], "user")) {
                sys_user = i;
            }

        } else {
            sys_user = role_is(&msgs[i], "user") ? i : n;
        }
    }

    if (n_sys > 0 && sys_user == n) {
        return nalar_fail(err, "the %s chat template places the system "
                          "message in the %s user turn, and there is none",
                          l->name, l->sys_first ? "first" : "last");
    }

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            continue;
        }

        calls = msg_calls(t, i);

        if (calls != NULL) {
            mistral_calls(b, calls, l->sp);

        } else if (msg_tool(t, &msgs[i])) {
            if (mistral_result(b, t, msgs, i, l->sp, l->name, err) != 0) {
                return -1;
            }

        } else if (role_is(&msgs[i], "user")) {
            if (i == tools_user) {
                mistral_tools(b, t, l->sp);
            }
            chat_puts(b, l->inst);
            if (i == sys_user) {
                for (k = 0; k < n; k++) {
                    if (role_system(&msgs[k])) {
                        chat_content(b, &msgs[k]);
                        chat_puts(b, "\n\n");
                    }
                }
            }
            chat_content(b, &msgs[i]);
            chat_puts(b, l->inst_end);

        } else if (role_is(&msgs[i], "assistant")) {
            chat_puts(b, l->reply);
            if (l->trim_reply) {
                chat_content_trim(b, &msgs[i]);
            } else {
                chat_content(b, &msgs[i]);
            }
            chat_puts(b, "</s>");

        } else {
            return nalar_fail(err, "messages[%zu]: role \"%.*s\" is not "
                              "supported by the %s chat template", i,
                              (int) msgs[i].role_len, msgs[i].role, l->name);
        }
    }

    if (t != NULL && t->open_call) {
        chat_puts(b, l->sp[0] ? fmt_mistral_spm.prompt_open
                              : fmt_mistral.prompt_open);
    }

    return 0;
}


/*
 * Mistral v7: the system prompt has its own markers, in place.  The
 * SentencePiece template (Large 2411) writes a space after each opening
 * marker and before the assistant's content; tekken's (Small 3) none.
 */
static int
render_mistral_v7(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
                  int spm, const nalar_chat_tools *t, nalar_err *err)
{
    size_t         i, tools_user;
    const char    *sp, *name;
    const json_t  *calls;

    sp = spm ? " " : "";
    name = spm ? "mistral-v7-spm" : "mistral-v7";
    tools_user = tools_on(t) ? last_user(msgs, n) : n;

    for (i = 0; i < n; i++) {
        calls = msg_calls(t, i);

        if (calls != NULL) {
            mistral_calls(b, calls, sp);
            continue;
        }

        if (msg_tool(t, &msgs[i])) {
            if (mistral_result(b, t, msgs, i, sp, name, err) != 0) {
                return -1;
            }
            continue;
        }

        if (i == tools_user) {
            mistral_tools(b, t, sp);
        }

        if (role_system(&msgs[i])) {
            chat_puts(b, spm ? "[SYSTEM_PROMPT] " : "[SYSTEM_PROMPT]");
            chat_content(b, &msgs[i]);
            chat_puts(b, "[/SYSTEM_PROMPT]");

        } else if (role_is(&msgs[i], "user")) {
            chat_puts(b, spm ? "[INST] " : "[INST]");
            chat_content(b, &msgs[i]);
            chat_puts(b, "[/INST]");

        } else if (role_is(&msgs[i], "assistant")) {
            chat_puts(b, spm ? " " : "");
            chat_content(b, &msgs[i]);
            chat_puts(b, "</s>");

        } else {
            return nalar_fail(err, "messages[%zu]: role \"%.*s\" is not "
                              "supported by the %s chat template",
                              i, (int) msgs[i].role_len, msgs[i].role, name);
        }
    }

    if (t != NULL && t->open_call) {
        chat_puts(b, spm ? fmt_mistral_spm.prompt_open
                         : fmt_mistral.prompt_open);
    }

    return 0;
}


/*
 * Gemma: no system role; the system messages at the start open the first
 * user turn, followed by a blank line (Gemma 3's template), and one
 * anywhere else is refused.  Content is trimmed; assistant is "model".
 */
static int
render_gemma(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
             nalar_err *err)
{
    size_t  i, k, n_sys;

    for (n_sys = 0; n_sys < n && role_system(&msgs[n_sys]); n_sys++) {
        /* the leading system messages */
    }

    if (n_sys > 0 && (n_sys == n || !role_is(&msgs[n_sys], "user"))) {
        return nalar_fail(err, "messages[%zu]: the gemma chat template "
                          "places a system message in the user turn that "
                          "follows it, and none does", n_sys - 1);
    }

    for (i = n_sys; i < n; i++) {
        if (role_system(&msgs[i])) {
            return nalar_fail(err, "messages[%zu]: the gemma chat template "
                              "takes system messages only at the start", i);
        }

        chat_puts(b, "<start_of_turn>");
        if (role_is(&msgs[i], "assistant")) {
            chat_puts(b, "model");
        } else {
            chat_role(b, &msgs[i]);
        }
        chat_puts(b, "\n");

        if (i == n_sys) {
            for (k = 0; k < n_sys; k++) {
                chat_content(b, &msgs[k]);
                chat_puts(b, "\n\n");
            }
        }

        chat_content_trim(b, &msgs[i]);
        chat_puts(b, "<end_of_turn>\n");
    }

    chat_puts(b, "<start_of_turn>model\n");

    return 0;
}


/* Phi-3's role markers are control tokens: each is written whole, in one
 * piece (a token split across pieces would not be parsed). */
static void
render_phi3(chat_buf *b, const nalar_chat_msg *msgs, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            chat_puts(b, "<|system|>\n");
        } else if (role_is(&msgs[i], "user")) {
            chat_puts(b, "<|user|>\n");
        } else if (role_is(&msgs[i], "assistant")) {
            chat_puts(b, "<|assistant|>\n");
        } else {
            chat_puts(b, "<|tool|>\n");
        }
        chat_content(b, &msgs[i]);
        chat_puts(b, "<|end|>\n");
    }

    chat_puts(b, "<|assistant|>\n");
}


/*
 * Llama-2 folds the system prompt into the first user turn and closes each
 * exchange with EOS, opening the next with BOS; the first BOS comes from
 * the tokenizer.
 */
static int
render_llama2(chat_buf *b, const nalar_chat_msg *msgs, size_t n,
              nalar_err *err)
{
    size_t  i, k, sys;
    int     first, n_sys;

    /* the system messages since the last turn go into the next user turn's
     * <<SYS>> block, in order; one that no user turn follows has no place
     * in this template and is refused rather than dropped */

    sys = 0;
    n_sys = 0;
    first = 1;

    for (i = 0; i < n; i++) {
        if (role_system(&msgs[i])) {
            if (n_sys++ == 0) {
                sys = i;
            }
            continue;
        }

        if (role_is(&msgs[i], "user")) {
            chat_puts(b, first ? "[INST] " : "<s>[INST] ");
            if (n_sys > 0) {
                chat_puts(b, "<<SYS>>\n");
                for (k = sys; k < i; k++) {
                    if (role_system(&msgs[k])) {
                        if (k != sys) {
                            chat_puts(b, "\n\n");
                        }
                        chat_content(b, &msgs[k]);
                    }
                }
                chat_puts(b, "\n<</SYS>>\n\n");
                n_sys = 0;
            }
            chat_content(b, &msgs[i]);
            chat_puts(b, " [/INST]");
            first = 0;

        } else if (role_is(&msgs[i], "assistant") && n_sys == 0) {
            chat_puts(b, " ");
            chat_content(b, &msgs[i]);
            chat_puts(b, " </s>");

        } else if (role_is(&msgs[i], "assistant")) {
            break;

        } else {
            return nalar_fail(err, "messages[%zu]: role \"%.*s\" is not "
                              "supported by the llama2 chat template", i,
                              (int) msgs[i].role_len, msgs[i].role);
        }
    }

    if (n_sys > 0) {
        return nalar_fail(err, "messages[%zu]: the llama2 chat template "
                          "places a system message in the user turn that "
                          "follows it, and none does", sys);
    }

    return 0;
}


nalar_tok_text *
nalar_chat_render(nalar_chat_style s, const nalar_chat_msg *msgs, size_t n,
                  size_t *n_pieces, nalar_err *err)
{
    return nalar_chat_render_tools(s, msgs, n, NULL, n_pieces, err);
}


/* The pieces and the text written here as one allocation. */

static nalar_tok_text *
chat_finish(chat_buf *b)
{
    char            *own;
    size_t           i;
    nalar_tok_text  *v;

    if (b->own_len == 0) {
        free(b->own_at);
        return b->v;
    }

    v = malloc(b->n * sizeof(nalar_tok_text) + b->own_len);
    if (v == NULL) {
        free(b->v);
        free(b->own_at);
        free(b->own);
        return NULL;
    }

    own = (char *) (v + b->n);
    memcpy(own, b->own, b->own_len);
    memcpy(v, b->v, b->n * sizeof(nalar_tok_text));

    for (i = 0; i < b->n; i++) {
        if (b->own_at[i] != NALAR_CHAT_NOT_OWN) {
            v[i].text = own + b->own_at[i];
        }
    }

    free(b->v);
    free(b->own_at);
    free(b->own);

    return v;
}


nalar_tok_text *
nalar_chat_render_tools(nalar_chat_style s, const nalar_chat_msg *msgs,
                        size_t n, const nalar_chat_tools *t,
                        size_t *n_pieces, nalar_err *err)
{
    size_t           i;
    chat_buf         b;
    nalar_tok_text  *v;

    memset(&b, 0, sizeof(b));

    for (i = 0; i < n; i++) {
        if (!(role_system(&msgs[i]) || role_is(&msgs[i], "user")
              || role_is(&msgs[i], "assistant") || role_is(&msgs[i], "tool")))
        {
            nalar_fail(err, "messages[%zu]: unknown role \"%.*s\"", i,
                       (int) msgs[i].role_len, msgs[i].role);
            return NULL;
        }
    }

    if (nalar_chat_call_format_of(s) == NULL) {
        if (tools_on(t)) {
            nalar_fail(err, "the %s chat template has no tool format",
                       nalar_chat_style_name(s));
            return NULL;
        }

        for (i = 0; i < n; i++) {
            if (msg_calls(t, i) != NULL) {
                nalar_fail(err, "messages[%zu]: the %s chat template has no "
                           "tool format for tool_calls", i,
                           nalar_chat_style_name(s));
                return NULL;
            }
        }
    }

    switch (s) {
    case NALAR_CHAT_LLAMA2:
        if (render_llama2(&b, msgs, n, err) != 0) {
            goto failed;
        }
        break;
    case NALAR_CHAT_LLAMA3:
        if (render_llama3(&b, msgs, n, t, err) != 0) {
            goto failed;
        }
        break;
    case NALAR_CHAT_ZEPHYR:
        render_zephyr(&b, msgs, n);
        break;
    case NALAR_CHAT_MISTRAL:
    case NALAR_CHAT_MISTRAL_V1:
    case NALAR_CHAT_MISTRAL_V3:
        if (render_mistral(&b, msgs, n,
                           s == NALAR_CHAT_MISTRAL_V1 ? &mistral_v1
                           : s == NALAR_CHAT_MISTRAL_V3 ? &mistral_v3
                           : &mistral_v3_tekken, t, err)
            != 0)
        {
            goto failed;
        }
        break;
    case NALAR_CHAT_GEMMA:
        if (render_gemma(&b, msgs, n, err) != 0) {
            goto failed;
        }
        break;
    case NALAR_CHAT_PHI3:
        render_phi3(&b, msgs, n);
        break;
    case NALAR_CHAT_MISTRAL_V7:
    case NALAR_CHAT_MISTRAL_V7_SPM:
        if (render_mistral_v7(&b, msgs, n, s == NALAR_CHAT_MISTRAL_V7_SPM,
                              t, err)
            != 0)
        {
            goto failed;
        }
        break;
    default:
        render_chatml(&b, msgs, n, t);
        break;
    }

    if (!b.failed && b.v == NULL) {
        /* no pieces: an empty prompt (BOS alone) */
        b.v = malloc(sizeof(nalar_tok_text));
        b.failed = (b.v == NULL);
    }

    if (b.failed) {
        free(b.v);
        free(b.own_at);
        free(b.own);
        nalar_fail(err, "chat template: out of memory");
        return NULL;
    }

    *n_pieces = b.n;

    v = chat_finish(&b);
    if (v == NULL) {
        nalar_fail(err, "chat template: out of memory");
    }

    return v;

failed:

    free(b.v);
    free(b.own_at);
    free(b.own);
    return NULL;
}


int
nalar_chat_content(const json_t *content, nalar_tok_text *parts,
                   nalar_err *err)
{
    size_t   j;
    json_t  *part, *type, *text;

    if (json_is_string(content)) {
        parts[0].text = json_string_value(content);
        parts[0].len = json_string_length(content);
        parts[0].special = 0;
        return 1;
    }

    if (content == NULL || json_is_null(content)) {
        return 0;
    }

    if (!json_is_array(content)) {
        nalar_fail(err, "content must be a string or an array of text parts");
        return -1;
    }

    for (j = 0; j < json_array_size(content); j++) {
        part = json_array_get(content, j);
        type = json_object_get(part, "type");
        text = json_object_get(part, "text");

        if (!json_is_string(type)
            || strcmp(json_string_value(type), "text") != 0
            || !json_is_string(text))
        {
            nalar_fail(err, "content[%zu]: only text parts are supported", j);
            return -1;
        }

        parts[j].text = json_string_value(text);
        parts[j].len = json_string_length(text);
        parts[j].special = 0;
    }

    return (int) j;
}


size_t
nalar_chat_n_parts(const json_t *content)
{
    return json_is_array(content) ? json_array_size(content) : 1;
}
