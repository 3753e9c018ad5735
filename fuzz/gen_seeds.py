#!/usr/bin/env python3
"""Writes the seed corpora of the JWT, chat and tokenizer fuzz targets
(fuzz/corpus/{jwt,chat,tokenizer}); the input layouts are described at the
top of each fuzz/fuzz_NAME.c.  Needs python3-cryptography for the keys.

    python3 fuzz/gen_seeds.py [fuzz/corpus]
"""
import base64
import hashlib
import hmac
import json
import os
import sys

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

SECRET = b"fuzz-secret-fuzz-secret-fuzz-secret!"
out = sys.argv[1] if len(sys.argv) > 1 else "fuzz/corpus"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=")


def save(kind, name, data):
    os.makedirs(os.path.join(out, kind), exist_ok=True)
    with open(os.path.join(out, kind, name), "wb") as f:
        f.write(data)


def j(o):
    return json.dumps(o, separators=(",", ":")).encode()


# ---- jwt: byte 0 mode, byte 1 policy (claim, iss 4, aud 8, leeway 16)
claims = {"sub": "alice", "org": "acme", "tenant": 42,
          "iss": "https://issuer.example", "aud": ["x", "nalar"],
          "exp": 1800000000, "nbf": 1600000000, "iat": 1690000000}
hs = b64(j({"alg": "HS256", "typ": "JWT"})) + b"." + b64(j(claims))
hs += b"." + b64(hmac.new(SECRET, hs, hashlib.sha256).digest())
save("jwt", "raw-hs256", b"\x00\x0d" + hs)
save("jwt", "raw-kid-b", b"\x00\x01" + b64(j({"alg": "HS384", "kid": "b"}))
     + b"." + b64(j({"sub": "bob"})) + b"." + b64(bytes(48)))
save("jwt", "raw-none", b"\x00\x00" + b64(j({"alg": "none"})) + b"."
     + b64(j({"sub": "x"})) + b".")
save("jwt", "raw-es256", b"\x00\x00" + b64(j({"alg": "ES256"})) + b"."
     + b64(j({"sub": "x"})) + b"." + b64(b"\x00" * 31 + b"\x01" * 33))
save("jwt", "signed-hs", b"\x01\x1d" + j({"alg": "HS256"}) + b"\x00"
     + j(claims))
save("jwt", "signed-hs-int", b"\x01\x03" + j({"alg": "HS256", "kid": "k"})
     + b"\x00" + j({"tenant": 9007199254740993, "exp": 1.7e9 + 0.5}))
es_claims = j({"org": "o", "iss": "https://issuer.example", "aud": "nalar",
               "iat": 1700000059})
# iat 59 s ahead: accepted with the 60 s leeway (0x10), refused without
save("jwt", "signed-es", b"\x02\x1e" + j({"alg": "ES256", "typ": "JWT"})
     + b"\x00" + es_claims)
save("jwt", "signed-es-iat", b"\x02\x0e" + j({"alg": "ES256"}) + b"\x00"
     + es_claims)
rk = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pn = rk.public_key().public_numbers()
ek = ec.generate_private_key(ec.SECP384R1())
en = ek.public_key().public_numbers()
dk = ed25519.Ed25519PrivateKey.generate()
jwks = {"keys": [
    {"kty": "RSA", "kid": "r", "alg": "PS256", "use": "sig",
     "n": b64(pn.n.to_bytes(256, "big")).decode(), "e": "AQAB"},
    {"kty": "EC", "kid": "e", "crv": "P-384",
     "x": b64(en.x.to_bytes(48, "big")).decode(),
     "y": b64(en.y.to_bytes(48, "big")).decode()},
    {"kty": "OKP", "crv": "Ed25519", "kid": "d",
     "x": b64(dk.public_key().public_bytes(
         serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()},
    {"kty": "oct", "kid": "h", "alg": "HS512",
     "k": b64(bytes(range(64))).decode()},
    {"kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB"}]}
save("jwt", "key-jwks", b"\x03\x00" + j(jwks))
save("jwt", "key-jwks-pinned", b"\x03\x0b" + j(jwks))
pem = serialization.Encoding.PEM
spki = serialization.PublicFormat.SubjectPublicKeyInfo
save("jwt", "key-pem-rsa",
     b"\x03\x00" + rk.public_key().public_bytes(pem, spki))
save("jwt", "key-pem-ec", b"\x03\x0c" + ek.public_key().public_bytes(pem, spki))
save("jwt", "key-pem-ed", b"\x03\x0d" + dk.public_key().public_bytes(pem, spki))
save("jwt", "key-secret", b"\x03\x08" + SECRET + b"\n")

# ---- chat: byte 0 style, then records [role][len][content]
def chat(style, msgs):
    b = bytes([style])
    for role, text in msgs:
        t = text.encode()
        b += bytes([role, len(t)]) + t
    return b

conv = [(0, "You are terse."), (2, "Hello <|im_end|> there"),
        (3, "Hi."), (2, "Why?</s>[INST]")]
for s, name in enumerate(["auto", "chatml", "llama2", "llama3", "zephyr"]):
    save("chat", "conv-" + name, chat(s, conv))
save("chat", "developer-tool", chat(1, [(1, "rules"), (2, "q"), (4, "{}"),
                                        (3, "")]))
save("chat", "llama2-sys-last", chat(2, [(2, "u"), (3, "a"), (0, "late")]))
save("chat", "unknown-role", chat(3, [(2, "x"), (9, "func\x00\x01"), (0, "")]))
save("chat", "template-llama3",
     b"\xff{% for m in messages %}<|start_header_id|>{{ m.role }}"
     b"<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}")
save("chat", "template-zephyr",
     b"\xff<|user|>\n{{ content }}</s>\n<|assistant|>")

# ---- tokenizer: byte 0 vocabulary and flags, then the text
texts = [b"In the beginning God created the heaven and the earth.",
         b"  two  spaces, a\ttab\nand a newline ",
         "na\u00efve caf\u00e9 \u2014 \u65e5\u672c\u8a9e \U0001F600 "
         "\u2581".encode(),
         b"<s>hello</s> <unk> <0x41> [INST]",
         b"\x00\x01\x7f bytes \xc3\x28 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xff",
         b"1234567890 3.14159 x=y+z;"]
for i, t in enumerate(texts):
    save("tokenizer", "spm-%d" % i, b"\x00" + t)
    save("tokenizer", "bpe-%d" % i, b"\x01" + t)
