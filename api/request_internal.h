/*
 * Shared by the files of the request parser (api/request.c,
 * api/request_tools.c): the error helpers and the tools entry points.
 * Not for other callers: they use api/request.h.
 */
#ifndef NGX_NALAR_REQUEST_INTERNAL_H
#define NGX_NALAR_REQUEST_INTERNAL_H

#include "request.h"

#define NALAR_API_MAX_TOOLS  128

/* fills req->err (nalar_failure_set) and returns -1 */
#define api_fail(req, ...)                                                    \
    nalar_failure_set(&(req)->err, __VA_ARGS__)

#define api_bad(req, param, ...)                                              \
    api_fail(req, 400, NALAR_INVALID_REQUEST, param, "invalid_value",         \
             __VA_ARGS__)

#define api_oom(req)                                                          \
    api_fail(req, 500, NALAR_SERVER_ERROR, NULL, "out_of_memory",             \
             "The server is out of memory")

/* the request's tools and tool_choice: *render the tools for the chat
 * template (NULL when none are rendered), the grammar's call schema in
 * req when a call is required; -1 with req->err */
int nalar_api_tools(nalar_api_request *req, int style, json_t **render);

/* messages[i]'s tool_calls (an assistant's) and tool_call_id (a tool's),
 * checked into req->tool_msgs[i]; -1 with req->err */
int nalar_api_tool_msg(nalar_api_request *req, json_t *e, size_t i);

#endif
