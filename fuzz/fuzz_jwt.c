/*
 * libFuzzer target for the JWT verifier (api/jwt.c).  The first byte picks
 * what the rest of the input is:
 *   0: a compact token, verified against each fixed key set (an HS256
 *      secret file, an ES256 PEM public key, a JWKS of two HMAC keys with
 *      kids);
 *   1: header JSON, a 0x00 byte, payload JSON: encoded and signed here with
 *      the HS256 secret, so the header, the claims and the policy checks
 *      run on every input;
 *   2: the same, signed with the ES256 key (JWS's raw r || s);
 *   3: a key file (PEM, JWKS or secret), loaded with no algorithm pinned
 *      and then with one.
 * The second byte picks the policy: issuer and audience required or not,
 * which claim names the tenant, the leeway.
 *
 * Besides ASan/UBSan, it checks what jwt.h promises: a refused token leaves
 * an empty claim and says why; an accepted one was signed by the key, its
 * payload is a JSON object without duplicate members whose time claims,
 * iss and aud satisfy the policy, and the claim returned is the payload's
 * (a non-empty string without control characters, or an integer in
 * decimal); the same token with one signature bit flipped is refused.
 *
 *   make fuzz FUZZ_SECONDS=60 FUZZ_ONLY=jwt
 */
#include <jansson.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jwt.h"

#define NOW     1700000000
#define SECRET  "fuzz-secret-fuzz-secret-fuzz-secret!"   /* 36 bytes */

static nalar_jwt_keyset *ks_hs, *ks_es, *ks_jwks;
static EVP_PKEY         *es_key;
static char              key_path[64];


static void
die(const char *what)
{
    fprintf(stderr, "fuzz_jwt: %s\n", what);
    abort();
}


static void
write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");

    if (fp == NULL || fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
        die("cannot write the key file");
    }
}


static nalar_jwt_keyset *
load_text(const char *text, size_t n, const char *alg)
{
    nalar_err         err;
    nalar_jwt_keyset *k;

    write_file(key_path, text, n);
    k = nalar_jwt_keyset_load(key_path, alg, &err);
    if (k == NULL) {
        fprintf(stderr, "fuzz_jwt: %s\n", err.msg);
        die("a fixed key set did not load");
    }
    return k;
}


static void
cleanup(void)
{
    unlink(key_path);
}


int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *jwks = "{\"keys\":["
        "{\"kty\":\"oct\",\"kid\":\"a\",\"alg\":\"HS256\","
        "\"k\":\"ZnV6ei1zZWNyZXQtZnV6ei1zZWNyZXQtZnV6ei1zZWNyZXQh\"},"
        "{\"kty\":\"oct\",\"kid\":\"b\",\"alg\":\"HS384\","
        "\"k\":\"MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0"
        "NTY3\"}]}";
    BIO  *bio;
    char *pem;
    long  n;
    int   fd;

    /* tmpfs where there is one: key_file() rewrites it on every input */
    snprintf(key_path, sizeof(key_path), "%s/fuzz_jwt.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    fd = mkstemp(key_path);
    if (fd < 0) {
        die("mkstemp");
    }
    close(fd);
    atexit(cleanup);

    ks_hs = load_text(SECRET, strlen(SECRET), "HS256");
    ks_jwks = load_text(jwks, strlen(jwks), NULL);

    es_key = EVP_EC_gen("P-256");
    bio = BIO_new(BIO_s_mem());
    if (es_key == NULL || bio == NULL || !PEM_write_bio_PUBKEY(bio, es_key)) {
        die("cannot make the ES256 key");
    }
    n = BIO_get_mem_data(bio, &pem);
    ks_es = load_text(pem, (size_t) n, NULL);
    BIO_free(bio);
    return 0;
}


static size_t
b64url(const unsigned char *in, size_t n, char *out)
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t            o = 0, i;
    uint32_t          v;

    for (i = 0; i + 2 < n; i += 3) {
        v = (uint32_t) in[i] << 16 | (uint32_t) in[i + 1] << 8 | in[i + 2];
        out[o++] = abc[v >> 18];
        out[o++] = abc[(v >> 12) & 63];
        out[o++] = abc[(v >> 6) & 63];
        out[o++] = abc[v & 63];
    }
    if (n - i == 1) {
        v = (uint32_t) in[i] << 16;
        out[o++] = abc[v >> 18];
        out[o++] = abc[(v >> 12) & 63];
    } else if (n - i == 2) {
        v = (uint32_t) in[i] << 16 | (uint32_t) in[i + 1] << 8;
        out[o++] = abc[v >> 18];
        out[o++] = abc[(v >> 12) & 63];
        out[o++] = abc[(v >> 6) & 63];
    }
    return o;
}


static void
policy_of(uint8_t b, nalar_jwt_policy *p)
{
    static const char *claims[] = { NULL, "sub", "org", "tenant" };

    memset(p, 0, sizeof(*p));
    p->claim = claims[b & 3];
    p->issuer = b & 4 ? "https://issuer.example" : NULL;
    p->audience = b & 8 ? "nalar" : NULL;
    p->leeway = b & 16 ? 60 : 0;
    p->now = NOW;
}


/* an integer time claim (if any) as the verifier must have read it */
static int
time_ok(json_t *pl, const char *name, int64_t leeway, int cmp)
{
    json_t *v = json_object_get(pl, name);
    int64_t t;

    if (v == NULL || !json_is_integer(v)) {
        return 1;                     /* reals: rounding is jwt.c's rule */
    }
    t = json_integer_value(v);
    switch (cmp) {
    case 0:  /* exp */
        return t >= INT64_MAX - leeway || NOW < t + leeway;
    case 1:  /* nbf */
        return t <= INT64_MIN + leeway || NOW >= t - leeway;
    default: /* iat */
        return t <= NOW + leeway;
    }
}


/* The promises about an accepted token whose payload (plen bytes) the
   harness encoded itself. */
static void
check_accepted(const char *payload, size_t plen, const nalar_jwt_policy *p,
               const char *out)
{
    json_error_t jerr;
    json_t      *pl, *v;
    const char  *claim = p->claim ? p->claim : "sub";
    char         num[32];

    pl = json_loadb(payload, plen, JSON_REJECT_DUPLICATES, &jerr);
    if (pl == NULL || !json_is_object(pl)) {
        die("accepted a payload that is not one JSON object");
    }
    if (!time_ok(pl, "exp", p->leeway, 0) || !time_ok(pl, "nbf", p->leeway, 1)
        || !time_ok(pl, "iat", p->leeway, 2))
    {
        die("accepted a token outside its time claims");
    }
    if (p->issuer != NULL
        && (!json_is_string(v = json_object_get(pl, "iss"))
            || strcmp(json_string_value(v), p->issuer) != 0
            || json_string_length(v) != strlen(p->issuer)))
    {
        die("accepted a token from another issuer");
    }
    if (p->audience != NULL && json_object_get(pl, "aud") == NULL) {
        die("accepted a token without aud");
    }
    v = json_object_get(pl, claim);
    if (json_is_integer(v)) {
        snprintf(num, sizeof(num), "%lld", (long long) json_integer_value(v));
        if (strcmp(out, num) != 0) {
            die("integer claim returned differently");
        }
    } else if (!json_is_string(v) || json_string_length(v) == 0
               || json_string_length(v) != strlen(out)
               || memcmp(json_string_value(v), out, strlen(out)) != 0)
    {
        die("returned claim is not the payload's");
    }
    for (const char *c = out; *c; c++) {
        if ((unsigned char) *c < 0x20 || *c == 0x7f) {
            die("returned claim holds a control character");
        }
    }
    json_decref(pl);
}


static int
verify(const nalar_jwt_keyset *k, const char *tok, size_t n,
       const nalar_jwt_policy *p, char *out, size_t cap)
{
    nalar_err err;
    int       rc;

    err.msg[0] = '\0';
    rc = nalar_jwt_verify(k, tok, n, p, out, cap, &err);
    if (rc != 0 && (out[0] != '\0' || err.msg[0] == '\0')) {
        die("a refusal left a claim or gave no reason");
    }
    if (rc == 0 && strlen(out) >= cap) {
        die("claim overflows");
    }
    return rc;
}


/* r || s of a DER ECDSA signature, each left-padded to 32 bytes */
static int
es256_sign(const char *in, size_t n, unsigned char *rs)
{
    EVP_MD_CTX          *ctx = EVP_MD_CTX_new();
    unsigned char        der[128];
    const unsigned char *q = der;
    size_t               dlen = sizeof(der);
    ECDSA_SIG           *sig = NULL;
    int                  ok;

    ok = ctx != NULL
         && EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, es_key) == 1
         && EVP_DigestSign(ctx, der, &dlen, (const unsigned char *) in, n)
            == 1
         && (sig = d2i_ECDSA_SIG(NULL, &q, (long) dlen)) != NULL
         && BN_bn2binpad(ECDSA_SIG_get0_r(sig), rs, 32) == 32
         && BN_bn2binpad(ECDSA_SIG_get0_s(sig), rs + 32, 32) == 32;
    ECDSA_SIG_free(sig);
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -1;
}


static void
signed_token(const uint8_t *d, size_t n, int es, const nalar_jwt_policy *p)
{
    const uint8_t *nul = memchr(d, 0, n);
    size_t         hlen, plen, tlen, sig_at;
    unsigned char  sig[64];
    size_t         slen = 32;
    char          *tok, out[128];
    int            rc;

    if (nul == NULL) {
        return;
    }
    hlen = (size_t) (nul - d);
    plen = n - hlen - 1;
    tok = malloc(2 * (hlen + plen) + 200);
    if (tok == NULL) {
        return;
    }
    tlen = b64url(d, hlen, tok);
    tok[tlen++] = '.';
    tlen += b64url(nul + 1, plen, tok + tlen);
    if (es) {
        slen = 64;
        if (es256_sign(tok, tlen, sig) != 0) {
            die("cannot sign");
        }
    } else if (EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, SECRET,
                         strlen(SECRET), (const unsigned char *) tok, tlen,
                         sig, sizeof(sig), &slen) == NULL || slen != 32)
    {
        die("cannot sign");
    }
    tok[tlen++] = '.';
    sig_at = tlen;
    tlen += b64url(sig, slen, tok + tlen);

    rc = verify(es ? ks_es : ks_hs, tok, tlen, p, out, sizeof(out));
    if (rc == 0) {
        check_accepted((const char *) nul + 1, plen, p, out);
        /* one bit of the signature changed */
        sig[d[n - 1] % slen] ^= (uint8_t) (1u << (d[0] % 8));
        tlen = sig_at + b64url(sig, slen, tok + sig_at);
        if (verify(es ? ks_es : ks_hs, tok, tlen, p, out, sizeof(out)) == 0) {
            die("accepted a token with a changed signature");
        }
    }
    free(tok);
}


static void
key_file(const uint8_t *d, size_t n)
{
    static const char *pins[] = { "HS256", "RS256", "PS384", "ES256",
                                  "ES384", "EdDSA", "none", "HS512" };
    static const char *zero = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0."
                              "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    nalar_jwt_keyset  *k;
    nalar_jwt_policy   p;
    nalar_err          err;
    char               out[64];

    if (n == 0) {
        return;
    }
    write_file(key_path, d + 1, n - 1);
    k = nalar_jwt_keyset_load(key_path, d[0] & 8 ? pins[d[0] & 7] : NULL,
                              &err);
    if (k == NULL) {
        return;
    }
    if (nalar_jwt_keyset_count(k) <= 0) {
        die("an empty key set loaded");
    }
    for (int i = 0; i < nalar_jwt_keyset_count(k); i++) {
        if (nalar_jwt_keyset_alg(k, i) == NULL) {
            die("a key without an algorithm");
        }
    }
    /* a token for it: the header.payload of a valid HS256 token with a
       signature of zeros must never verify */
    policy_of(0, &p);
    if (nalar_jwt_verify(k, zero, strlen(zero), &p, out, sizeof(out), &err)
        == 0)
    {
        die("a zero signature verified");
    }
    nalar_jwt_keyset_free(k);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nalar_jwt_policy p;
    char             out[128];

    if (size < 2) {
        return 0;
    }
    policy_of(data[1], &p);
    switch (data[0] % 4) {
    case 0:
        verify(ks_hs, (const char *) data + 2, size - 2, &p, out, sizeof(out));
        verify(ks_es, (const char *) data + 2, size - 2, &p, out, sizeof(out));
        verify(ks_jwks, (const char *) data + 2, size - 2, &p, out,
               (size_t) (data[1] >> 5) + 1);
        break;
    case 1:
    case 2:
        signed_token(data + 2, size - 2, data[0] % 4 == 2, &p);
        break;
    default:
        key_file(data + 1, size - 1);
        break;
    }
    return 0;
}
