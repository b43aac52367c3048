/* sluice - admin_console.h: the operator's console on the admin address.
 *
 * GET /api/top (the keys limited most, from a bounded heavy-hitter summary
 * per worker), GET /api/stats (what the dashboard shows) and the dashboard
 * itself (GET /, with /dashboard.js and /dashboard.css, all embedded in the
 * binary). Workers feed the summaries (admin_console_denied, on their own
 * thread); the admin thread merges and renders them, and samples the
 * metrics counters into a fixed ring of ADMIN_CONSOLE_BUCKETS buckets. */
#ifndef SLUICE_ADMIN_CONSOLE_H
#define SLUICE_ADMIN_CONSOLE_H

#include <stddef.h>
#include <stdint.h>

struct conf;
struct event_base;
struct evbuffer;

#define ADMIN_CONSOLE_COUNTERS   64      /* space-saving counters per worker and epoch */
#define ADMIN_CONSOLE_EPOCH_MS   60000   /* two epochs: the last 60 to 120 s */
#define ADMIN_CONSOLE_KEY_MAX    160     /* bytes of a key kept for showing it */
#define ADMIN_CONSOLE_NAME_MAX   64      /* bytes of a route or limit name kept */
#define ADMIN_CONSOLE_BUCKET_MS  5000    /* the stats ring: 60 x 5 s = 5 minutes */
#define ADMIN_CONSOLE_BUCKETS    60
#define ADMIN_CONSOLE_ROUTES     64      /* routes the ring follows; more are left out */

struct admin_console;

/* On the admin thread's base (which must outlive it): starts the sampler. */
struct admin_console *admin_console_create(struct event_base *base, const struct conf *conf);
void admin_console_destroy(struct admin_console *ac);
/* The running config changed (workers, backend): thread-safe. */
void admin_console_reload(struct admin_console *ac, const struct conf *conf);

/* GET/HEAD path on the admin thread: 1 when the console serves it, with
 * its body, Content-Type and extra header lines (CRLF-terminated). */
int admin_console_serve(struct admin_console *ac, const char *path, size_t plen,
                        struct evbuffer *body, const char **type, const char **extra);

/* On a worker's thread, before it serves: its summary (fixed size). */
void admin_console_worker(int id);
/* A worker denied key[0..len) (a Redis key: PREFIX{ROUTE|LIMIT|PARTS}) of
 * limit `limit` of route `route`; prefix_len is PREFIX's length; bit i of
 * secret: part i is a credential, shown as "sha1:" and 12 hex digits of
 * its bytes (route_secret_parts). No-op off a worker thread. Never
 * allocates. */
void admin_console_denied(const char *route, const char *limit, size_t prefix_len,
                          const char *key, size_t len, unsigned secret);

/* Main thread: a config load (at start or SIGHUP) ended; err is the reason
 * of a failure (copied), took_us how long conf_load ran. */
void admin_console_config_loaded(int ok, const char *err, int64_t took_us);

/* Free the workers' summaries at exit (after every worker is joined). */
void admin_console_shutdown(void);

#endif
