/*
 * Tokenizers built from GGUF metadata:
 *   tokenizer.ggml.model = "llama": SentencePiece-style (scores, byte
 *     fallback <0xXX>, dummy prefix "▁"), as llama.cpp's SPM tokenizer;
 *   tokenizer.ggml.model = "gpt2": byte-level BPE with merges and the GPT-2
 *     pre-tokenizer (tokenizer.ggml.pre selects other pre-tokenizers where
 *     supported).
 * Control tokens written literally in the text (e.g. "<|im_end|>") are NOT
 * parsed as special unless the caller asks (parse_special, or special
 * pieces below); user-defined tokens (Qwen's "<think>", Gemma's "</s>")
 * are split out of any text, as Hugging Face splits its added tokens.
 * The qwen2 pre-tokenizer normalizes text to NFC first.
 */
#ifndef NALAR_TOKENIZER_H
#define NALAR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "nalar_err.h"

typedef enum { TOK_SPM = 1, TOK_BPE = 2 } nalar_tok_kind;

/* token_type values from GGUF (llama.cpp numbering) */
enum {
    TOKT_NORMAL = 1, TOKT_UNKNOWN = 2, TOKT_CONTROL = 3,
    TOKT_USER_DEFINED = 4, TOKT_UNUSED = 5, TOKT_BYTE = 6
};

typedef struct nalar_tokenizer nalar_tokenizer;

/* Copies what it needs out of the file; the gguf_file may be closed after. */
nalar_tokenizer *nalar_tokenizer_create(const gguf_file *f, nalar_err *err);
void nalar_tokenizer_destroy(nalar_tokenizer *t);

int32_t nalar_tok_n_vocab(const nalar_tokenizer *t);
nalar_tok_kind nalar_tok_kind_of(const nalar_tokenizer *t);
int32_t nalar_tok_bos(const nalar_tokenizer *t);   /* -1 if none */
int32_t nalar_tok_eos(const nalar_tokenizer *t);   /* -1 if none */
int     nalar_tok_add_bos(const nalar_tokenizer *t);
/* 1 for tokens that end generation: the eos, eot and eom ids of the file,
 * and control tokens llama.cpp names as ends of turn (<|im_end|>,
 * <|eot_id|>, <end_of_turn>, ...); never a normal or user-defined token */
int     nalar_tok_is_eog(const nalar_tokenizer *t, int32_t id);
int     nalar_tok_is_control(const nalar_tokenizer *t, int32_t id);
/* the piece as stored in the vocabulary (NUL-terminated), or NULL */
const char *nalar_tok_piece(const nalar_tokenizer *t, int32_t id);
/* id of an exact vocabulary string, or -1 */
int32_t nalar_tok_lookup(const nalar_tokenizer *t, const char *s, size_t len);

/*
 * Encode `len` bytes of text.  add_bos: prepend BOS.  parse_special: text
 * like "<|im_start|>" that equals a control/user-defined token becomes that
 * token.  Returns the number of ids (which may exceed `cap`: then only `cap`
 * were written and the caller retries with a larger buffer), or -1 on error.
 */
int nalar_tokenize(const nalar_tokenizer *t, const char *text, size_t len,
                   int add_bos, int parse_special, int32_t *out, int cap);

/*
 * A piece of text to encode.  special: control tokens written in it are
 * parsed (template markup); 0: the text is literal (what a user wrote).
 */
typedef struct {
    const char *text;
    size_t      len;
    int         special;
} nalar_tok_text;

/*
 * Encodes the pieces as one text, with at most max_ids ids: the entry point
 * for text of any length, and for a rendered chat template (its markup
 * special, the user text in it not).  The ids are those Hugging Face gives
 * the concatenated text (the pre-tokenizer, NFC and the merges run across
 * piece boundaries: "\n" + "\n\n" gives the ids of "\n\n\n"), except
 * that a control or unknown token is recognised only where all of its text
 * lies in special pieces; user-defined tokens are recognised anywhere,
 * across pieces too.  The work is bounded by max_ids, not by the text: text
 * longer than (max_ids + 1) times the longest vocabulary piece is not read
 * past that (no token stands for more bytes than its piece has, so it has
 * more than max_ids tokens; three times that with NFC, which can compose
 * three characters' bytes into one's), and encoding stops once max_ids are
 * there.
 * Returns the number of ids in *ids (malloc'd, NULL for none; at most
 * max_ids), -1 on error (out of memory).  *more is set to 1 when the text
 * has more than max_ids tokens: *ids then holds its first ones, of which
 * the last few may differ from the ids of the whole text.
 */
int nalar_tokenize_bounded(const nalar_tokenizer *t,
                           const nalar_tok_text *pieces, size_t n_pieces,
                           int add_bos, int max_ids, int32_t **ids,
                           int *more);

/*
 * The bytes a token contributes to the output text: byte tokens give their
 * byte, "▁" becomes a space (SPM), byte-level BPE maps back to raw bytes,
 * control tokens give nothing.  Returns bytes written (at most cap).
 * The result may be an incomplete UTF-8 sequence: use nalar_detok below for
 * streaming.  Leading-space removal after BOS is not done here.
 */
int nalar_token_bytes(const nalar_tokenizer *t, int32_t id, char *out,
                      int cap);

/*
 * Streaming detokenizer: feed ids one at a time, get text that is always
 * complete UTF-8; bytes of a character split across tokens are held back
 * until the character is complete.  Invalid sequences are emitted as U+FFFD.
 */
typedef struct {
    const nalar_tokenizer *tok;
    char    pending[8];
    int     n_pending;
    int     strip_space;  /* SPM: drop the dummy-prefix space of the first
                             piece when detokenizing a whole text */
} nalar_detok;

void nalar_detok_init(nalar_detok *d, const nalar_tokenizer *t);
/* Appends complete UTF-8 to out (NUL-terminated); returns bytes written.
 * out must hold at least 64 bytes + cap requirement of the piece. */
int nalar_detok_feed(nalar_detok *d, int32_t id, char *out, int cap);
/* Flushes what is held back (as U+FFFD if incomplete). */
int nalar_detok_flush(nalar_detok *d, char *out, int cap);

/* Convenience: decode a whole id sequence; malloc'd, NUL-terminated. */
char *nalar_detokenize(const nalar_tokenizer *t, const int32_t *ids, int n);

/* Additions. */
/* 1 if the SPM dummy prefix "▁" is added before the text */
int     nalar_tok_add_space_prefix(const nalar_tokenizer *t);
/* BPE only: the pre-tokenizer's word boundaries (byte offset after each
 * word; the first `cap` written).  Returns the word count, -1 for SPM. */
int     nalar_tok_pretokenize(const nalar_tokenizer *t, const char *text,
                              size_t len, size_t *ends, int cap);

#endif
