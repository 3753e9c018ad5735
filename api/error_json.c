/*
 * The one writer of OpenAI's error body (api/error_json.h).
 */
#include "error_json.h"


json_t *
nalar_api_error_json(const nalar_failure *f)
{
    json_t      *j;
    const char  *param, *type;

    param = f->param[0] != '\0' ? f->param : NULL;
    type = f->type != NULL ? f->type : NALAR_SERVER_ERROR;

    j = json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error",
                  "message", f->message, "type", type,
                  "param", param, "code", f->code);

    if (j == NULL) {
        /* the message was not valid UTF-8 */
        j = json_pack("{s:{s:s,s:s,s:s?,s:s?}}", "error",
                      "message", "invalid request", "type", type,
                      "param", param, "code", f->code);
    }

    return j;
}
