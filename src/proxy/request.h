/* sluice - request.h: one request, and what it computed.
 *
 * A request is owned by its client connection (c->rq, conn.h) and zeroed
 * for each head (request_reset); it owns everything the request needs
 * after a suspension point (Redis, the upstream, a timer): its normalised
 * path, the client address, its id, the path_regex captures, the
 * access-log facts, its keys and limit results (rq->dec, decide.h), where
 * its head is, its route, and how far its answer and its upstream exchange
 * have gone (struct request in request_state.h).
 * The path and key buffers and the log facts are kept across requests and
 * grown as needed (freed by request_free), so a request allocates nothing
 * in the common case. A connection holds its request only while one is in
 * progress: an idle keep-alive connection gives it back to its worker's
 * spares (request_put) and takes one again when bytes of a head arrive
 * (request_get), so idle connections cost no request state. */
#ifndef SLUICE_REQUEST_H
#define SLUICE_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include "request_state.h"      /* struct request */

struct conf;

/* Zero the per-request part; keeps the buffers. */
void request_reset(struct request *rq);
/* Stop what the request waits for (its decision, an RLS call): no
 * callback of it runs after this. */
void request_cancel(struct request *rq);
void request_free(struct request *rq);

/* A worker keeps at most this many spare requests (their buffers too): the
 * requests that were in progress at once, up to this, cost no allocation
 * when they come again. */
#define REQUEST_SPARES_MAX 256
struct conn_env;
/* A reset request for a connection whose head begins: one of env's spares,
 * or a new one. */
struct request *request_get(struct conn_env *env);
/* The connection holding rq is idle (or closing): its decision is
 * cancelled, its runtime released, and rq joins env's spares (or is freed
 * beyond REQUEST_SPARES_MAX). NULL is a no-op. */
void request_put(struct conn_env *env, struct request *rq);
/* The worker ends, its clients are gone: free the spares. */
void request_spares_free(struct conn_env *env);

/* Room for n more bytes of normalised path (n + 1 with the NUL). */
char *request_path_room(struct request *rq, size_t n);

/* The way of the request in progress on client c (request.c), from its
 * head to the decision and then the exchange (exchange_start) or a reply. */
struct client;
struct http1_span;

/* Parse the next head in the client's input and take it as far as it goes
 * now (a local answer, a pending decision, or the exchange). */
void request_head(struct client *c);
/* Answer the request ourselves: an error, or after a denial, a 429;
 * close_after closes the connection once it is written. */
void request_answer(struct client *c, int status, int close_after);
void request_answer_named(struct client *c, int status, const char *name, int close_after);
/* A head that is not a request (a parse error; an HTTP/2 header list that
 * could not become one): answered as status, logged, the connection ends. */
void request_refuse_head(struct client *c, int status);
/* A failure once the response may have started: answer, or cut. */
void request_fail(struct client *c, int status);
/* Read and drop the body of a request answered locally. */
void request_discard_body(struct client *c);
/* The upstream's status is known: count_status consumption; 1 while the
 * response waits for it. */
int request_consume_counted(struct client *c, int status);
/* Access log and response metrics. */
void request_log_begin(struct client *c, int parsed);
void request_log_end(struct client *c);
void request_count_response(struct client *c, int status);
void request_count_out(struct client *c, uint64_t n);
/* The head's bytes: taken again after every wait (the input may move);
 * dropped from the input once answered. */
void request_refresh_head(struct client *c);
void request_drain_head(struct client *c);

#endif
