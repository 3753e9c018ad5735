/*
 * JWT verification: strict base64url, JSON through jansson (duplicate members
 * refused, so a header or payload never means two things), signatures
 * through OpenSSL 3 EVP.  See jwt.h for the rules.
 *
 * The order of checks is deliberate: header, key selection, algorithm
 * binding, signature, and only then is the payload parsed and its claims
 * believed.  Nothing a token says chooses how it is verified except `kid`,
 * and a kid can only choose among keys the operator loaded, each bound to
 * one algorithm.
 */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "jwt.h"

#define MAX_KEY_FILE  (1 << 20)   /* a JWKS of a few dozen keys is ~50 KiB */
#define MAX_KID       256
#define MIN_RSA_BITS  2048

/* ---------------------------------------------------------------------- */
/* Algorithms                                                              */

enum { K_HMAC, K_RSA, K_PSS, K_EC, K_ED };

typedef struct {
    const char *name;    /* JOSE "alg" */
    int         kind;    /* K_* */
    const char *md;      /* digest for EVP, NULL for EdDSA (pure) */
    int         size;    /* HMAC: tag and minimum key bytes; EC: coordinate bytes */
    const char *group;   /* EC: OpenSSL group name */
    const char *crv;     /* EC: JWK "crv" */
} alg_info;

static const alg_info ALGS[] = {
    { "HS256", K_HMAC, "SHA256", 32, NULL, NULL },
    { "HS384", K_HMAC, "SHA384", 48, NULL, NULL },
    { "HS512", K_HMAC, "SHA512", 64, NULL, NULL },
    { "RS256", K_RSA,  "SHA256", 0,  NULL, NULL },
    { "RS384", K_RSA,  "SHA384", 0,  NULL, NULL },
    { "RS512", K_RSA,  "SHA512", 0,  NULL, NULL },
    { "PS256", K_PSS,  "SHA256", 0,  NULL, NULL },
    { "PS384", K_PSS,  "SHA384", 0,  NULL, NULL },
    { "PS512", K_PSS,  "SHA512", 0,  NULL, NULL },
    { "ES256", K_EC,   "SHA256", 32, "prime256v1", "P-256" },
    { "ES384", K_EC,   "SHA384", 48, "secp384r1",  "P-384" },
    { "EdDSA", K_ED,   NULL,     0,  NULL, NULL },
};
#define N_ALGS ((int) (sizeof(ALGS) / sizeof(ALGS[0])))
enum { A_HS256 = 0, A_RS256 = 3, A_PS256 = 6, A_EDDSA = 11 };

static int
find_alg(const char *name)
{
    for (int i = 0; i < N_ALGS; i++) {
        if (strcmp(ALGS[i].name, name) == 0) {
            return i;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------------- */
/* Keys                                                                    */

typedef struct {
    char          *kid;         /* NUL-terminated, or NULL (PEM, secret file) */
    int            alg;         /* index into ALGS: the only alg it verifies */
    EVP_PKEY      *pkey;        /* public key, or NULL for HMAC */
    unsigned char *secret;      /* (secret_len) HMAC key, or NULL */
    size_t         secret_len;
} jwt_key;

struct nalar_jwt_keyset {
    jwt_key *keys;              /* (n) */
    int      n;
};


/* Attacker-controlled text (kid, alg) goes into logs: printable ASCII only,
   truncated. */
static const char *
printable(char *dst, size_t cap, const char *s, size_t n)
{
    size_t j = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s[i];
        if (j + 8 > cap) {
            memcpy(dst + j, "...", 4);
            return dst;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            dst[j++] = (char) c;
        } else {
            j += (size_t) snprintf(dst + j, cap - j, "\\x%02x", c);
        }
    }
    dst[j] = '\0';
    return dst;
}

/* Strict base64url (RFC 4648 section 5, no padding): every character from
   the alphabet, no "=", length mod 4 never 1, and the unused low bits of the
   last character zero, so each byte string has exactly one encoding and a
   token cannot be altered without changing its signed bytes. */
static int
b64url_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
}

static int
b64url_decode(const char *s, size_t n, unsigned char *out, size_t *out_len)
{
    size_t   o = 0;
    uint32_t acc = 0;
    int      bits = 0;

    if (n % 4 == 1) {
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int v = b64url_val((unsigned char) s[i]);
        if (v < 0) {
            return -1;
        }
        acc = (acc << 6) | (uint32_t) v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char) (acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0) {               /* non-canonical trailing bits */
        return -1;
    }
    *out_len = o;
    return 0;
}

/* Decode a base64url JSON string member of a JWK into a fresh buffer. */
static unsigned char *
jwk_bytes(json_t *jwk, const char *name, size_t *len, const char *where,
          nalar_err *err)
{
    json_t        *v = json_object_get(jwk, name);
    unsigned char *buf;

    if (!json_is_string(v)) {
        nalar_fail(err, "%s: \"%s\" missing or not a string", where, name);
        return NULL;
    }
    buf = malloc(json_string_length(v) + 1);
    if (buf == NULL) {
        nalar_fail(err, "%s: out of memory", where);
        return NULL;
    }
    if (b64url_decode(json_string_value(v), json_string_length(v), buf, len) < 0
        || *len == 0)
    {
        free(buf);
        nalar_fail(err, "%s: \"%s\" is not non-empty base64url", where, name);
        return NULL;
    }
    return buf;
}

/* Check that a public key can carry alg `a`; RSA sizes and EC curves too. */
static int
pkey_fits(EVP_PKEY *pkey, int a, const char *where, nalar_err *err)
{
    const alg_info *ai = &ALGS[a];
    char            group[64];
    EVP_PKEY_CTX   *ctx;
    int             ok;

    switch (ai->kind) {
    case K_HMAC:
        return nalar_fail(err, "%s: %s needs a secret, not a public key "
                          "(refusing to use a public key as an HMAC secret)",
                          where, ai->name);
    case K_RSA:
    case K_PSS:
        if (EVP_PKEY_is_a(pkey, "RSA-PSS") && ai->kind == K_RSA) {
            return nalar_fail(err, "%s: an RSA-PSS key cannot verify %s",
                              where, ai->name);
        }
        if (!EVP_PKEY_is_a(pkey, "RSA") && !EVP_PKEY_is_a(pkey, "RSA-PSS")) {
            return nalar_fail(err, "%s: %s needs an RSA key", where, ai->name);
        }
        if (EVP_PKEY_get_bits(pkey) < MIN_RSA_BITS) {
            return nalar_fail(err, "%s: RSA key of %d bits, under %d",
                              where, EVP_PKEY_get_bits(pkey), MIN_RSA_BITS);
        }
        /* A JWKS gives n and e as bare numbers: e = 1 or an even n would
           make signatures forgeable, so let OpenSSL vet them (SP 800-56B). */
        ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL);
        ok = ctx != NULL && EVP_PKEY_public_check(ctx) == 1;
        EVP_PKEY_CTX_free(ctx);
        ERR_clear_error();
        if (!ok) {
            return nalar_fail(err, "%s: RSA public key fails OpenSSL's checks "
                              "(exponent or modulus unsound)", where);
        }
        return 0;
    case K_EC:
        if (!EVP_PKEY_is_a(pkey, "EC")
            || EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME,
                                              group, sizeof(group), NULL) != 1
            || strcmp(group, ai->group) != 0)
        {
            ERR_clear_error();
            return nalar_fail(err, "%s: %s needs an EC %s key", where,
                              ai->name, ai->crv);
        }
        return 0;
    case K_ED:
        if (!EVP_PKEY_is_a(pkey, "ED25519")) {
            return nalar_fail(err, "%s: EdDSA needs an Ed25519 key", where);
        }
        return 0;
    }
    return nalar_fail(err, "%s: internal: unknown algorithm kind", where);
}

/* The algorithm a public key implies when the operator pins none. */
static int
pkey_default_alg(EVP_PKEY *pkey)
{
    char group[64];

    if (EVP_PKEY_is_a(pkey, "RSA")) return A_RS256;
    if (EVP_PKEY_is_a(pkey, "RSA-PSS")) return A_PS256;
    if (EVP_PKEY_is_a(pkey, "ED25519")) return A_EDDSA;
    if (EVP_PKEY_is_a(pkey, "EC")
        && EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME,
                                          group, sizeof(group), NULL) == 1)
    {
        for (int i = 0; i < N_ALGS; i++) {
            if (ALGS[i].group && strcmp(ALGS[i].group, group) == 0) {
                return i;
            }
        }
    }
    ERR_clear_error();
    return -1;
}

static int
secret_fits(size_t len, int a, const char *where, nalar_err *err)
{
    if (ALGS[a].kind != K_HMAC) {
        return nalar_fail(err, "%s: %s needs a public key, not an HMAC secret",
                          where, ALGS[a].name);
    }
    if (len < (size_t) ALGS[a].size) {
        /* RFC 7518 3.2: a key of the same size as the hash output or larger
           MUST be used. */
        return nalar_fail(err, "%s: %s secret is %zu bytes, under the %d the "
                          "hash needs", where, ALGS[a].name, len, ALGS[a].size);
    }
    return 0;
}

static int
keyset_add(nalar_jwt_keyset *ks, jwt_key *key, const char *where, nalar_err *err)
{
    jwt_key *grown;

    for (int i = 0; key->kid && i < ks->n; i++) {
        if (ks->keys[i].kid && strcmp(ks->keys[i].kid, key->kid) == 0) {
            return nalar_fail(err, "%s: duplicate kid", where);
        }
    }
    grown = realloc(ks->keys, (size_t) (ks->n + 1) * sizeof(jwt_key));
    if (grown == NULL) {
        return nalar_fail(err, "%s: out of memory", where);
    }
    ks->keys = grown;
    ks->keys[ks->n++] = *key;
    memset(key, 0, sizeof(*key));
    return 0;
}

static void
key_clear(jwt_key *key)
{
    free(key->kid);
    EVP_PKEY_free(key->pkey);
    if (key->secret) {
        OPENSSL_cleanse(key->secret, key->secret_len);
        free(key->secret);
    }
    memset(key, 0, sizeof(*key));
}

void
nalar_jwt_keyset_free(nalar_jwt_keyset *k)
{
    if (k == NULL) {
        return;
    }
    for (int i = 0; i < k->n; i++) {
        key_clear(&k->keys[i]);
    }
    free(k->keys);
    free(k);
}

int
nalar_jwt_keyset_count(const nalar_jwt_keyset *k)
{
    return k ? k->n : 0;
}

const char *
nalar_jwt_keyset_alg(const nalar_jwt_keyset *k, int i)
{
    return (k && i >= 0 && i < k->n) ? ALGS[k->keys[i].alg].name : NULL;
}

/* ---- PEM ---- */

static int
load_pem(nalar_jwt_keyset *ks, const char *buf, size_t len, int pinned,
         const char *path, nalar_err *err)
{
    BIO      *bio;
    EVP_PKEY *pkey = NULL;
    jwt_key   key = { 0 };
    int       a;

    if (strstr(buf, "PRIVATE KEY-----") != NULL) {
        return nalar_fail(err, "%s: holds a private key; give the public key "
                          "(openssl pkey -in KEY -pubout)", path);
    }
    bio = BIO_new_mem_buf(buf, (int) len);
    if (bio == NULL) {
        return nalar_fail(err, "%s: out of memory", path);
    }
    if (strstr(buf, "-----BEGIN CERTIFICATE-----") != NULL) {
        X509 *x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
        if (x != NULL) {
            pkey = X509_get_pubkey(x);
            X509_free(x);
        }
    } else {
        pkey = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    }
    BIO_free(bio);
    ERR_clear_error();
    if (pkey == NULL) {
        return nalar_fail(err, "%s: not a readable PEM public key or "
                          "certificate", path);
    }
    a = pinned >= 0 ? pinned : pkey_default_alg(pkey);
    if (a < 0) {
        EVP_PKEY_free(pkey);
        return nalar_fail(err, "%s: unsupported key type %s (RSA, EC P-256/"
                          "P-384 and Ed25519 are)", path,
                          EVP_PKEY_get0_type_name(pkey) ?
                          EVP_PKEY_get0_type_name(pkey) : "?");
    }
    if (pkey_fits(pkey, a, path, err) < 0) {
        EVP_PKEY_free(pkey);
        return -1;
    }
    key.alg = a;
    key.pkey = pkey;
    return keyset_add(ks, &key, path, err);
}

/* ---- JWK(S) ---- */

static EVP_PKEY *
pkey_fromdata(const char *type, OSSL_PARAM *params, const char *where,
              nalar_err *err)
{
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    EVP_PKEY     *pkey = NULL;

    if (ctx == NULL || EVP_PKEY_fromdata_init(ctx) != 1
        || EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
    {
        EVP_PKEY_free(pkey);
        pkey = NULL;
        nalar_fail(err, "%s: OpenSSL refused the %s key parameters", where, type);
    }
    EVP_PKEY_CTX_free(ctx);
    ERR_clear_error();
    return pkey;
}

static EVP_PKEY *
jwk_rsa(json_t *jwk, const char *where, nalar_err *err)
{
    unsigned char  *n = NULL, *e = NULL;
    size_t          nn, ne;
    BIGNUM         *bn_n = NULL, *bn_e = NULL;
    OSSL_PARAM_BLD *bld = NULL;
    OSSL_PARAM     *params = NULL;
    EVP_PKEY       *pkey = NULL;

    if ((n = jwk_bytes(jwk, "n", &nn, where, err)) == NULL
        || (e = jwk_bytes(jwk, "e", &ne, where, err)) == NULL)
    {
        goto done;
    }
    bn_n = BN_bin2bn(n, (int) nn, NULL);
    bn_e = BN_bin2bn(e, (int) ne, NULL);
    bld = OSSL_PARAM_BLD_new();
    if (bn_n == NULL || bn_e == NULL || bld == NULL
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n)
        || !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e)
        || (params = OSSL_PARAM_BLD_to_param(bld)) == NULL)
    {
        nalar_fail(err, "%s: out of memory", where);
        goto done;
    }
    pkey = pkey_fromdata("RSA", params, where, err);
done:
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn_n);
    BN_free(bn_e);
    free(n);
    free(e);
    ERR_clear_error();
    return pkey;
}

static EVP_PKEY *
jwk_ec(json_t *jwk, const alg_info *ai, const char *where, nalar_err *err)
{
    unsigned char *x = NULL, *y = NULL, point[1 + 2 * 66];
    size_t         nx, ny, c = (size_t) ai->size;
    EVP_PKEY      *pkey = NULL;
    EVP_PKEY_CTX  *ctx;
    OSSL_PARAM     params[3];

    if ((x = jwk_bytes(jwk, "x", &nx, where, err)) == NULL
        || (y = jwk_bytes(jwk, "y", &ny, where, err)) == NULL)
    {
        goto done;
    }
    if (nx != c || ny != c) {
        nalar_fail(err, "%s: %s coordinates must be %zu bytes (x %zu, y %zu)",
                   where, ai->crv, c, nx, ny);
        goto done;
    }
    point[0] = 0x04;                  /* uncompressed SEC1 point: 04 || x || y */
    memcpy(point + 1, x, c);
    memcpy(point + 1 + c, y, c);
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME,
                                                 (char *) ai->group, 0);
    params[1] = OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY,
                                                  point, 1 + 2 * c);
    params[2] = OSSL_PARAM_construct_end();
    /* The point must lie on the curve (invalid-curve attacks); OpenSSL
       refuses some such points while decoding, the check catches the rest. */
    pkey = pkey_fromdata("EC", params, where, err);
    ctx = pkey ? EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL) : NULL;
    if (ctx == NULL || EVP_PKEY_public_check(ctx) != 1) {
        EVP_PKEY_free(pkey);
        pkey = NULL;
        nalar_fail(err, "%s: not a valid %s point", where, ai->crv);
    }
    EVP_PKEY_CTX_free(ctx);
done:
    free(x);
    free(y);
    ERR_clear_error();
    return pkey;
}

static EVP_PKEY *
jwk_okp(json_t *jwk, const char *where, nalar_err *err)
{
    unsigned char *x;
    size_t         nx;
    EVP_PKEY      *pkey = NULL;

    if ((x = jwk_bytes(jwk, "x", &nx, where, err)) == NULL) {
        return NULL;
    }
    if (nx != 32) {
        nalar_fail(err, "%s: Ed25519 x must be 32 bytes, not %zu", where, nx);
    } else if ((pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, x,
                                                   32)) == NULL)
    {
        nalar_fail(err, "%s: OpenSSL refused the Ed25519 key", where);
    }
    free(x);
    ERR_clear_error();
    return pkey;
}

static const char *
jstr(json_t *o, const char *name)
{
    json_t *v = json_object_get(o, name);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Which algorithm kinds a JWK's kty (and crv) can serve; -1 = unsupported. */
static int
jwk_accepts(json_t *jwk, int a)
{
    const char *kty = jstr(jwk, "kty"), *crv = jstr(jwk, "crv");
    int         kind = ALGS[a].kind;

    if (strcmp(kty, "oct") == 0) return kind == K_HMAC;
    if (strcmp(kty, "RSA") == 0) return kind == K_RSA || kind == K_PSS;
    if (strcmp(kty, "EC") == 0) {
        return kind == K_EC && crv && strcmp(crv, ALGS[a].crv) == 0;
    }
    if (strcmp(kty, "OKP") == 0) {
        return kind == K_ED && crv && strcmp(crv, "Ed25519") == 0;
    }
    return 0;
}

static int
jwk_default_alg(json_t *jwk)
{
    const char *kty = jstr(jwk, "kty"), *crv = jstr(jwk, "crv");

    if (strcmp(kty, "oct") == 0) return A_HS256;
    if (strcmp(kty, "RSA") == 0) return A_RS256;
    if (strcmp(kty, "OKP") == 0) return crv && strcmp(crv, "Ed25519") == 0 ?
                                        A_EDDSA : -1;
    if (strcmp(kty, "EC") == 0 && crv) {
        for (int i = 0; i < N_ALGS; i++) {
            if (ALGS[i].crv && strcmp(ALGS[i].crv, crv) == 0) {
                return i;
            }
        }
    }
    return -1;
}

/* Add one JWK; returns 0 added, 1 skipped (other use, alg or type), -1 error. */
static int
load_jwk(nalar_jwt_keyset *ks, json_t *jwk, int pinned, const char *where,
         nalar_err *err)
{
    const char *use, *kty, *kid, *jalg;
    json_t     *v;
    jwt_key     key = { 0 };
    int         a;

    if (!json_is_object(jwk)) {
        return nalar_fail(err, "%s: not a JSON object", where);
    }
    if ((use = jstr(jwk, "use")) != NULL && strcmp(use, "sig") != 0) {
        return 1;                                 /* e.g. "enc" */
    }
    if ((kty = jstr(jwk, "kty")) == NULL) {
        return nalar_fail(err, "%s: no \"kty\"", where);
    }
    v = json_object_get(jwk, "kid");
    if (v != NULL && (!json_is_string(v) || json_string_length(v) == 0
                      || json_string_length(v) > MAX_KID
                      || strlen(json_string_value(v)) != json_string_length(v)))
    {
        return nalar_fail(err, "%s: \"kid\" must be a string of 1..%d bytes",
                          where, MAX_KID);
    }
    kid = v ? json_string_value(v) : NULL;
    v = json_object_get(jwk, "alg");
    if (v != NULL && !json_is_string(v)) {
        return nalar_fail(err, "%s: \"alg\" is not a string", where);
    }
    jalg = v ? json_string_value(v) : NULL;

    if (jalg != NULL) {
        a = find_alg(jalg);
        if (a < 0 || (pinned >= 0 && a != pinned)) {
            return 1;                     /* e.g. RSA-OAEP, or not the pinned one */
        }
    } else {
        a = pinned >= 0 ? pinned : jwk_default_alg(jwk);
        if (a < 0) {
            return 1;
        }
    }
    if (!jwk_accepts(jwk, a)) {
        if (jalg != NULL && pinned < 0) {
            return nalar_fail(err, "%s: alg %s does not fit kty %s", where,
                              jalg, kty);
        }
        return 1;
    }

    switch (ALGS[a].kind) {
    case K_HMAC:
        key.secret = jwk_bytes(jwk, "k", &key.secret_len, where, err);
        if (key.secret == NULL
            || secret_fits(key.secret_len, a, where, err) < 0)
        {
            key_clear(&key);
            return -1;
        }
        break;
    case K_RSA:
    case K_PSS:
        key.pkey = jwk_rsa(jwk, where, err);
        break;
    case K_EC:
        key.pkey = jwk_ec(jwk, &ALGS[a], where, err);
        break;
    case K_ED:
        key.pkey = jwk_okp(jwk, where, err);
        break;
    }
    if (ALGS[a].kind != K_HMAC
        && (key.pkey == NULL || pkey_fits(key.pkey, a, where, err) < 0))
    {
        key_clear(&key);
        return -1;
    }
    key.alg = a;
    if (kid != NULL && (key.kid = strdup(kid)) == NULL) {
        key_clear(&key);
        return nalar_fail(err, "%s: out of memory", where);
    }
    if (keyset_add(ks, &key, where, err) < 0) {
        key_clear(&key);
        return -1;
    }
    return 0;
}

static int
load_jwks(nalar_jwt_keyset *ks, const char *buf, size_t len, int pinned,
          const char *path, nalar_err *err)
{
    json_error_t jerr;
    json_t      *root, *keys;
    size_t       n, skipped = 0;
    char         where[512];
    int          rc = 0;

    root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        return nalar_fail(err, "%s: JSON error at line %d: %s", path,
                          jerr.line, jerr.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return nalar_fail(err, "%s: JWKS must be a JSON object", path);
    }
    keys = json_object_get(root, "keys");
    if (keys == NULL && json_object_get(root, "kty") != NULL) {
        snprintf(where, sizeof(where), "%s: JWK", path);
        rc = load_jwk(ks, root, pinned, where, err);
        skipped = rc == 1;
        n = 1;
    } else if (!json_is_array(keys)) {
        json_decref(root);
        return nalar_fail(err, "%s: JWKS has no \"keys\" array", path);
    } else {
        n = json_array_size(keys);
        for (size_t i = 0; i < n && rc >= 0; i++) {
            snprintf(where, sizeof(where), "%s: key %zu", path, i);
            rc = load_jwk(ks, json_array_get(keys, i), pinned, where, err);
            skipped += rc == 1;
        }
    }
    json_decref(root);
    if (rc < 0) {
        return -1;
    }
    if (ks->n == 0) {
        return nalar_fail(err, "%s: no usable signing key%s%s (%zu of %zu "
                          "skipped: other use, algorithm or key type)", path,
                          pinned >= 0 ? " for " : "",
                          pinned >= 0 ? ALGS[pinned].name : "", skipped, n);
    }
    return 0;
}

/* ---- secret file ---- */

static int
load_secret(nalar_jwt_keyset *ks, const char *buf, size_t len, int pinned,
            const char *path, nalar_err *err)
{
    jwt_key key = { 0 };
    int     a = pinned >= 0 ? pinned : A_HS256;

    if (ALGS[a].kind != K_HMAC) {
        return nalar_fail(err, "%s: %s needs a PEM public key or a JWKS, and "
                          "this file is neither", path, ALGS[a].name);
    }
    if (len > 0 && buf[len - 1] == '\n') {
        len--;                                   /* one trailing newline */
    }
    if (secret_fits(len, a, path, err) < 0) {
        return -1;
    }
    key.secret = malloc(len);
    if (key.secret == NULL) {
        return nalar_fail(err, "%s: out of memory", path);
    }
    memcpy(key.secret, buf, len);
    key.secret_len = len;
    key.alg = a;
    if (keyset_add(ks, &key, path, err) < 0) {
        key_clear(&key);
        return -1;
    }
    return 0;
}

static char *
read_file(const char *path, size_t *len, nalar_err *err)
{
    FILE  *f = fopen(path, "rb");
    char  *buf;
    size_t n;

    if (f == NULL) {
        nalar_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(MAX_KEY_FILE + 1);
    if (buf == NULL) {
        fclose(f);
        nalar_fail(err, "%s: out of memory", path);
        return NULL;
    }
    n = fread(buf, 1, MAX_KEY_FILE + 1, f);
    if (ferror(f) || n > MAX_KEY_FILE) {
        nalar_fail(err, "%s: %s", path, ferror(f) ? "read error"
                   : "larger than 1 MiB; not a key file");
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = n;
    return buf;
}

nalar_jwt_keyset *
nalar_jwt_keyset_load(const char *path, const char *alg, nalar_err *err)
{
    nalar_jwt_keyset *ks;
    char             *buf;
    size_t            len, i = 0;
    int               pinned = -1, rc;

    if (path == NULL) {
        nalar_fail(err, "jwt: no key file given");
        return NULL;
    }
    if (alg != NULL) {
        if (strcasecmp(alg, "none") == 0) {
            nalar_fail(err, "%s: alg none is never accepted", path);
            return NULL;
        }
        if ((pinned = find_alg(alg)) < 0) {
            nalar_fail(err, "%s: unknown alg \"%s\" (HS256/384/512, RS256/384/"
                       "512, PS256/384/512, ES256, ES384, EdDSA)", path, alg);
            return NULL;
        }
    }
    if ((buf = read_file(path, &len, err)) == NULL) {
        return NULL;
    }
    ks = calloc(1, sizeof(*ks));
    if (ks == NULL) {
        OPENSSL_cleanse(buf, len);
        free(buf);
        nalar_fail(err, "%s: out of memory", path);
        return NULL;
    }
    /* The file's shape decides its kind; the secret's bytes are taken as they
       are (leading whitespace included), so only sniff past it. */
    while (i < len && isspace((unsigned char) buf[i])) {
        i++;
    }
    if (strncmp(buf + i, "-----BEGIN ", 11) == 0) {
        rc = load_pem(ks, buf, len, pinned, path, err);
    } else if (i < len && buf[i] == '{') {
        rc = load_jwks(ks, buf, len, pinned, path, err);
    } else {
        rc = load_secret(ks, buf, len, pinned, path, err);
    }
    OPENSSL_cleanse(buf, len);
    free(buf);
    if (rc < 0) {
        nalar_jwt_keyset_free(ks);
        return NULL;
    }
    return ks;
}

/* ---------------------------------------------------------------------- */
/* Verification                                                            */

/* Signature over the ASCII bytes "header.payload" (`in`, n bytes). */
static int
verify_sig(const jwt_key *key, const unsigned char *in, size_t n,
           const unsigned char *sig, size_t sig_len, nalar_err *err)
{
    const alg_info *ai = &ALGS[key->alg];
    unsigned char   tag[EVP_MAX_MD_SIZE], *der = NULL;
    size_t          tag_len = 0;
    EVP_MD_CTX     *ctx;
    EVP_PKEY_CTX   *pctx = NULL;
    ECDSA_SIG      *es;
    BIGNUM         *r, *s;
    int             ok = 0, der_len;

    if (ai->kind == K_HMAC) {
        if (sig_len != (size_t) ai->size) {
            return nalar_fail(err, "jwt: %s signature is %zu bytes, not %d",
                              ai->name, sig_len, ai->size);
        }
        if (EVP_Q_mac(NULL, "HMAC", NULL, ai->md, NULL, key->secret,
                      key->secret_len, in, n, tag, sizeof(tag), &tag_len)
            == NULL || tag_len != sig_len)
        {
            ERR_clear_error();
            return nalar_fail(err, "jwt: HMAC computation failed");
        }
        ok = CRYPTO_memcmp(tag, sig, sig_len) == 0;   /* constant time */
        OPENSSL_cleanse(tag, sizeof(tag));
        return ok ? 0 : nalar_fail(err, "jwt: bad %s signature", ai->name);
    }

    if (ai->kind == K_EC) {
        /* JWS carries r || s, each left-padded to the coordinate size;
           OpenSSL verifies the DER SEQUENCE { INTEGER r, INTEGER s }. */
        if (sig_len != 2 * (size_t) ai->size) {
            return nalar_fail(err, "jwt: %s signature is %zu bytes, not %d",
                              ai->name, sig_len, 2 * ai->size);
        }
        es = ECDSA_SIG_new();
        r = BN_bin2bn(sig, ai->size, NULL);
        s = BN_bin2bn(sig + ai->size, ai->size, NULL);
        if (es == NULL || r == NULL || s == NULL || !ECDSA_SIG_set0(es, r, s)) {
            ECDSA_SIG_free(es);
            BN_free(r);
            BN_free(s);
            ERR_clear_error();
            return nalar_fail(err, "jwt: out of memory");
        }
        der_len = i2d_ECDSA_SIG(es, &der);
        ECDSA_SIG_free(es);
        if (der_len <= 0) {
            ERR_clear_error();
            return nalar_fail(err, "jwt: cannot encode the ECDSA signature");
        }
        sig = der;
        sig_len = (size_t) der_len;
    } else if (ai->kind == K_RSA || ai->kind == K_PSS) {
        if (sig_len != (size_t) EVP_PKEY_get_size(key->pkey)) {
            return nalar_fail(err, "jwt: %s signature is %zu bytes, the key's "
                              "modulus %d", ai->name, sig_len,
                              EVP_PKEY_get_size(key->pkey));
        }
    } else if (sig_len != 64) {
        return nalar_fail(err, "jwt: EdDSA signature is %zu bytes, not 64",
                          sig_len);
    }

    ctx = EVP_MD_CTX_new();
    if (ctx != NULL
        && EVP_DigestVerifyInit_ex(ctx, &pctx, ai->md, NULL, NULL,
                                   key->pkey, NULL) == 1
        && (ai->kind != K_PSS
            || (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1
                && EVP_PKEY_CTX_set_rsa_mgf1_md_name(pctx, ai->md, NULL) == 1
                && EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx,
                                                    RSA_PSS_SALTLEN_DIGEST) == 1)))
    {
        ok = EVP_DigestVerify(ctx, sig, sig_len, in, n) == 1;
    }
    EVP_MD_CTX_free(ctx);
    OPENSSL_free(der);
    ERR_clear_error();
    return ok ? 0 : nalar_fail(err, "jwt: bad %s signature", ai->name);
}

static int64_t
sat_add(int64_t a, int64_t b)
{
    if (b > 0 && a > INT64_MAX - b) return INT64_MAX;
    if (b < 0 && a < INT64_MIN - b) return INT64_MIN;
    return a + b;
}

/* NumericDate (seconds, possibly fractional) -> whole seconds rounded up:
   for an integer `now`, now < x  <=>  now < ceil(x), and likewise for the
   other comparisons made below.  0 absent, 1 present, -1 not a number. */
static int
numeric_date(json_t *payload, const char *name, int64_t *t, nalar_err *err)
{
    json_t *v = json_object_get(payload, name);
    double  d;

    if (v == NULL) {
        return 0;
    }
    if (json_is_integer(v)) {
        *t = (int64_t) json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        d = ceil(json_real_value(v));
        *t = d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t) d;
        return 1;
    }
    return nalar_fail(err, "jwt: claim %s is not a number", name);
}

static int
check_claims(json_t *pl, const nalar_jwt_policy *p, nalar_err *err)
{
    int64_t now = p->now ? p->now : (int64_t) time(NULL);
    int64_t leeway = p->leeway > 0 ? p->leeway : 0, t = 0;
    json_t *v;
    char    show[96];
    int     rc;

    if ((rc = numeric_date(pl, "exp", &t, err)) < 0) {
        return -1;
    }
    if (rc == 1 && !(now < sat_add(t, leeway))) {
        return nalar_fail(err, "jwt: expired at %lld (now %lld, leeway %lld s)",
                          (long long) t, (long long) now, (long long) leeway);
    }
    if ((rc = numeric_date(pl, "nbf", &t, err)) < 0) {
        return -1;
    }
    if (rc == 1 && now < sat_add(t, -leeway)) {
        return nalar_fail(err, "jwt: not valid before %lld (now %lld, leeway "
                          "%lld s)", (long long) t, (long long) now,
                          (long long) leeway);
    }
    if ((rc = numeric_date(pl, "iat", &t, err)) < 0) {
        return -1;
    }
    if (rc == 1 && t > sat_add(now, leeway)) {
        return nalar_fail(err, "jwt: issued in the future at %lld (now %lld, "
                          "leeway %lld s)", (long long) t, (long long) now,
                          (long long) leeway);
    }

    if (p->issuer != NULL) {
        v = json_object_get(pl, "iss");
        if (!json_is_string(v)) {
            return nalar_fail(err, "jwt: no iss claim, and issuer %s is "
                              "required", p->issuer);
        }
        if (json_string_length(v) != strlen(p->issuer)
            || memcmp(json_string_value(v), p->issuer, strlen(p->issuer)) != 0)
        {
            return nalar_fail(err, "jwt: issuer \"%s\" is not the required %s",
                              printable(show, sizeof(show), json_string_value(v),
                                        json_string_length(v)), p->issuer);
        }
    }

    if (p->audience != NULL) {
        size_t want = strlen(p->audience), i;
        json_t *a;
        int     found = 0;

        v = json_object_get(pl, "aud");
        if (v == NULL) {
            return nalar_fail(err, "jwt: no aud claim, and audience %s is "
                              "required", p->audience);
        }
        if (json_is_string(v)) {
            found = json_string_length(v) == want
                    && memcmp(json_string_value(v), p->audience, want) == 0;
        } else if (json_is_array(v)) {
            json_array_foreach(v, i, a) {
                if (!json_is_string(a)) {
                    return nalar_fail(err, "jwt: aud array holds a non-string");
                }
                found |= json_string_length(a) == want
                         && memcmp(json_string_value(a), p->audience, want) == 0;
            }
        } else {
            return nalar_fail(err, "jwt: aud is neither a string nor an array");
        }
        if (!found) {
            return nalar_fail(err, "jwt: audience %s is not in aud", p->audience);
        }
    }
    return 0;
}

/* The claim that names the tenant: a non-empty string without control
   characters (it lands in log lines and rate-limit keys) or an integer. */
static int
extract_claim(json_t *pl, const char *name, char *out, size_t cap,
              int *is_string, nalar_err *err)
{
    json_t *v = json_object_get(pl, name);
    size_t  n;

    if (v == NULL) {
        return nalar_fail(err, "jwt: claim %s missing", name);
    }
    *is_string = json_is_string(v);
    if (json_is_integer(v)) {
        n = (size_t) snprintf(out, cap, "%lld", (long long) json_integer_value(v));
        if (n >= cap) {
            out[0] = '\0';
            return nalar_fail(err, "jwt: claim %s does not fit %zu bytes",
                              name, cap);
        }
        return 0;
    }
    if (!json_is_string(v)) {
        return nalar_fail(err, "jwt: claim %s is not a string or integer", name);
    }
    n = json_string_length(v);
    if (n == 0) {
        return nalar_fail(err, "jwt: claim %s is empty", name);
    }
    if (n >= cap) {
        return nalar_fail(err, "jwt: claim %s is %zu bytes, over the %zu-byte "
                          "limit", name, n, cap - 1);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char) json_string_value(v)[i];
        if (c < 0x20 || c == 0x7f) {
            return nalar_fail(err, "jwt: claim %s contains a control character",
                              name);
        }
    }
    memcpy(out, json_string_value(v), n);
    out[n] = '\0';
    return 0;
}

static json_t *
decode_json(const char *s, size_t n, unsigned char *scratch, const char *what,
            nalar_err *err)
{
    size_t       len;
    json_t      *j;
    json_error_t jerr;

    if (b64url_decode(s, n, scratch, &len) < 0) {
        nalar_fail(err, "jwt: %s is not base64url", what);
        return NULL;
    }
    j = json_loadb((const char *) scratch, len, JSON_REJECT_DUPLICATES, &jerr);
    if (j == NULL) {
        nalar_fail(err, "jwt: %s is not JSON: %s", what, jerr.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        nalar_fail(err, "jwt: %s is not a JSON object", what);
        return NULL;
    }
    return j;
}

static const jwt_key *
select_key(const nalar_jwt_keyset *k, json_t *hdr, nalar_err *err)
{
    json_t *v = json_object_get(hdr, "kid");
    char    show[96];

    if (v == NULL) {
        if (k->n == 1) {
            return &k->keys[0];
        }
        nalar_fail(err, "jwt: token has no kid and the key set holds %d keys",
                   k->n);
        return NULL;
    }
    if (!json_is_string(v)) {
        nalar_fail(err, "jwt: kid is not a string");
        return NULL;
    }
    for (int i = 0; i < k->n; i++) {
        if (k->keys[i].kid != NULL
            && strlen(k->keys[i].kid) == json_string_length(v)
            && memcmp(k->keys[i].kid, json_string_value(v),
                      json_string_length(v)) == 0)
        {
            return &k->keys[i];
        }
    }
    /* A single key without a kid (PEM or secret file) answers any kid. */
    if (k->n == 1 && k->keys[0].kid == NULL) {
        return &k->keys[0];
    }
    nalar_fail(err, "jwt: no key with kid \"%s\"",
               printable(show, sizeof(show), json_string_value(v),
                         json_string_length(v)));
    return NULL;
}

int
nalar_jwt_verify(const nalar_jwt_keyset *k, const char *token, size_t len,
                 const nalar_jwt_policy *p, char *out, size_t cap,
                 nalar_err *err)
{
    int is_string;

    return nalar_jwt_verify_claim(k, token, len, p, out, cap, &is_string,
                                  err);
}

int
nalar_jwt_verify_claim(const nalar_jwt_keyset *k, const char *token,
                       size_t len, const nalar_jwt_policy *p, char *out,
                       size_t cap, int *is_string, nalar_err *err)
{
    const char    *dot1, *dot2, *alg, *claim;
    const jwt_key *key;
    unsigned char *scratch = NULL;
    json_t        *hdr = NULL, *pl = NULL, *v;
    size_t         sig_len;
    char           show[96];
    int            rc = -1;

    if (out == NULL || cap == 0) {
        return nalar_fail(err, "jwt: no room for the claim");
    }
    out[0] = '\0';
    if (k == NULL || k->n == 0 || p == NULL) {
        return nalar_fail(err, "jwt: no key set or policy");
    }
    if (token == NULL || len == 0) {
        return nalar_fail(err, "jwt: empty token");
    }
    if (len > NALAR_JWT_MAX_TOKEN) {
        return nalar_fail(err, "jwt: token is %zu bytes, over the %d-byte "
                          "limit", len, NALAR_JWT_MAX_TOKEN);
    }
    dot1 = memchr(token, '.', len);
    dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t) (dot1 + 1 - token)) : NULL;
    if (dot2 == NULL || memchr(dot2 + 1, '.', len - (size_t) (dot2 + 1 - token))) {
        return nalar_fail(err, "jwt: not three dot-separated parts (JWS "
                          "compact)");
    }
    scratch = malloc(len);                 /* each decoded part is shorter */
    if (scratch == NULL) {
        return nalar_fail(err, "jwt: out of memory");
    }

    /* 1. header: algorithm and key choice */
    hdr = decode_json(token, (size_t) (dot1 - token), scratch, "header", err);
    if (hdr == NULL) {
        goto done;
    }
    v = json_object_get(hdr, "alg");
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        nalar_fail(err, "jwt: header has no alg string");
        goto done;
    }
    alg = json_string_value(v);
    if (strcasecmp(alg, "none") == 0) {
        nalar_fail(err, "jwt: alg none refused (unsigned token)");
        goto done;
    }
    if (json_object_get(hdr, "crit") != NULL) {
        /* RFC 7515 4.1.11: extensions we do not implement must fail. */
        nalar_fail(err, "jwt: header crit names extensions this verifier "
                   "does not implement");
        goto done;
    }
    if ((key = select_key(k, hdr, err)) == NULL) {
        goto done;
    }
    if (strcmp(alg, ALGS[key->alg].name) != 0) {
        nalar_fail(err, "jwt: token alg %s does not match the key's %s",
                   printable(show, sizeof(show), alg, strlen(alg)),
                   ALGS[key->alg].name);
        goto done;
    }

    /* 2. signature over the ASCII "header.payload" */
    if (b64url_decode(dot2 + 1, len - (size_t) (dot2 + 1 - token), scratch,
                      &sig_len) < 0)
    {
        nalar_fail(err, "jwt: signature is not base64url");
        goto done;
    }
    if (verify_sig(key, (const unsigned char *) token,
                   (size_t) (dot2 - token), scratch, sig_len, err) < 0)
    {
        goto done;
    }

    /* 3. claims, now that they are known to come from the key holder */
    pl = decode_json(dot1 + 1, (size_t) (dot2 - dot1 - 1), scratch, "payload",
                     err);
    if (pl == NULL || check_claims(pl, p, err) < 0) {
        goto done;
    }
    claim = p->claim ? p->claim : "sub";
    rc = extract_claim(pl, claim, out, cap, is_string, err);
done:
    json_decref(hdr);
    json_decref(pl);
    free(scratch);
    return rc;
}
