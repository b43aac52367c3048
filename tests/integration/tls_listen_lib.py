# sluice - tests/integration/tls_listen_lib.py: TLS listeners for the TLS
# tests (test_tls_listen.py, test_tls_scan.py): a config with a plain and a
# TLS listener, and a sluice started on it. Their certificates: tlslib.CA.

from conftest import free_port
from proxylib import proxy_conf


def tls_listen_conf(routes, certs, tls_port, min_version=None, **kw):
    """proxy_conf() whose listen: is the plain @LISTEN_PORT@ (first, so the
    factory waits on it) and a TLS listener on tls_port with certs, a list
    of (cert_file, key_file)."""
    text = proxy_conf(routes, **kw)
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
