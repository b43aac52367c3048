# sluice - tests/integration/jwtlib.py: JSON Web Tokens made by the tests.
#
# Keys generated per run and tokens signed by Python's own code with
# Debian's python3-cryptography (no JWT library): RS256/384/512, PS256,
# ES256/384 (r||s as JOSE wants it), EdDSA (Ed25519) and HS256, and the
# JWKS document of the public keys. Run as a script,
#   jwtlib.py vectors DIR
# it writes the known-answer vectors tests/unit/test_jwt.c checks:
# DIR/jwks.json, DIR/secret and DIR/vectors.tsv (status, name, token).

import base64
import hashlib
import hmac
import json
import os
import sys
import time

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

ISSUER = "https://issuer.test"
AUDIENCE = "api"


def b64u(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_bytes(v, n=None):
    n = n or (v.bit_length() + 7) // 8
    return v.to_bytes(n, "big")


class Key:
    """A private key with its kid and JWK; alg picks the kind."""

    def __init__(self, alg, kid):
        self.alg, self.kid = alg, kid
        if alg in ("RS256", "RS384", "RS512", "PS256"):
            self.priv = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            pub = self.priv.public_key().public_numbers()
            self.jwk = {"kty": "RSA", "n": b64u(_int_bytes(pub.n)), "e": b64u(_int_bytes(pub.e))}
        elif alg in ("ES256", "ES384"):
            curve, crv, self.size = ((ec.SECP256R1(), "P-256", 32) if alg == "ES256"
                                     else (ec.SECP384R1(), "P-384", 48))
            self.priv = ec.generate_private_key(curve)
            pub = self.priv.public_key().public_numbers()
            self.jwk = {"kty": "EC", "crv": crv, "x": b64u(_int_bytes(pub.x, self.size)),
                        "y": b64u(_int_bytes(pub.y, self.size))}
        elif alg == "EdDSA":
            self.priv = ed25519.Ed25519PrivateKey.generate()
            raw = self.priv.public_key().public_bytes(serialization.Encoding.Raw,
                                                      serialization.PublicFormat.Raw)
            self.jwk = {"kty": "OKP", "crv": "Ed25519", "x": b64u(raw)}
        elif alg == "HS256":
            self.priv = os.urandom(32)
            self.jwk = {"kty": "oct", "k": b64u(self.priv)}
        else:
            raise ValueError(alg)
        if kid is not None:
            self.jwk["kid"] = kid

    def sign(self, signing_input):
        data = signing_input.encode()
        alg = self.alg
        if alg == "HS256":
            return hmac.new(self.priv, data, hashlib.sha256).digest()
        if alg == "EdDSA":
            return self.priv.sign(data)
        h = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
        if alg.startswith("RS"):
            return self.priv.sign(data, padding.PKCS1v15(), h)
        if alg == "PS256":
            return self.priv.sign(data, padding.PSS(mgf=padding.MGF1(h), salt_length=32), h)
        r, s = decode_dss_signature(self.priv.sign(data, ec.ECDSA(h)))
        return _int_bytes(r, self.size) + _int_bytes(s, self.size)


def claims(sub="alice", ttl_s=3600, **extra):
    now = int(time.time())
    c = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + ttl_s}
    c.update(extra)
    return {k: v for k, v in c.items() if v is not None}


def token(key, payload, alg=None, kid="", header=None):
    """A JWS compact token of payload (a dict, or raw JSON text) signed with
    key (None: an empty signature). alg and kid default to the key's."""
    h = {"alg": alg or key.alg, "typ": "JWT"}
    kid = key.kid if kid == "" and key is not None else kid
    if kid is not None:
        h["kid"] = kid
    h.update(header or {})
    body = payload if isinstance(payload, str) else json.dumps(payload)
    si = b64u(json.dumps(h).encode()) + "." + b64u(body.encode())
    return si + "." + (b64u(key.sign(si)) if key is not None else "")


def jwks(*keys):
    return json.dumps({"keys": [k.jwk for k in keys]})


def secret_key(secret):
    """An HS256 Key over a given secret (the config's `secret:`)."""
    k = Key("HS256", None)
    k.priv = secret
    return k


def flip(tok):
    """The token with one signature byte changed."""
    head, _, sig = tok.rpartition(".")
    raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
    raw[len(raw) // 2] ^= 1
    return head + "." + b64u(bytes(raw))


def vectors(out_dir):
    keys = {alg: Key(alg, "k-" + alg.lower()) for alg in
            ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")}
    secret = os.urandom(32).hex().encode()
    hs = secret_key(secret)
    other = Key("ES256", "k-es256")                     # same kid, other key
    rows = []
    for alg, k in keys.items():
        rows.append(("ok", "valid " + alg, token(k, claims(sub="s-" + alg))))
    rows += [
        ("ok", "aud array", token(keys["ES256"], claims(aud=["x", AUDIENCE]))),
        ("ok", "integer sub", token(keys["ES256"], claims(sub=None, uid=42))),
        ("ok", "no kid", token(keys["EdDSA"], claims(), kid=None)),
        ("ok", "within leeway", token(keys["RS256"], claims(ttl_s=-10))),
        ("expired", "expired", token(keys["RS256"], claims(ttl_s=-120))),
        ("not_yet_valid", "nbf ahead", token(keys["RS256"], claims(nbf=int(time.time()) + 600))),
        ("bad_issuer", "other issuer", token(keys["ES384"], claims(iss="https://evil.test"))),
        ("bad_audience", "other audience", token(keys["ES384"], claims(aud="web"))),
        ("bad_audience", "aud array without", token(keys["ES384"], claims(aud=["web", "x"]))),
        ("bad_signature", "flipped RS256", flip(token(keys["RS256"], claims()))),
        ("bad_signature", "flipped ES256", flip(token(keys["ES256"], claims()))),
        ("bad_signature", "flipped EdDSA", flip(token(keys["EdDSA"], claims()))),
        ("bad_signature", "other ES256 key", token(other, claims())),
        ("bad_alg", "alg none", token(None, claims(), alg="none", kid="k-rs256")),
        ("bad_alg", "RS256 as HS256", token(keys["RS256"], claims(), alg="HS256")),
        ("bad_alg", "ES256 key as ES384", token(keys["ES256"], claims(), alg="ES384")),
        ("bad_alg", "crit", token(keys["RS256"], claims(), header={"crit": ["exp"]})),
        ("no_key", "unknown kid", token(keys["RS256"], claims(), kid="k-gone")),
        ("malformed", "duplicate claim", token(keys["RS256"],
                                               '{"sub":"a","sub":"b","aud":"api"}')),
        ("malformed", "not JSON", token(keys["RS256"], '{"sub":')),
        ("malformed", "two parts", "eyJhbGciOiJIUzI1NiJ9.e30"),
        ("malformed", "padded", token(keys["RS256"], claims()) + "="),
    ]
    with open(os.path.join(out_dir, "jwks.json"), "w") as f:
        f.write(jwks(*keys.values()))
    with open(os.path.join(out_dir, "secret"), "wb") as f:
        f.write(secret)
    with open(os.path.join(out_dir, "vectors.tsv"), "w") as f:
        f.write("ok\tHS256 secret\t%s\n" % token(hs, claims(sub="s-HS256")))
        f.write("bad_signature\tHS256 other secret\t%s\n"
                % token(secret_key(b"y" * 32), claims()))
        for status, name, tok in rows:
            f.write("%s\t%s\t%s\n" % (status, name, tok))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "vectors":
        sys.exit("usage: jwtlib.py vectors DIR")
    vectors(sys.argv[2])
