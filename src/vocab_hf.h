/*
 * A GGUF vocabulary from Hugging Face's tokenizer files: tokenizer.json
 * (the model, its added tokens, normalizer and pre-tokenizer) and, when it
 * lies beside it, tokenizer_config.json (BOS/EOS, add_bos_token and the
 * chat template).  The tokenizer.* keys written are the ones llama.cpp's
 * convert_hf_to_gguf.py writes for the same model:
 *
 *   byte-level BPE (a ByteLevel pre-tokenizer): tokenizer.ggml.model
 *     "gpt2", the merges, and tokenizer.ggml.pre named from the Split
 *     regexes: "llama-bpe" (Llama 3), "qwen2" (Qwen2/3, NFC), "deepseek-v3"
 *     or "gpt2" (ByteLevel's own regex);
 *   BPE over "▁" with byte fallback (Gemma, Llama 2 exported from
 *     SentencePiece): tokenizer.ggml.model "llama", with scores that make
 *     the SentencePiece merge order equal to the merge ranks (a piece
 *     scores minus the rank of the first merge that makes it).
 *
 * Token types: an added token marked special, or that looks special as
 * llama.cpp decides (<|...|>, <｜...｜>, <unused...>, <pad>, <mask>), is a
 * control token; other added tokens are user-defined (matched in any
 * text); <0xXX> pieces of a byte-fallback model are byte tokens; the
 * model's unk_token is unknown.  Ids the files leave out become unused
 * "[PADn]" tokens.  Anything else is refused with a message.
 */
#ifndef NALAR_VOCAB_HF_H
#define NALAR_VOCAB_HF_H

#include "gguf.h"
#include "nalar_err.h"

/* Writes tokenizer.* keys to w; *n_vocab gets the token count.  With
 * skip_template, tokenizer.chat_template is not written.  0 or -1. */
int nalar_vocab_hf_write(gguf_writer *w, const char *tokenizer_json,
                         int skip_template, int *n_vocab, nalar_err *err);

#endif
