/*
 * OpenAI's error body, written from the one error struct every layer
 * passes (nalar_failure, src/nalar_err.h).  No nginx: safe on any thread.
 */
#ifndef NALAR_API_ERROR_JSON_H
#define NALAR_API_ERROR_JSON_H

#include <jansson.h>

#include "nalar_err.h"

/*
 * {"error":{"message","type","param","code"}} for f (status != 0): param
 * "" and code NULL are null.  A message that is not valid UTF-8 (it may
 * quote the client) becomes "invalid request".  NULL when out of memory.
 */
json_t *nalar_api_error_json(const nalar_failure *f);

#endif
