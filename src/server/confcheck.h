/* sluice - confcheck.h: loading a config whole.
 *
 * conf_load() (conf_load.c) parses and checks the file's syntax and values and
 * uses no module above it. confcheck_load() runs it, then does what the
 * modules that use a config must do before it may be used, as nginx builds
 * its cycle after parsing: it checks each upstream's TLS files (readable,
 * PEM, the key matching the certificate; tls_upstream.h), builds each TLS
 * listener's contexts (tls_server.h; released with the conf) and makes each
 * override's Redis key (route.h). Every loader (sluice -t, the start, a
 * SIGHUP reload) calls this one: an error anywhere is the same
 * "FILE:LINE:COL: message" and leaves nothing built. */
#ifndef SLUICE_CONFCHECK_H
#define SLUICE_CONFCHECK_H

struct conf;

/* A conf with one reference, ready to run; or NULL with *err a malloc'd
 * "FILE:LINE:COL: message" (or "FILE: cannot read: ..."), the caller frees
 * it. err may be NULL. */
struct conf *confcheck_load(const char *file, char **err);

#endif
