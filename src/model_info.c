/*
 * What a loaded model says about itself to the layers above the engine
 * (the nginx glue, the CLI): read-only, from any thread once the model is
 * loaded (nalar_engine_model() returns it only then).
 */
#include <stdlib.h>

#include "model.h"


const nalar_tokenizer *
nalar_model_tokenizer(const nalar_model *m)
{
    return m->tok;
}


int32_t
nalar_model_n_ctx(const nalar_model *m)
{
    return m->cfg.n_ctx;
}


char *
nalar_model_chat_template(const nalar_model *m)
{
    return gguf_get_str(m->gguf, "tokenizer.chat_template");
}
