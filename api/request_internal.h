/*
 * Shared by the files of the request parser (api/request.c,
 * api/request_tools.c): the error helpers and the tools entry points.
 * Not for other callers: they use api/request.h.
 */
#ifndef NGX_NALAR_REQUEST_INTERNAL_H
#define NGX_NALAR_REQUEST_INTERNAL_H

#include "request.h"

#define NALAR_API_MAX_TOOLS  128

/* sets req->err (OpenAI's error fields) and returns -1 */
int nalar_api_fail(nalar_api_request *req, int status, const char *type,
    const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

#define api_fail  nalar_api_fail

#define api_bad(req, param, ...)                                              \
    api_fail(req, 400, "invalid_request_error", param, "invalid_value",       \
             __VA_ARGS__)

#define api_oom(req)                                                          \
    api_fail(req, 500, "server_error", NULL, "out_of_memory",                 \
             "The server is out of memory")

/* the request's tools and tool_choice: *render the tools for the chat
 * template (NULL when none are rendered), the grammar's call schema in
 * req when a call is required; -1 with req->err */
int nalar_api_tools(nalar_api_request *req, int style, json_t **render);

/* messages[i]'s tool_calls (an assistant's) and tool_call_id (a tool's),
 * checked into req->tool_msgs[i]; -1 with req->err */
int nalar_api_tool_msg(nalar_api_request *req, json_t *e, size_t i);

#endif
