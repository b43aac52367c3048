/* sluice - exchange.h: one upstream exchange of a client's request.
 *
 * Borrow a connection from the route's pool, send the head and the body
 * (a small body buffered whole first), relay interim 1xx heads, a 101 and
 * the tunnel after it, the response head (with the rate-limit fields) and
 * body, then give the connection back or close it. Everything works on the
 * client whose request it is, and never frees it (conn.h). The request
 * above starts it and hears back only through the reports it gave
 * (struct exchange_ops): the exchange calls nothing of request.c. */
#ifndef SLUICE_EXCHANGE_H
#define SLUICE_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

struct client;

/* What the exchange tells the request (request.c fills one); each is called
 * from inside a callback of c. */
struct exchange_ops {
    /* no upstream connection: answer locally (close_after: close then) */
    void (*answer)(struct client *c, int status, int close_after);
    /* a failure once the response may have started: answer, or cut */
    void (*fail)(struct client *c, int status);
    /* the head's bytes are no longer needed / are wanted again (a resend) */
    void (*drain_head)(struct client *c);
    void (*refresh_head)(struct client *c);
    /* the upstream's status is known: 1 while the response waits for a
     * count_status consumption (then exchange_resume) */
    int (*consume_counted)(struct client *c, int status);
    /* response metrics: its status, and bytes sent to the client */
    void (*count_response)(struct client *c, int status);
    void (*count_out)(struct client *c, uint64_t n);
    /* exchange_buffer_first: the body is in (whole, or as much as
     * client.buffer_body_bytes takes): decide now */
    void (*buffered)(struct client *c);
    /* exchange_read_body: the whole body, body[0..len) (a copy, valid
     * during the call), or its first len bytes when it is larger than the
     * max (over: 1; the rest is unread) */
    void (*body_read)(struct client *c, const uint8_t *body, size_t len, int over);
};

/* The request is allowed: go upstream (or buffer its small body first).
 * ops (static, not owned) hears what happens until the request ends. */
void exchange_start(struct client *c, const struct exchange_ops *ops);
/* Before the decision (an estimate read from the body): buffer a small
 * body as exchange_start would; returns 1 when buffering began (ops'
 * buffered follows once it is in, and exchange_start then sends it), 0
 * when the body is none or too large to buffer. */
int exchange_buffer_first(struct client *c, const struct exchange_ops *ops);
/* The body buffered first (exchange_buffer_first), or NULL; a request
 * answered locally instead of forwarded lets it go (exchange_buffer_drop). */
const char *exchange_buffered(struct client *c, size_t *len);
void exchange_buffer_drop(struct client *c);
/* A request answered here, not forwarded (Envoy's RLS calls): read its
 * whole body, at most max payload bytes, as a small body is buffered
 * (CS_BUFFER, the same timeouts), then ops->body_read. */
void exchange_read_body(struct client *c, const struct exchange_ops *ops, size_t max);
/* Bytes arrived from the client: move what the state allows. */
void exchange_buffer_body(struct client *c);
void exchange_pump_request(struct client *c);
void exchange_tunnel_pump(struct client *c);
/* Room in the client's output: move more of the response. */
void exchange_pump_response(struct client *c);
void exchange_maybe_finish(struct client *c);
/* A count_status consumption answered: the held response goes on. */
void exchange_resume(struct client *c);

#endif
