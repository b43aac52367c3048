# sluice - tests/integration/nginxlib.py: a real nginx (Debian's) for the
# tests that need one (test_tls_upstream.py, test_decision_auth.py): one
# process in the foreground, every path under the test's own directory.

NGINX = "/usr/sbin/nginx"

_MAIN = """
user root;
worker_processes 1;
daemon off;
master_process off;
pid %(t)s/nginx.pid;
error_log %(t)s/error.log info;
events { worker_connections 256; }
http {
    client_body_temp_path %(t)s/body;
    proxy_temp_path %(t)s/proxy;
    fastcgi_temp_path %(t)s/fastcgi;
    uwsgi_temp_path %(t)s/uwsgi;
    scgi_temp_path %(t)s/scgi;
"""


def nginx_conf(tmp, http_body):
    """A whole nginx.conf for `nginx -p tmp`: http_body (its log and server
    blocks) inside http { }."""
    return _MAIN % {"t": tmp} + http_body + "}\n"
