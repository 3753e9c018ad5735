/*
 * The chat template styles (see api/chat.h): their names in the
 * nalar_chat_template directive, the style a model's Jinja template is
 * detected as, and each style's stop string.
 *
 * Plain C, no nginx and no state: callable from any thread.  Touches
 * nothing but its arguments and the constant tables here.
 */
#include <string.h>

#include "chat.h"


int
nalar_chat_style_parse(const char *name, size_t len)
{
    static const char *names[] = { "auto", "chatml", "llama2", "llama3",
                                   "zephyr", "mistral", "gemma", "phi3",
                                   "mistral-v7", "mistral-v1", "mistral-v3",
                                   "mistral-v7-spm" };
    size_t  i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (len == strlen(names[i]) && memcmp(name, names[i], len) == 0) {
            return (int) i;
        }
    }

    return -1;
}


const char *
nalar_chat_style_name(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_CHATML: return "chatml";
    case NALAR_CHAT_LLAMA2: return "llama2";
    case NALAR_CHAT_LLAMA3: return "llama3";
    case NALAR_CHAT_ZEPHYR: return "zephyr";
    case NALAR_CHAT_MISTRAL: return "mistral";
    case NALAR_CHAT_GEMMA:  return "gemma";
    case NALAR_CHAT_PHI3:   return "phi3";
    case NALAR_CHAT_MISTRAL_V7: return "mistral-v7";
    case NALAR_CHAT_MISTRAL_V1: return "mistral-v1";
    case NALAR_CHAT_MISTRAL_V3: return "mistral-v3";
    case NALAR_CHAT_MISTRAL_V7_SPM: return "mistral-v7-spm";
    default:                return "auto";
    }
}


nalar_chat_style
nalar_chat_style_detect(const char *jinja)
{
    if (jinja == NULL) {
        return NALAR_CHAT_CHATML;
    }

    /* the marker tokens are distinctive enough to tell the styles apart */
    if (strstr(jinja, "<|im_start|>")) {
        return NALAR_CHAT_CHATML;
    }
    if (strstr(jinja, "<|start_header_id|>")) {
        return NALAR_CHAT_LLAMA3;
    }
    if (strstr(jinja, "<start_of_turn>")) {
        return NALAR_CHAT_GEMMA;
    }
    if (strstr(jinja, "<|assistant|>") && strstr(jinja, "<|end|>")) {
        return NALAR_CHAT_PHI3;
    }
    if (strstr(jinja, "<|user|>") || strstr(jinja, "<|assistant|>")) {
        return NALAR_CHAT_ZEPHYR;
    }
    if (strstr(jinja, "[INST]") == NULL) {
        return NALAR_CHAT_CHATML;
    }

    /*
     * The [INST] family, told apart by the spaces in the template's string
     * literals: the SentencePiece templates write a space after "[INST]"
     * ('[INST] '), the tekken ones none; Mistral's v1 also one before it
     * (' [INST] '), Llama 2 and the first Mistral 7B templates one before
     * "[/INST]" (' [/INST]') and v3 none ('[/INST]').
     */

    if (strstr(jinja, "[SYSTEM_PROMPT]")) {
        if (strstr(jinja, "[INST] '") || strstr(jinja, "[INST] \"")) {
            return NALAR_CHAT_MISTRAL_V7_SPM;
        }
        return NALAR_CHAT_MISTRAL_V7;
    }
    if (strstr(jinja, "<<SYS>>")) {
        return NALAR_CHAT_LLAMA2;
    }
    if (strstr(jinja, "' [INST]") || strstr(jinja, "\" [INST]")) {
        return NALAR_CHAT_MISTRAL_V1;
    }
    if (strstr(jinja, "[INST] ")) {
        if (strstr(jinja, "'[/INST]'") || strstr(jinja, "\"[/INST]\"")) {
            return NALAR_CHAT_MISTRAL_V3;
        }
        return NALAR_CHAT_LLAMA2;
    }
    return NALAR_CHAT_MISTRAL;
}


const char *
nalar_chat_stop(nalar_chat_style s)
{
    switch (s) {
    case NALAR_CHAT_LLAMA2: return "</s>";
    case NALAR_CHAT_LLAMA3: return "<|eot_id|>";
    case NALAR_CHAT_ZEPHYR: return "</s>";
    case NALAR_CHAT_MISTRAL: return "</s>";
    case NALAR_CHAT_MISTRAL_V7: return "</s>";
    case NALAR_CHAT_MISTRAL_V1: return "</s>";
    case NALAR_CHAT_MISTRAL_V3: return "</s>";
    case NALAR_CHAT_MISTRAL_V7_SPM: return "</s>";
    case NALAR_CHAT_GEMMA:  return "<end_of_turn>";
    case NALAR_CHAT_PHI3:   return "<|end|>";
    default:                return "<|im_end|>";
    }
}
