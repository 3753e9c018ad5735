/*
 * libFuzzer target for the edge's leading-text scan
 * (api/route_text.c), which reads request bodies on the event loop.
 * Byte 0: bit 0 chat (else completions), bits 1-3 the text's cap (1, 2, 3,
 * 7, 16, 64, 2048 or 65536 bytes); the rest is the body.
 *
 * Besides ASan/UBSan, it checks what api/route_text.h promises: the
 * text and the model fit their caps, the same bytes give the same text,
 * and a text's first bytes do not depend on the cap (a smaller cap gives
 * the beginning of the larger one's text... except where a chat message
 * is dropped because its role turned out to exclude it: the text is then
 * a prefix of the larger cap's, or the larger cap's is a prefix of it).
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=route
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route_text.h"

#define MODEL_CAP 256


static void
die(const char *what)
{
    fprintf(stderr, "fuzz_route: %s\n", what);
    abort();
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int                   chat;
    size_t                cap, n, n2, big_n, m, m2, min;
    unsigned char        *out, *out2, *big;
    unsigned char         model[MODEL_CAP], model2[MODEL_CAP];
    static const size_t   caps[8] = { 1, 2, 3, 7, 16, 64, 2048, 65536 };

    if (size == 0) {
        return 0;
    }

    chat = data[0] & 1;
    cap = caps[(data[0] >> 1) & 7];
    data++;
    size--;

    out = malloc(cap);
    out2 = malloc(cap);
    big = malloc(65536);

    if (out == NULL || out2 == NULL || big == NULL) {
        die("out of memory");
    }

    n = nalar_route_text(data, size, chat, out, cap, model, MODEL_CAP, &m);

    if (n > cap || m > MODEL_CAP) {
        die("a cap was passed");
    }

    n2 = nalar_route_text(data, size, chat, out2, cap, model2, MODEL_CAP,
                          &m2);

    if (n2 != n || m2 != m || memcmp(out, out2, n) != 0
        || memcmp(model, model2, m) != 0)
    {
        die("the same bytes gave another text");
    }

    big_n = nalar_route_text(data, size, chat, big, 65536, model2,
                             MODEL_CAP, &m2);

    min = n < big_n ? n : big_n;

    if (memcmp(out, big, min) != 0) {
        die("a smaller cap's text is not the larger one's beginning");
    }

    if (!chat && n != (big_n < cap ? big_n : cap) && n != 0) {
        die("a prompt's text is not the larger cap's, cut");
    }

    free(out);
    free(out2);
    free(big);

    return 0;
}
