/* sluice - accesslog.h: one JSON line per request, written off the hot path.
 *
 * Workers format their line into a buffer of their own and hand it on; one
 * writer thread per log does every write(2), so a slow disk or a stuck pipe
 * never blocks an event loop. When too much is waiting, lines are dropped and
 * counted instead. SIGUSR1 (accesslog_reopen) makes the writer reopen the
 * file after logrotate has moved it. */
#ifndef SLUICE_ACCESSLOG_H
#define SLUICE_ACCESSLOG_H

#include <stddef.h>
#include <stdint.h>

/* Bytes handed to the writer but not yet written, above which lines drop. */
#define ACCESSLOG_MAX_PENDING_DEFAULT (8u * 1024 * 1024)

struct accesslog;

/* One request. Strings are borrowed for the call only and need no NUL where
 * a length is given; NULL pointers become JSON null. Any byte is allowed:
 * the line is always valid JSON (bytes >= 0x80 become \u00XX). */
struct accesslog_entry {
    int64_t time_us;            /* wall clock, microseconds since the epoch */
    const char *client;         /* client address as text */
    size_t client_len;
    const char *method;
    size_t method_len;
    const char *path;           /* the request target exactly as sent */
    size_t path_len;
    int status;                 /* status sent to the client */
    const char *route;          /* NUL-terminated; NULL when no route matched */
    const char *decision;       /* "allowed", "limited", "shadow_limited",
                                   "error", "delayed"; NULL is written as "none" */
    const char *limit;          /* NUL-terminated; NULL when none */
    int64_t remaining;          /* -1 when none */
    int64_t upstream_us;        /* -1 when not forwarded */
    int64_t total_us;
    uint64_t bytes_in;
    uint64_t bytes_out;
    const char *request_id;
    size_t request_id_len;
    const char *tls;            /* NUL-terminated TLS version ("TLSv1.3");
                                 * NULL or "" on a plain connection: "" */
    int64_t delay_ms;           /* a delayed request's wait; written only when > 0 */
    int key_fallback;           /* a limit counted it under the client address
                                 * (on_missing_key: ip); written only when set */
    int has_cost;               /* cost_from: the request was charged cost units
                                 * (the response's, or the estimate) */
    int64_t cost;
    int has_grpc_status;        /* grpc_status is written */
    int grpc_status;            /* a gRPC call's status (its trailers', or sluice's
                                 * own answer's) */
    int http2;                  /* came on an HTTP/2 stream: written as
                                 * "protocol":"HTTP/2.0" (HTTP/1.x: nothing) */
    int decision_mode;          /* a decision listener's request: "mode":"decision"
                                 * (method and path are the described request's);
                                 * written only when set */
};

/* target is "stdout" or a path (opened O_APPEND|O_CREAT, mode 0640; a FIFO
 * without a reader is an error rather than a hang). "off" is the caller's to
 * handle: it simply opens no log. Returns NULL and sets *err to a malloc'd
 * message (the caller frees it) on failure. Starts the writer thread. */
struct accesslog *accesslog_open(const char *target, char **err);

/* The same with another bound on pending bytes (tests use a small one). */
struct accesslog *accesslog_open_bounded(const char *target, size_t max_pending_bytes,
                                         char **err);

/* Writes what is pending (waiting at most ~2 s for a stuck reader; what is
 * left then is counted as dropped), joins the writer, frees everything, and
 * closes the file (never stdout). No accesslog_write may run concurrently or
 * afterwards. NULL is a no-op. */
void accesslog_close(struct accesslog *log);

/* Any thread, hot path. Never blocks on I/O and does not allocate once the
 * calling thread has written a few lines. Lines reach the file within about
 * 100 ms. NULL log is a no-op. */
void accesslog_write(struct accesslog *log, const struct accesslog_entry *e);

/* Async-signal-safe: only sets a flag. The writer reopens the path at its
 * next wakeup (within ~50 ms); stdout is never reopened. If the new open
 * fails, the old file stays in use and the failure is logged. */
void accesslog_reopen(struct accesslog *log);

/* Lines dropped so far by every log of the process, because a writer was
 * behind or a write failed (for metrics; never goes back). */
uint64_t accesslog_dropped(void);

/* Formats e as one line ending in '\n' into buf; returns the line's length,
 * or the size needed (> cap, nothing useful written) when buf is too small.
 * Used by accesslog_write; exposed for tests and for anyone who needs the
 * exact line. */
size_t accesslog_format(const struct accesslog_entry *e, char *buf, size_t cap);

#endif
