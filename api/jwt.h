/*
 * JWT (JWS compact serialization, RFC 7515/7519) verification for tenant
 * scoping.  The operator configures one key file; a bearer token is accepted
 * only when its signature verifies under that key with the algorithm the key
 * was loaded for, its time claims hold, and its issuer and audience match.
 * The value of one claim (default "sub") then becomes the tenant.
 *
 * Key files (nalar_jwt_keyset_load):
 *   - PEM public key or certificate: RSA (RS256/384/512, PS256/384/512),
 *     EC P-256 (ES256), EC P-384 (ES384), Ed25519 (EdDSA);
 *   - JWKS JSON ({"keys":[...]} or a single JWK) with kty RSA/EC/OKP/oct,
 *     optional kid/alg/use; keys for other uses or algorithms are skipped;
 *   - anything else: an HMAC secret (HS256/384/512), the file's bytes with
 *     one trailing "\n" removed, at least as long as the hash (RFC 7518 3.2).
 * Every key is bound to exactly one algorithm at load time, either the one
 * the operator pins or the one its type implies; a token whose header names
 * any other algorithm is refused, which is what defeats algorithm confusion
 * (an HS256 token "signed" with an RSA public key's PEM bytes never reaches
 * HMAC, because the RSA key is bound to RS256) and "alg":"none".
 *
 * No nginx dependency; thread-safe for concurrent verification once loaded.
 */
#ifndef NALAR_JWT_H
#define NALAR_JWT_H

#include <stddef.h>
#include <stdint.h>

#include "nalar_err.h"

#define NALAR_JWT_MAX_TOKEN (16 * 1024)   /* bytes of the compact token */

typedef struct nalar_jwt_keyset nalar_jwt_keyset;

/* path: key file as above; alg: "HS256", "RS256", ... to pin, or NULL to
   derive from the key type (a plain secret file then means HS256; an RSA
   key RS256; a JWK its own "alg").  NULL on error. */
nalar_jwt_keyset *nalar_jwt_keyset_load(const char *path, const char *alg,
                                        nalar_err *err);
void nalar_jwt_keyset_free(nalar_jwt_keyset *k);

/* Number of keys loaded, and the algorithm key i is bound to ("RS256"). */
int         nalar_jwt_keyset_count(const nalar_jwt_keyset *k);
const char *nalar_jwt_keyset_alg(const nalar_jwt_keyset *k, int i);

typedef struct {
    const char *claim;     /* claim that becomes the tenant; NULL = "sub" */
    const char *issuer;    /* required iss, or NULL */
    const char *audience;  /* required aud (string or array member), or NULL */
    int64_t     leeway;    /* seconds of clock skew allowed, >= 0 */
    int64_t     now;       /* unix time; 0 = time(NULL) */
} nalar_jwt_policy;

/* Verify `token` (len bytes, no "Bearer " prefix).  On success writes the
   claim's value (strings as is, integers in decimal) NUL-terminated into out
   (cap bytes) and returns 0; else -1 with err saying precisely why (for the
   log; a client should only ever be told invalid_token).  Time rules
   (RFC 7519 4.1): valid while now < exp + leeway, from nbf - leeway on, and
   iat may be at most leeway in the future. */
int nalar_jwt_verify(const nalar_jwt_keyset *k, const char *token, size_t len,
                     const nalar_jwt_policy *p, char *out, size_t cap,
                     nalar_err *err);

/* The same, and *is_string says whether the claim was a JSON string (1)
   or an integer (0): "777" and 777 are different identities. */
int nalar_jwt_verify_claim(const nalar_jwt_keyset *k, const char *token,
                           size_t len, const nalar_jwt_policy *p, char *out,
                           size_t cap, int *is_string, nalar_err *err);

#endif
