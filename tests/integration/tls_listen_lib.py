# sluice - tests/integration/tls_listen_lib.py: certificates and TLS listeners for
# the TLS tests (test_tls_listen.py, test_tls_scan.py).
#
# Certificates are made with the openssl CLI into a temporary directory: a
# root CA, an intermediate CA under it, and leaf certificates signed by the
# intermediate (RSA 2048 or ECDSA P-256) whose cert file holds the leaf and
# then the intermediate, so a client that trusts only the root verifies
# only when sluice sends the chain.

import os
import subprocess

from conftest import free_port
from opslib import ops_conf

OPENSSL = "openssl"


def _run(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _key(path, kind, cwd):
    if kind == "rsa":
        _run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
             "-out", path, cwd=cwd)
    else:
        _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", path, cwd=cwd)


class CA:
    """A root and an intermediate CA in directory d."""

    def __init__(self, d):
        self.d = str(d)
        os.makedirs(self.d, exist_ok=True)
        _key("root.key", "ec", self.d)
        _run("req", "-x509", "-new", "-key", "root.key", "-out", "root.pem", "-days", "30",
             "-subj", "/CN=sluice test root", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=self.d)
        _key("inter.key", "ec", self.d)
        _run("req", "-new", "-key", "inter.key", "-out", "inter.csr",
             "-subj", "/CN=sluice test intermediate", cwd=self.d)
        with open(os.path.join(self.d, "inter.ext"), "w") as f:
            f.write("basicConstraints=critical,CA:TRUE,pathlen:0\n"
                    "keyUsage=critical,keyCertSign,cRLSign\n")
        _run("x509", "-req", "-in", "inter.csr", "-CA", "root.pem", "-CAkey", "root.key",
             "-CAcreateserial", "-out", "inter.pem", "-days", "30", "-extfile", "inter.ext",
             cwd=self.d)
        self.root = os.path.join(self.d, "root.pem")

    def leaf(self, name, kind, dns, ips=("127.0.0.1",), days=30):
        """(cert_file, key_file): leaf + intermediate, and its key."""
        key = name + ".key"
        _key(key, kind, self.d)
        _run("req", "-new", "-key", key, "-out", name + ".csr", "-subj", "/CN=" + dns[0],
             cwd=self.d)
        san = ",".join(["DNS:" + n for n in dns] + ["IP:" + i for i in ips])
        with open(os.path.join(self.d, name + ".ext"), "w") as f:
            # A CRL distribution point, as a real CA's certificates have
            # (nothing fetches it: a scanner only looks for one).
            f.write("subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\n"
                    "keyUsage=critical,digitalSignature%s\nextendedKeyUsage=serverAuth\n"
                    "crlDistributionPoints=URI:http://127.0.0.1/sluice-test.crl\n"
                    % (san, ",keyEncipherment" if kind == "rsa" else ""))
        _run("x509", "-req", "-in", name + ".csr", "-CA", "inter.pem", "-CAkey", "inter.key",
             "-CAcreateserial", "-out", name + ".crt", "-days", str(days), "-sha256",
             "-extfile", name + ".ext", cwd=self.d)
        pem = os.path.join(self.d, name + ".pem")
        with open(pem, "w") as out:
            for part in (name + ".crt", "inter.pem"):
                with open(os.path.join(self.d, part)) as f:
                    out.write(f.read())
        return pem, os.path.join(self.d, key)


def tls_listen_conf(routes, certs, tls_port, min_version=None, **kw):
    """ops_conf() whose listen: is the plain @LISTEN_PORT@ (first, so the
    factory waits on it) and a TLS listener on tls_port with certs, a list
    of (cert_file, key_file)."""
    text = ops_conf(routes, **kw)
    entries = "".join("        - { cert_file: %s, key_file: %s }\n" % c for c in certs)
    listen = ("listen:\n  - 127.0.0.1:@LISTEN_PORT@\n  - address: 127.0.0.1:%d\n    tls:\n"
              "%s      certificates:\n%s"
              % (tls_port, '      min_version: "%s"\n' % min_version if min_version else "",
                 entries))
    head = "listen: 127.0.0.1:@LISTEN_PORT@\n"
    assert text.startswith(head)
    return listen + text[len(head):]


def start_tls(sluice, routes, certs, admin=True, min_version=None, top="", client="",
              upstream_port=None, **kw):
    """A sluice with a plain and a TLS listener; .tls_port and .admin_port set.
    client: more lines for the client: section (each indented by 2)."""
    from conftest import wait_port
    tls_port = free_port()
    admin_port = free_port() if admin else None
    text = tls_listen_conf(routes, certs, tls_port, min_version=min_version,
                           admin_port=admin_port, top=top, **kw)
    assert "\nclient:\n" in text
    text = text.replace("\nclient:\n", "\nclient:\n" + client, 1)
    s = sluice(text, upstream_port=upstream_port)
    s.tls_port = tls_port
    s.admin_port = admin_port
    assert wait_port(tls_port, s.proc), s.stderr
    if admin_port:
        assert wait_port(admin_port, s.proc), s.stderr
    return s
