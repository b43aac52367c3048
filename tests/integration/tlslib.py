# sluice - tests/integration/tlslib.py: certificates for the TLS tests, made
# with the openssl CLI into a test's temporary directory: ECDSA P-256 (or RSA
# 2048) keys, self-signed CAs and certificates signed by them (make_ca,
# make_cert: test_tls_upstream.py, test_redis_tls.py), and a root with an
# intermediate whose leaves carry their chain (CA: test_tls_listen.py,
# test_tls_scan.py): a client that trusts only the root verifies only when
# sluice sends the chain.

import os
import subprocess

OPENSSL = "/usr/bin/openssl"


def openssl(*args, cwd):
    """One openssl command in cwd; CalledProcessError (with its stderr) if it fails."""
    subprocess.run([OPENSSL, *args], cwd=str(cwd), check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_key(d, path, kind="ec"):
    """A private key in d/path: ECDSA P-256, or RSA 2048 (kind "rsa")."""
    if kind == "rsa":
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                "-out", path, cwd=d)
    else:
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", path, cwd=d)


def make_ca(d, name, cn, suffix=".pem", days=2):
    """A self-signed CA in d: NAME.key and NAME<suffix>, subject CN=cn."""
    make_key(d, name + ".key")
    openssl("req", "-x509", "-new", "-key", name + ".key", "-out", name + suffix,
            "-days", str(days), "-subj", "/CN=" + cn,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_cert(d, name, ca, cn, ext, suffix=".pem", days=2):
    """NAME.key and NAME<suffix> in d, subject CN=cn, signed by the CA that
    make_ca(d, ca, ..., suffix) made, with the extensions ext (extfile
    lines, e.g. "subjectAltName=IP:127.0.0.1")."""
    make_key(d, name + ".key")
    openssl("req", "-new", "-key", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn,
            cwd=d)
    with open(os.path.join(str(d), name + ".ext"), "w") as f:
        f.write(ext + "\n")
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + suffix, "-CAkey", ca + ".key",
            "-CAcreateserial", "-days", str(days), "-out", name + suffix,
            "-extfile", name + ".ext", cwd=d)


def make_upstream_pki(d):
    """A CA (ca.pem) and a server certificate it signed (server.pem,
    server.key) for upstream.test, localhost and 127.0.0.1, in d: an
    upstream's TLS for tests that verify it with ca_file. Returns d."""
    make_ca(d, "ca", "sluice test ca")
    make_cert(d, "server", "ca", "upstream.test",
              "subjectAltName=DNS:upstream.test,DNS:localhost,IP:127.0.0.1\n"
              "extendedKeyUsage=serverAuth")
    return d


class CA:
    """A root and an intermediate CA in directory d."""

    def __init__(self, d):
        self.d = str(d)
        os.makedirs(self.d, exist_ok=True)
        make_ca(self.d, "root", "sluice test root", days=30)
        make_cert(self.d, "inter", "root", "sluice test intermediate",
                  "basicConstraints=critical,CA:TRUE,pathlen:0\n"
                  "keyUsage=critical,keyCertSign,cRLSign", days=30)
        self.root = os.path.join(self.d, "root.pem")

    def leaf(self, name, kind, dns, ips=("127.0.0.1",), days=30):
        """(cert_file, key_file): leaf + intermediate, and its key."""
        key = name + ".key"
        make_key(self.d, key, kind)
        openssl("req", "-new", "-key", key, "-out", name + ".csr", "-subj", "/CN=" + dns[0],
                cwd=self.d)
        san = ",".join(["DNS:" + n for n in dns] + ["IP:" + i for i in ips])
        with open(os.path.join(self.d, name + ".ext"), "w") as f:
            # A CRL distribution point, as a real CA's certificates have
            # (nothing fetches it: a scanner only looks for one).
            f.write("subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\n"
                    "keyUsage=critical,digitalSignature%s\nextendedKeyUsage=serverAuth\n"
                    "crlDistributionPoints=URI:http://127.0.0.1/sluice-test.crl\n"
                    % (san, ",keyEncipherment" if kind == "rsa" else ""))
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "inter.pem", "-CAkey", "inter.key",
                "-CAcreateserial", "-out", name + ".crt", "-days", str(days), "-sha256",
                "-extfile", name + ".ext", cwd=self.d)
        pem = os.path.join(self.d, name + ".pem")
        with open(pem, "w") as out:
            for part in (name + ".crt", "inter.pem"):
                with open(os.path.join(self.d, part)) as f:
                    out.write(f.read())
        return pem, os.path.join(self.d, key)
