/*
 * JWT verification against keys and tokens made here by the openssl command
 * line tool: the signatures come from OpenSSL's own signing code (dgst,
 * pkeyutl), the base64url and ES256 DER -> r||s conversion from this file,
 * so nothing is verified by the code that produced it.  One token is the
 * published RFC 7515 A.1 example.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jwt.h"
#include "tap.h"

#define T 1700000000LL          /* "now" for every case */

static char dir[64];

#define PUTS(name, s) put(name, s, strlen(s))

/* ---- helpers ---------------------------------------------------------- */

static int
sh(const char *fmt, ...)
{
    char    cmd[4096];
    va_list ap;
    int     rc;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    rc = system(cmd);
    if (rc != 0) {
        diag("command failed (%d): %s", rc, cmd);
    }
    return rc;
}

static char *
path(const char *name)
{
    static char buf[8][256];
    static int  i;

    i = (i + 1) % 8;
    snprintf(buf[i], sizeof(buf[i]), "%s/%s", dir, name);
    return buf[i];
}

static void
put(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(path(name), "wb");

    if (f == NULL || fwrite(data, 1, n, f) != n) {
        diag("cannot write %s", path(name));
        exit(1);
    }
    fclose(f);
}

static unsigned char *
get(const char *name, size_t *n)
{
    FILE          *f = fopen(path(name), "rb");
    unsigned char *buf = malloc(1 << 16);

    if (f == NULL || buf == NULL) {
        diag("cannot read %s", path(name));
        exit(1);
    }
    *n = fread(buf, 1, (1 << 16) - 1, f);
    buf[*n] = 0;
    fclose(f);
    return buf;
}

static void
b64url(const unsigned char *in, size_t n, char *out)
{
    static const char A[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t i, j = 0;

    for (i = 0; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t) in[i] << 16 | (uint32_t) in[i + 1] << 8 | in[i + 2];
        out[j++] = A[v >> 18];
        out[j++] = A[(v >> 12) & 63];
        out[j++] = A[(v >> 6) & 63];
        out[j++] = A[v & 63];
    }
    if (n - i == 1) {
        out[j++] = A[in[i] >> 2];
        out[j++] = A[(in[i] & 3) << 4];
    } else if (n - i == 2) {
        out[j++] = A[in[i] >> 2];
        out[j++] = A[((in[i] & 3) << 4) | (in[i + 1] >> 4)];
        out[j++] = A[(in[i + 1] & 15) << 2];
    }
    out[j] = 0;
}

static void
hex(const unsigned char *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) {
        sprintf(out + 2 * i, "%02x", in[i]);
    }
    out[2 * n] = 0;
}

static size_t
unhex(const char *s, unsigned char *out)
{
    size_t n = 0;
    unsigned v;

    while (sscanf(s, "%2x", &v) == 1) {
        out[n++] = (unsigned char) v;
        s += 2;
    }
    return n;
}

/* DER SEQUENCE { INTEGER r, INTEGER s } (short lengths, as for P-256)
   -> r || s, each left-padded to 32 bytes: what JWS ES256 carries. */
static int
der_to_raw(const unsigned char *d, size_t n, unsigned char raw[64])
{
    size_t p = 2;

    memset(raw, 0, 64);
    if (n < 8 || d[0] != 0x30 || d[1] != n - 2) {
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        size_t len;
        if (p + 2 > n || d[p] != 0x02) {
            return -1;
        }
        len = d[p + 1];
        p += 2;
        if (p + len > n) {
            return -1;
        }
        while (len > 32 && d[p] == 0) {   /* sign byte */
            p++;
            len--;
        }
        if (len > 32) {
            return -1;
        }
        memcpy(raw + 32 * k + 32 - len, d + p, len);
        p += len;
    }
    return p == n ? 0 : -1;
}

/* ---- keys --------------------------------------------------------------- */

static const char HS256_SECRET[] = "hs256-secret-for-nalar-jwt-tests-0123456789";
static const char HS384_SECRET[] =
    "hs384-secret-for-nalar-jwt-tests-0123456789abcdefghijklmnopqrstuv";
static const char HS512_SECRET[] =
    "hs512-secret-for-nalar-jwt-tests-0123456789abcdefghijklmnopqrstuv"
    "wxyz-0123456789";
static const char OCT_SECRET[] = "oct-key-in-the-jwks-0123456789-abcdefghij";

enum {
    SG_HS256, SG_HS384, SG_HS512, SG_RS256, SG_RS512, SG_RS256_2, SG_PS256, SG_PS256_SALT20,
    SG_ES256, SG_ED, SG_OCT, SG_HS_PUBPEM, SG_NONE
};

static void
make_keys(void)
{
    char   buf[8192], n1[1024], n2[1024], ex[64], ey[64], ed[64], oct[128];
    unsigned char bin[2048];
    size_t len;
    unsigned char *f;

    if (sh("cd %s && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048"
           " -out rsa.pem 2>/dev/null && openssl pkey -in rsa.pem -pubout"
           " -out rsa.pub"
           " && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048"
           " -out rsa2.pem 2>/dev/null && openssl pkey -in rsa2.pem -pubout"
           " -out rsa2.pub"
           " && openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:1024"
           " -out rsa1k.pem 2>/dev/null && openssl pkey -in rsa1k.pem -pubout"
           " -out rsa1k.pub"
           " && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256"
           " -out ec.pem && openssl pkey -in ec.pem -pubout -out ec.pub"
           " && openssl pkey -in ec.pem -pubout -outform DER -out ec.der"
           " && openssl genpkey -algorithm ED25519 -out ed.pem"
           " && openssl pkey -in ed.pem -pubout -out ed.pub"
           " && openssl pkey -in ed.pem -pubout -outform DER -out ed.der"
           " && openssl req -x509 -new -key rsa.pem -subj /CN=nalar-test"
           " -days 2 -out cert.pem 2>/dev/null"
           " && openssl rsa -pubin -in rsa.pub -modulus -noout > rsa.mod"
           " && openssl rsa -pubin -in rsa2.pub -modulus -noout > rsa2.mod",
           dir) != 0)
    {
        diag("Bail out! openssl could not make the test keys");
        exit(1);
    }

    /* Secret files: the key plus one trailing newline, which is ignored. */
    snprintf(buf, sizeof(buf), "%s\n", HS256_SECRET);
    put("hs256.key", buf, strlen(buf));
    snprintf(buf, sizeof(buf), "%s\n", HS384_SECRET);
    put("hs384.key", buf, strlen(buf));
    snprintf(buf, sizeof(buf), "%s\n", HS512_SECRET);
    put("hs512.key", buf, strlen(buf));
    snprintf(buf, sizeof(buf), "%s\n\n", HS256_SECRET);   /* secret ends "\n" */
    put("hs256nl.key", buf, strlen(buf));
    PUTS("short.key", "too-short-secret\n");

    /* JWKS: public parts pulled out by openssl, encoded here. */
    f = get("rsa.mod", &len);
    b64url(bin, unhex((char *) f + strlen("Modulus="), bin), n1);
    free(f);
    f = get("rsa2.mod", &len);
    b64url(bin, unhex((char *) f + strlen("Modulus="), bin), n2);
    free(f);
    f = get("ec.der", &len);              /* SPKI ends 04 || x || y */
    b64url(f + len - 64, 32, ex);
    b64url(f + len - 32, 32, ey);
    free(f);
    f = get("ed.der", &len);              /* SPKI ends with the 32-byte key */
    b64url(f + len - 32, 32, ed);
    free(f);
    b64url((const unsigned char *) OCT_SECRET, strlen(OCT_SECRET), oct);
    snprintf(buf, sizeof(buf),
             "{\"keys\":[\n"
             " {\"kty\":\"RSA\",\"kid\":\"r1\",\"use\":\"sig\",\"alg\":\"RS256\","
             "\"n\":\"%s\",\"e\":\"AQAB\"},\n"
             " {\"kty\":\"RSA\",\"kid\":\"r2\",\"n\":\"%s\",\"e\":\"AQAB\"},\n"
             " {\"kty\":\"EC\",\"kid\":\"e1\",\"crv\":\"P-256\",\"x\":\"%s\","
             "\"y\":\"%s\"},\n"
             " {\"kty\":\"OKP\",\"kid\":\"d1\",\"crv\":\"Ed25519\",\"x\":\"%s\"},\n"
             " {\"kty\":\"oct\",\"kid\":\"h1\",\"alg\":\"HS256\",\"k\":\"%s\"},\n"
             " {\"kty\":\"RSA\",\"kid\":\"x1\",\"use\":\"enc\",\"n\":\"%s\","
             "\"e\":\"AQAB\"},\n"
             " {\"kty\":\"RSA\",\"kid\":\"x2\",\"alg\":\"RSA-OAEP\",\"n\":\"%s\","
             "\"e\":\"AQAB\"}\n"
             "]}\n", n1, n2, ex, ey, ed, oct, n1, n1);
    put("keys.jwks", buf, strlen(buf));

    /* Same EC key with y altered: a point off the curve. */
    ey[5] = ey[5] == 'A' ? 'B' : 'A';
    snprintf(buf, sizeof(buf), "{\"keys\":[{\"kty\":\"EC\",\"kid\":\"bad\","
             "\"crv\":\"P-256\",\"x\":\"%s\",\"y\":\"%s\"}]}", ex, ey);
    put("offcurve.jwks", buf, strlen(buf));
    snprintf(buf, sizeof(buf), "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"a\","
             "\"n\":\"%s\",\"e\":\"AQAB\"},{\"kty\":\"RSA\",\"kid\":\"a\","
             "\"n\":\"%s\",\"e\":\"AQAB\"}]}", n1, n2);
    put("dupkid.jwks", buf, strlen(buf));
    snprintf(buf, sizeof(buf), "{\"keys\":[{\"kty\":\"RSA\",\"kid\":\"a\","
             "\"n\":\"%s\",\"e\":\"AQ\"}]}", n1);      /* e = 1 */
    put("e1.jwks", buf, strlen(buf));
}

/* "b64(header).b64(payload).b64(signature)", the signature made by openssl
   over the ASCII signing input; flip != 0 flips one bit of it. */
static char *
make_token(const char *header, const char *payload, int signer, int flip)
{
    char           *tok = malloc(65536), key[1024];
    unsigned char  *sig, raw[64], *pem;
    size_t          n, len;
    const char     *sopts;

    b64url((const unsigned char *) header, strlen(header), tok);
    n = strlen(tok);
    tok[n++] = '.';
    b64url((const unsigned char *) payload, strlen(payload), tok + n);
    put("in", tok, strlen(tok));
    unlink(path("sig"));

    switch (signer) {
    case SG_HS256:
    case SG_HS384:
    case SG_HS512:
    case SG_OCT:
        hex((const unsigned char *) (signer == SG_HS256 ? HS256_SECRET
                                     : signer == SG_HS384 ? HS384_SECRET
                                     : signer == SG_HS512 ? HS512_SECRET
                                     : OCT_SECRET),
            strlen(signer == SG_HS256 ? HS256_SECRET
                   : signer == SG_HS384 ? HS384_SECRET
                   : signer == SG_HS512 ? HS512_SECRET : OCT_SECRET), key);
        sh("openssl dgst -%s -mac HMAC -macopt hexkey:%s -binary -out %s %s",
           signer == SG_HS384 ? "sha384" : signer == SG_HS512 ? "sha512"
           : "sha256", key, path("sig"), path("in"));
        break;
    case SG_HS_PUBPEM:
        /* The forger's trick: the RSA public key file as an HMAC secret. */
        pem = get("rsa.pub", &len);
        hex(pem, len, key);
        free(pem);
        sh("openssl dgst -sha256 -mac HMAC -macopt hexkey:%s -binary -out %s %s",
           key, path("sig"), path("in"));
        break;
    case SG_RS256:
    case SG_RS512:
    case SG_RS256_2:
    case SG_PS256:
    case SG_PS256_SALT20:
    case SG_ES256:
        sopts = signer == SG_PS256 ? "-sigopt rsa_padding_mode:pss "
                "-sigopt rsa_pss_saltlen:digest -sigopt rsa_mgf1_md:sha256"
              : signer == SG_PS256_SALT20 ? "-sigopt rsa_padding_mode:pss "
                "-sigopt rsa_pss_saltlen:20 -sigopt rsa_mgf1_md:sha256" : "";
        sh("openssl dgst -%s -sign %s %s -binary -out %s %s",
           signer == SG_RS512 ? "sha512" : "sha256",
           path(signer == SG_RS256_2 ? "rsa2.pem"
                : signer == SG_ES256 ? "ec.pem" : "rsa.pem"),
           sopts, path("sig"), path("in"));
        break;
    case SG_ED:
        sh("openssl pkeyutl -sign -inkey %s -rawin -in %s -out %s",
           path("ed.pem"), path("in"), path("sig"));
        break;
    case SG_NONE:
        put("sig", "", 0);
        break;
    }
    sig = get("sig", &len);
    if (signer == SG_ES256) {
        if (der_to_raw(sig, len, raw) < 0) {
            diag("cannot parse openssl's ECDSA signature");
        }
        memcpy(sig, raw, 64);
        len = 64;
    }
    if (flip && len > 0) {
        sig[len / 2] ^= 0x10;
    }
    n = strlen(tok);
    tok[n++] = '.';
    b64url(sig, len, tok + n);
    free(sig);
    return tok;
}

/* ---- cases -------------------------------------------------------------- */

enum {
    KS_HS256, KS_HS384, KS_HS512, KS_HS256NL, KS_RSA, KS_RSA_PS, KS_RSA512,
    KS_EC, KS_ED, KS_JWKS, KS_CERT, N_KS
};

static const struct { const char *file, *alg, *want_alg; } KEYSETS[N_KS] = {
    [KS_HS256]   = { "hs256.key",   NULL,    "HS256" },
    [KS_HS384]   = { "hs384.key",   "HS384", "HS384" },
    [KS_HS512]   = { "hs512.key",   "HS512", "HS512" },
    [KS_HS256NL] = { "hs256nl.key", NULL,    "HS256" },
    [KS_RSA]     = { "rsa.pub",     NULL,    "RS256" },
    [KS_RSA_PS]  = { "rsa.pub",     "PS256", "PS256" },
    [KS_RSA512]  = { "rsa.pub",     "RS512", "RS512" },
    [KS_EC]      = { "ec.pub",      NULL,    "ES256" },
    [KS_ED]      = { "ed.pub",      NULL,    "EdDSA" },
    [KS_JWKS]    = { "keys.jwks",   NULL,    "RS256" },
    [KS_CERT]    = { "cert.pem",    NULL,    "RS256" },
};

#define P_OK "{\"sub\":\"tenant-a\",\"iat\":1699999990,\"exp\":1700000600}"

typedef struct {
    const char *name;
    int         ks;        /* KS_* */
    int         signer;    /* SG_* */
    const char *header;
    const char *payload;
    int         flip;      /* flip a signature bit */
    const char *claim, *iss, *aud;
    int64_t     leeway;
    const char *want;      /* tenant on success, NULL = must fail */
    const char *err;       /* substring of the error when it fails */
} jcase;

static const jcase CASES[] = {
    /* valid, one per algorithm */
    { "HS256 valid", KS_HS256, SG_HS256, "{\"alg\":\"HS256\",\"typ\":\"JWT\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "HS384 valid", KS_HS384, SG_HS384, "{\"alg\":\"HS384\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "HS512 valid", KS_HS512, SG_HS512, "{\"alg\":\"HS512\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "RS256 valid", KS_RSA, SG_RS256, "{\"alg\":\"RS256\",\"kid\":\"any\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "RS512 valid (pinned)", KS_RSA512, SG_RS512, "{\"alg\":\"RS512\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "PS256 valid (pinned)", KS_RSA_PS, SG_PS256, "{\"alg\":\"PS256\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "ES256 valid", KS_EC, SG_ES256, "{\"alg\":\"ES256\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "EdDSA valid", KS_ED, SG_ED, "{\"alg\":\"EdDSA\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "RS256 valid against a certificate", KS_CERT, SG_RS256,
      "{\"alg\":\"RS256\"}", P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },

    /* algorithm binding */
    { "HS512 token, HS256 key", KS_HS256, SG_HS512, "{\"alg\":\"HS512\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "token alg HS512 does not match the key's HS256" },
    { "RS256 token, PS256-pinned key", KS_RSA_PS, SG_RS256, "{\"alg\":\"RS256\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "does not match the key's PS256" },
    { "PKCS#1 v1.5 signature labelled PS256", KS_RSA_PS, SG_RS256,
      "{\"alg\":\"PS256\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "bad PS256 signature" },
    { "PS256 with a 20-byte salt (RFC 7518: salt = hash size)", KS_RSA_PS,
      SG_PS256_SALT20, "{\"alg\":\"PS256\"}", P_OK, 0, NULL, NULL, NULL, 0,
      NULL, "bad PS256 signature" },
    { "HS256 signed with the RSA public key PEM (confusion)", KS_RSA,
      SG_HS_PUBPEM, "{\"alg\":\"HS256\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "token alg HS256 does not match the key's RS256" },
    { "HS256 with RSA PEM secret, kid of a JWKS RSA key", KS_JWKS,
      SG_HS_PUBPEM, "{\"alg\":\"HS256\",\"kid\":\"r1\"}", P_OK, 0, NULL, NULL,
      NULL, 0, NULL, "token alg HS256 does not match the key's RS256" },
    { "RS256 token against an HS256 key", KS_HS256, SG_RS256,
      "{\"alg\":\"RS256\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "token alg RS256 does not match the key's HS256" },
    { "alg none", KS_HS256, SG_NONE, "{\"alg\":\"none\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "alg none refused" },
    { "alg NoNe with a signature", KS_HS256, SG_HS256, "{\"alg\":\"NoNe\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "alg none refused" },
    { "alg none against JWKS", KS_JWKS, SG_NONE,
      "{\"alg\":\"none\",\"kid\":\"h1\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "alg none refused" },
    { "no alg", KS_HS256, SG_HS256, "{\"typ\":\"JWT\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "header has no alg" },
    { "alg hs256 (case matters)", KS_HS256, SG_HS256, "{\"alg\":\"hs256\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "does not match" },
    { "duplicate alg member", KS_HS256, SG_HS256,
      "{\"alg\":\"HS256\",\"alg\":\"none\"}", P_OK, 0, NULL, NULL, NULL, 0,
      NULL, "header is not JSON" },
    { "crit extension", KS_HS256, SG_HS256,
      "{\"alg\":\"HS256\",\"crit\":[\"b64\"],\"b64\":false}", P_OK, 0, NULL,
      NULL, NULL, 0, NULL, "crit" },

    /* JWKS kid selection */
    { "JWKS kid r1 RS256", KS_JWKS, SG_RS256, "{\"alg\":\"RS256\",\"kid\":\"r1\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "JWKS kid r2 RS256 (second RSA key)", KS_JWKS, SG_RS256_2,
      "{\"alg\":\"RS256\",\"kid\":\"r2\"}", P_OK, 0, NULL, NULL, NULL, 0,
      "tenant-a", NULL },
    { "JWKS kid r1, signed by r2's key", KS_JWKS, SG_RS256_2,
      "{\"alg\":\"RS256\",\"kid\":\"r1\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "bad RS256 signature" },
    { "JWKS kid e1 ES256", KS_JWKS, SG_ES256, "{\"alg\":\"ES256\",\"kid\":\"e1\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "JWKS kid d1 EdDSA", KS_JWKS, SG_ED, "{\"alg\":\"EdDSA\",\"kid\":\"d1\"}",
      P_OK, 0, NULL, NULL, NULL, 0, "tenant-a", NULL },
    { "JWKS kid h1 HS256 (oct)", KS_JWKS, SG_OCT,
      "{\"alg\":\"HS256\",\"kid\":\"h1\"}", P_OK, 0, NULL, NULL, NULL, 0,
      "tenant-a", NULL },
    { "JWKS kid e1 but RS256", KS_JWKS, SG_RS256,
      "{\"alg\":\"RS256\",\"kid\":\"e1\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "token alg RS256 does not match the key's ES256" },
    { "JWKS wrong kid", KS_JWKS, SG_RS256, "{\"alg\":\"RS256\",\"kid\":\"zz\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "no key with kid \"zz\"" },
    { "JWKS skipped enc key", KS_JWKS, SG_RS256,
      "{\"alg\":\"RS256\",\"kid\":\"x1\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "no key with kid \"x1\"" },
    { "JWKS without kid", KS_JWKS, SG_RS256, "{\"alg\":\"RS256\"}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "no kid and the key set holds 5 keys" },
    { "JWKS kid not a string", KS_JWKS, SG_RS256, "{\"alg\":\"RS256\",\"kid\":1}",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "kid is not a string" },

    /* bad signatures: one bit flipped */
    { "HS256 bit flipped", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      P_OK, 1, NULL, NULL, NULL, 0, NULL, "bad HS256 signature" },
    { "RS256 bit flipped", KS_RSA, SG_RS256, "{\"alg\":\"RS256\"}",
      P_OK, 1, NULL, NULL, NULL, 0, NULL, "bad RS256 signature" },
    { "PS256 bit flipped", KS_RSA_PS, SG_PS256, "{\"alg\":\"PS256\"}",
      P_OK, 1, NULL, NULL, NULL, 0, NULL, "bad PS256 signature" },
    { "ES256 bit flipped", KS_EC, SG_ES256, "{\"alg\":\"ES256\"}",
      P_OK, 1, NULL, NULL, NULL, 0, NULL, "bad ES256 signature" },
    { "EdDSA bit flipped", KS_ED, SG_ED, "{\"alg\":\"EdDSA\"}",
      P_OK, 1, NULL, NULL, NULL, 0, NULL, "bad EdDSA signature" },
    { "HS384 header with a 64-byte (HS512) tag", KS_HS384, SG_HS512,
      "{\"alg\":\"HS384\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "HS384 signature is 64 bytes, not 48" },
    { "secret ending in a newline (file had two)", KS_HS256NL, SG_HS256,
      "{\"alg\":\"HS256\"}", P_OK, 0, NULL, NULL, NULL, 0, NULL,
      "bad HS256 signature" },

    /* time */
    { "expired", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":1699999999}", 0, NULL, NULL, NULL, 0, NULL,
      "expired at 1699999999" },
    { "expires this very second", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":1700000000}", 0, NULL, NULL, NULL, 0, NULL,
      "expired" },
    { "valid for one more second", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":1700000001}", 0, NULL, NULL, NULL, 0, "a", NULL },
    { "slightly expired, within leeway", KS_HS256, SG_HS256,
      "{\"alg\":\"HS256\"}", "{\"sub\":\"a\",\"exp\":1699999980}", 0, NULL,
      NULL, NULL, 30, "a", NULL },
    { "expired beyond leeway", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":1699999960}", 0, NULL, NULL, NULL, 30, NULL,
      "expired" },
    { "fractional exp", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":1700000000.5}", 0, NULL, NULL, NULL, 0, "a", NULL },
    { "exp not a number", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":\"1800000000\"}", 0, NULL, NULL, NULL, 0, NULL,
      "claim exp is not a number" },
    { "not yet valid", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"nbf\":1700000100}", 0, NULL, NULL, NULL, 0, NULL,
      "not valid before 1700000100" },
    { "nbf within leeway", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"nbf\":1700000020}", 0, NULL, NULL, NULL, 30, "a", NULL },
    { "nbf now", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"nbf\":1700000000}", 0, NULL, NULL, NULL, 0, "a", NULL },
    { "issued in the future", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"iat\":1700000100}", 0, NULL, NULL, NULL, 30, NULL,
      "issued in the future" },
    { "huge exp does not overflow", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"exp\":9223372036854775807}", 0, NULL, NULL, NULL, 60,
      "a", NULL },

    /* issuer and audience */
    { "issuer matches", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"iss\":\"https://idp.example\"}", 0, NULL,
      "https://idp.example", NULL, 0, "a", NULL },
    { "wrong issuer", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"iss\":\"https://evil.example\"}", 0, NULL,
      "https://idp.example", NULL, 0, NULL,
      "issuer \"https://evil.example\" is not the required https://idp.example" },
    { "issuer prefix is not the issuer", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"iss\":\"https://idp.example.evil\"}", 0, NULL,
      "https://idp.example", NULL, 0, NULL, "is not the required" },
    { "missing issuer", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\"}", 0, NULL, "https://idp.example", NULL, 0, NULL,
      "no iss claim" },
    { "audience string", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"aud\":\"nalar\"}", 0, NULL, NULL, "nalar", 0, "a", NULL },
    { "wrong audience", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"aud\":\"other\"}", 0, NULL, NULL, "nalar", 0, NULL,
      "audience nalar is not in aud" },
    { "audience array containing ours", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"aud\":[\"other\",\"nalar\"]}", 0, NULL, NULL, "nalar", 0,
      "a", NULL },
    { "audience array without ours", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\",\"aud\":[\"other\",\"nalar2\"]}", 0, NULL, NULL, "nalar",
      0, NULL, "audience nalar is not in aud" },
    { "missing audience", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\"}", 0, NULL, NULL, "nalar", 0, NULL, "no aud claim" },

    /* the tenant claim */
    { "missing sub", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"exp\":1700000600}", 0, NULL, NULL, NULL, 0, NULL, "claim sub missing" },
    { "missing custom claim", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      P_OK, 0, "org", NULL, NULL, 0, NULL, "claim org missing" },
    { "custom claim", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"u\",\"org\":\"acme\"}", 0, "org", NULL, NULL, 0, "acme", NULL },
    { "numeric sub", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":12345}", 0, NULL, NULL, NULL, 0, "12345", NULL },
    { "negative numeric sub", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":-9007199254740993}", 0, NULL, NULL, NULL, 0,
      "-9007199254740993", NULL },
    { "sub is an object", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":{\"id\":1}}", 0, NULL, NULL, NULL, 0, NULL,
      "claim sub is not a string or integer" },
    { "sub is a real", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":1.5}", 0, NULL, NULL, NULL, 0, NULL, "not a string or integer" },
    { "sub is empty", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"\"}", 0, NULL, NULL, NULL, 0, NULL, "claim sub is empty" },
    { "sub with a newline", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\\nb\"}", 0, NULL, NULL, NULL, 0, NULL, "control character" },
    { "sub with NUL", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"a\\u0000b\"}", 0, NULL, NULL, NULL, 0, NULL, "payload is not JSON" },
    { "sub UTF-8", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "{\"sub\":\"\\u00e9quipe\"}", 0, NULL, NULL, NULL, 0, "\xc3\xa9quipe", NULL },
    { "payload is an array", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "[\"sub\",\"a\"]", 0, NULL, NULL, NULL, 0, NULL,
      "payload is not a JSON object" },
    { "payload is not JSON", KS_HS256, SG_HS256, "{\"alg\":\"HS256\"}",
      "sub=a", 0, NULL, NULL, NULL, 0, NULL, "payload is not JSON" },
    { "header is an array", KS_HS256, SG_HS256, "[\"HS256\"]",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "header is not a JSON object" },
    { "header is not JSON", KS_HS256, SG_HS256, "not json",
      P_OK, 0, NULL, NULL, NULL, 0, NULL, "header is not JSON" },
};

/* Tokens that never get as far as a signature. */
static const struct { const char *name, *token, *err; } GARBAGE[] = {
    { "empty", "", "empty token" },
    { "two parts", "a.b", "not three dot-separated parts" },
    { "four parts", "a.b.c.d", "not three dot-separated parts" },
    { "five parts (JWE)", "a.b.c.d.e", "not three dot-separated parts" },
    { "no dots", "eyJhbGciOiJIUzI1NiJ9", "not three dot-separated parts" },
    { "non-base64 header", "!!!!.e30.AAAA", "header is not base64url" },
    { "standard base64 '+'", "eyJhbGciOiJIUzI1NiJ9+.e30.AAAA",
      "header is not base64url" },
    { "padded header", "eyJhbGciOiJIUzI1NiJ9==.e30.AAAA",
      "header is not base64url" },
    { "header length 1 mod 4", "eyJhbGciOiJIUzI1NiJ9A.e30.AAAA",
      "header is not base64url" },
    { "non-canonical trailing bits", "e31.e30.AAAA", "header is not base64url" },
    { "empty header", ".e30.AAAA", "header is not JSON" },
    { "space in signature",
      "eyJhbGciOiJIUzI1NiJ9.e30.AA AA", "signature is not base64url" },
    { "all dots", "..", "header is not JSON" },
    { "empty signature", "eyJhbGciOiJIUzI1NiJ9.e30.",
      "HS256 signature is 0 bytes, not 32" },
    /* {"alg":"HS256"} . {} . 32 zero bytes */
    { "zero signature", "eyJhbGciOiJIUzI1NiJ9.e30."
      "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "bad HS256 signature" },
};

static void
run_case(nalar_jwt_keyset **ks, const jcase *c)
{
    nalar_jwt_policy p = { c->claim, c->iss, c->aud, c->leeway, T };
    nalar_err        err = { "" };
    char            *tok = make_token(c->header, c->payload, c->signer, c->flip);
    char             out[256];
    int              rc;

    memset(out, 'X', sizeof(out));
    rc = nalar_jwt_verify(ks[c->ks], tok, strlen(tok), &p, out, sizeof(out), &err);
    if (c->want != NULL) {
        ok(rc == 0 && strcmp(out, c->want) == 0, "%s -> %s", c->name, c->want);
        if (rc != 0) {
            diag("error: %s", err.msg);
        } else if (strcmp(out, c->want) != 0) {
            diag("got tenant \"%s\"", out);
        }
    } else {
        ok(rc == -1 && strstr(err.msg, c->err) != NULL && out[0] == '\0',
           "%s refused: %s", c->name, c->err);
        if (rc != -1 || strstr(err.msg, c->err) == NULL) {
            diag("rc %d, error \"%s\"", rc, err.msg);
        }
    }
    free(tok);
}

static void
load_fails(const char *file, const char *alg, const char *want)
{
    nalar_err         err = { "" };
    nalar_jwt_keyset *k = nalar_jwt_keyset_load(path(file), alg, &err);

    ok(k == NULL && strstr(err.msg, want) != NULL, "load %s %s refused: %s",
       file, alg ? alg : "(no alg)", want);
    if (k != NULL || strstr(err.msg, want) == NULL) {
        diag("error \"%s\"", err.msg);
    }
    nalar_jwt_keyset_free(k);
}

/* A token's size and length: the 16 KiB bound, exactly len bytes read,
 * the tenant buffer, the claim's JSON type */
static void
test_sizes(nalar_jwt_keyset **ks)
{
    nalar_jwt_policy  p = { NULL, NULL, NULL, 0, T };
    nalar_err         err = { "" };
    char              out[256];
    char             *tok;
    char             *big;
    size_t            n;
    int               rc;

    /* Size bound: a valid token padded past 16 KiB in an ignored claim. */
    big = malloc(20000);
    memset(big, 0, 20000);
    strcpy(big, "{\"sub\":\"a\",\"pad\":\"");
    memset(big + strlen(big), 'x', 12500);
    strcat(big, "\"}");
    tok = make_token("{\"alg\":\"HS256\"}", big, SG_HS256, 0);
    rc = nalar_jwt_verify(ks[KS_HS256], tok, strlen(tok), &p, out, sizeof(out), &err);
    ok(rc == -1 && strstr(err.msg, "over the 16384-byte limit"),
       "huge token (%zu bytes) refused", strlen(tok));
    free(tok);
    big[strlen("{\"sub\":\"a\",\"pad\":\"") + 11000] = 0;
    strcat(big, "\"}");
    tok = make_token("{\"alg\":\"HS256\"}", big, SG_HS256, 0);
    rc = nalar_jwt_verify(ks[KS_HS256], tok, strlen(tok), &p, out, sizeof(out), &err);
    ok(rc == 0 && strcmp(out, "a") == 0, "large token (%zu bytes) under the "
       "limit accepted", strlen(tok));
    free(tok);
    free(big);

    /* Verification reads exactly len bytes: a valid token followed by junk,
       and a valid token cut short. */
    tok = make_token("{\"alg\":\"HS256\"}", P_OK, SG_HS256, 0);
    n = strlen(tok);
    strcat(tok, "garbage");
    rc = nalar_jwt_verify(ks[KS_HS256], tok, n, &p, out, sizeof(out), &err);
    ok(rc == 0 && strcmp(out, "tenant-a") == 0, "token verified from its length");
    rc = nalar_jwt_verify(ks[KS_HS256], tok, n - 1, &p, out, sizeof(out), &err);
    ok(rc == -1, "token one byte short refused (%s)", err.msg);
    /* Tenant buffer too small. */
    rc = nalar_jwt_verify(ks[KS_HS256], tok, n, &p, out, 5, &err);
    ok(rc == -1 && strstr(err.msg, "over the 4-byte limit") && out[0] == 0,
       "claim longer than the buffer refused");
    free(tok);
    tok = make_token("{\"alg\":\"HS256\"}", "{\"sub\":123456}", SG_HS256, 0);
    rc = nalar_jwt_verify(ks[KS_HS256], tok, strlen(tok), &p, out, 4, &err);
    ok(rc == -1 && strstr(err.msg, "does not fit") && out[0] == 0,
       "numeric claim longer than the buffer refused");
    free(tok);

    /* The claim's JSON type: 777 and "777" read the same, typed apart. */
    {
        int is_string = -1;

        tok = make_token("{\"alg\":\"HS256\"}", "{\"sub\":777}", SG_HS256, 0);
        rc = nalar_jwt_verify_claim(ks[KS_HS256], tok, strlen(tok), &p, out,
                                    sizeof(out), &is_string, &err);
        ok(rc == 0 && strcmp(out, "777") == 0 && is_string == 0,
           "numeric claim: \"777\", an integer");
        free(tok);
        tok = make_token("{\"alg\":\"HS256\"}", "{\"sub\":\"777\"}", SG_HS256,
                         0);
        rc = nalar_jwt_verify_claim(ks[KS_HS256], tok, strlen(tok), &p, out,
                                    sizeof(out), &is_string, &err);
        ok(rc == 0 && strcmp(out, "777") == 0 && is_string == 1,
           "string claim: \"777\", a string");
        free(tok);
    }
}


static void
test_mutations(nalar_jwt_keyset **ks)
{
    nalar_jwt_policy  p = { NULL, NULL, NULL, 0, T };
    nalar_err         err = { "" };
    char              out[256];
    char             *tok;
    size_t            n;
    int               rc;

    /* Every single-character change to a valid token must be refused:
       base64url is decoded canonically, so any change alters the signed
       bytes or the signature.  (Also a crash hunt under ASan.) */
    {
        static const char alpha[] =
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ \x80";
        const int signers[] = { SG_HS256, SG_ES256, SG_ED };
        const int sets[] = { KS_HS256, KS_EC, KS_ED };
        const char *hdrs[] = { "{\"alg\":\"HS256\"}", "{\"alg\":\"ES256\"}",
                               "{\"alg\":\"EdDSA\"}" };
        uint32_t rng = 2463534242u;
        int      accepted = 0, tried = 0;

        for (int s = 0; s < 3; s++) {
            tok = make_token(hdrs[s], P_OK, signers[s], 0);
            n = strlen(tok);
            rc = nalar_jwt_verify(ks[sets[s]], tok, n, &p, out, sizeof(out), &err);
            ok(rc == 0, "%s: unmutated token verifies", hdrs[s]);
            for (int i = 0; i < 1500; i++) {
                size_t at;
                char   was, c;
                rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
                at = rng % n;
                c = alpha[(rng >> 16) % (sizeof(alpha) - 1)];
                if (c == tok[at]) {
                    continue;
                }
                was = tok[at];
                tok[at] = c;
                tried++;
                accepted += nalar_jwt_verify(ks[sets[s]], tok, n, &p, out,
                                             sizeof(out), &err) == 0;
                tok[at] = was;
            }
            free(tok);
        }
        ok(accepted == 0 && tried > 4000, "%d one-character mutations of valid "
           "tokens: %d accepted", tried, accepted);
    }
}


/* The clock when now is 0, and RFC 7515's published example */
static void
test_clock_rfc(nalar_jwt_keyset **ks)
{
    nalar_jwt_policy  p = { NULL, NULL, NULL, 0, T };
    nalar_err         err = { "" };
    char              out[256];
    char             *tok;
    int               rc;

    /* time(NULL) when now is 0: a token that expired in 2001 is refused. */
    tok = make_token("{\"alg\":\"HS256\"}", "{\"sub\":\"a\",\"exp\":1000000000}",
                     SG_HS256, 0);
    p.now = 0;
    rc = nalar_jwt_verify(ks[KS_HS256], tok, strlen(tok), &p, out, sizeof(out), &err);
    ok(rc == -1 && strstr(err.msg, "expired"), "now = 0 uses the clock");
    p.now = T;
    free(tok);

    /* RFC 7515 appendix A.1: the published HS256 example (claim iss). */
    {
        static const char jwk[] =
            "{\"kty\":\"oct\",\"k\":\"AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-"
            "EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow\"}";
        static const char rfc[] =
            "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9"
            ".eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFt"
            "cGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
            ".dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        nalar_jwt_policy  rp = { "iss", "joe", NULL, 0, 1300819370 };
        nalar_jwt_keyset *k;

        put("rfc.jwk", jwk, strlen(jwk));
        k = nalar_jwt_keyset_load(path("rfc.jwk"), NULL, &err);
        ok(k != NULL, "single JWK loads");
        rc = k ? nalar_jwt_verify(k, rfc, strlen(rfc), &rp, out, sizeof(out), &err)
               : -1;
        ok(rc == 0 && strcmp(out, "joe") == 0, "RFC 7515 A.1 token verifies");
        if (rc != 0) {
            diag("error: %s", err.msg);
        }
        rp.now = 1300819380;
        rc = k ? nalar_jwt_verify(k, rfc, strlen(rfc), &rp, out, sizeof(out), &err)
               : 0;
        ok(rc == -1 && strstr(err.msg, "expired at 1300819380"),
           "RFC 7515 A.1 token expired at its exp");
        nalar_jwt_keyset_free(k);
    }
}


static void
test_load_refusals(void)
{
    nalar_jwt_policy  p = { NULL, NULL, NULL, 0, T };
    nalar_err         err = { "" };
    char              out[256];
    char             *tok;
    int               rc;

    /* Key files the loader refuses. */
    load_fails("does-not-exist", NULL, "No such file");
    load_fails("rsa.pem", NULL, "private key");
    load_fails("rsa.pub", "HS256", "refusing to use a public key as an HMAC secret");
    load_fails("rsa.pub", "ES256", "ES256 needs an EC P-256 key");
    load_fails("rsa.pub", "none", "alg none is never accepted");
    load_fails("rsa.pub", "NONE", "alg none is never accepted");
    load_fails("rsa.pub", "XS256", "unknown alg");
    load_fails("rsa1k.pub", NULL, "RSA key of 1024 bits, under 2048");
    load_fails("ec.pub", "ES384", "ES384 needs an EC P-384 key");
    load_fails("ec.pub", "RS256", "RS256 needs an RSA key");
    load_fails("ed.pub", "ES256", "needs an EC P-256 key");
    load_fails("hs256.key", "RS256", "needs a PEM public key or a JWKS");
    load_fails("hs256.key", "HS512", "HS512 secret is 43 bytes, under the 64");
    load_fails("short.key", NULL, "HS256 secret is 16 bytes, under the 32");
    load_fails("keys.jwks", "ES384", "no usable signing key for ES384");
    load_fails("offcurve.jwks", NULL, "not a valid P-256 point");
    load_fails("dupkid.jwks", NULL, "duplicate kid");
    load_fails("e1.jwks", NULL, "RSA public key fails OpenSSL's checks");
    PUTS("broken.jwks", "{\"keys\":[");
    load_fails("broken.jwks", NULL, "JSON error");
    PUTS("nokeys.jwks", "{\"foo\":1}");
    load_fails("nokeys.jwks", NULL, "no \"keys\" array");
    PUTS("badn.jwks", "{\"keys\":[{\"kty\":\"RSA\",\"n\":\"a+b\",\"e\":\"AQAB\"}]}");
    load_fails("badn.jwks", NULL, "\"n\" is not non-empty base64url");
    PUTS("badalg.jwks", "{\"keys\":[{\"kty\":\"RSA\",\"alg\":\"ES256\","
         "\"n\":\"AQAB\",\"e\":\"AQAB\"}]}");
    load_fails("badalg.jwks", NULL, "alg ES256 does not fit kty RSA");
    PUTS("badpem.pub", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
    load_fails("badpem.pub", NULL, "not a readable PEM public key");

    /* The JWKS pinned to one algorithm keeps only keys that can serve it. */
    {
        nalar_jwt_keyset *k = nalar_jwt_keyset_load(path("keys.jwks"), "EdDSA",
                                                    &err);
        ok(k != NULL && nalar_jwt_keyset_count(k) == 1
           && strcmp(nalar_jwt_keyset_alg(k, 0), "EdDSA") == 0,
           "JWKS pinned to EdDSA keeps the one OKP key");
        tok = make_token("{\"alg\":\"EdDSA\"}", P_OK, SG_ED, 0);
        rc = k ? nalar_jwt_verify(k, tok, strlen(tok), &p, out, sizeof(out), &err)
               : -1;
        ok(rc == 0 && strcmp(out, "tenant-a") == 0,
           "single-key JWKS: a token without kid uses its key");
        free(tok);
        nalar_jwt_keyset_free(k);
    }
}


int
main(void)
{
    nalar_jwt_keyset *ks[N_KS];
    nalar_jwt_policy  p = { NULL, NULL, NULL, 0, T };
    nalar_err         err = { "" };
    char              out[256];
    int               rc;

    snprintf(dir, sizeof(dir), "/tmp/nalar-jwt-XXXXXX");
    if (mkdtemp(dir) == NULL) {
        printf("Bail out! mkdtemp failed\n");
        return 1;
    }
    make_keys();

    /* Key sets: each bound to one algorithm. */
    for (int i = 0; i < N_KS; i++) {
        ks[i] = nalar_jwt_keyset_load(path(KEYSETS[i].file), KEYSETS[i].alg, &err);
        ok(ks[i] != NULL
           && strcmp(nalar_jwt_keyset_alg(ks[i], 0), KEYSETS[i].want_alg) == 0,
           "load %s (%s) -> %s", KEYSETS[i].file,
           KEYSETS[i].alg ? KEYSETS[i].alg : "no alg", KEYSETS[i].want_alg);
        if (ks[i] == NULL) {
            diag("error: %s", err.msg);
            printf("Bail out! cannot load %s\n", KEYSETS[i].file);
            return 1;
        }
    }
    is_int(nalar_jwt_keyset_count(ks[KS_JWKS]), 5,
           "JWKS: 5 signing keys kept, the enc and RSA-OAEP keys skipped");
    ok(strcmp(nalar_jwt_keyset_alg(ks[KS_JWKS], 2), "ES256") == 0
       && strcmp(nalar_jwt_keyset_alg(ks[KS_JWKS], 3), "EdDSA") == 0
       && strcmp(nalar_jwt_keyset_alg(ks[KS_JWKS], 4), "HS256") == 0,
       "JWKS: EC -> ES256, OKP -> EdDSA, oct -> HS256");

    for (size_t i = 0; i < sizeof(CASES) / sizeof(CASES[0]); i++) {
        run_case(ks, &CASES[i]);
    }

    for (size_t i = 0; i < sizeof(GARBAGE) / sizeof(GARBAGE[0]); i++) {
        rc = nalar_jwt_verify(ks[KS_HS256], GARBAGE[i].token,
                              strlen(GARBAGE[i].token), &p, out, sizeof(out),
                              &err);
        ok(rc == -1 && strstr(err.msg, GARBAGE[i].err) != NULL,
           "garbage %s refused: %s", GARBAGE[i].name, GARBAGE[i].err);
        if (rc != -1 || strstr(err.msg, GARBAGE[i].err) == NULL) {
            diag("rc %d, error \"%s\"", rc, err.msg);
        }
    }

    test_sizes(ks);
    test_mutations(ks);
    test_clock_rfc(ks);
    test_load_refusals();

    for (int i = 0; i < N_KS; i++) {
        nalar_jwt_keyset_free(ks[i]);
    }
    nalar_jwt_keyset_free(NULL);
    sh("rm -rf %s", dir);
    return done_testing();
}
