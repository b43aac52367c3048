/* sluice - fuzz_admin_api.c: libFuzzer target for the admin API's parsers.
 *
 * A request to /api/limits/... goes through admin_api_serve as admin.c
 * hands it over: the head parsed by http1, the path cut at '?', the body
 * beside it. The API parses the path (route, limit, operation), the query
 * (key=V, %-escapes, '+'), the Authorization header, and a PUT's JSON body
 * (limit, rate, burst, ttl), then reads or writes a memory store: the
 * in-process backend, so no Redis is needed. The config (loaded once) has a
 * token, three algorithms, keys of one and two parts and a config override.
 *
 * Input: byte 0 picks the method (GET, HEAD, PUT, DELETE, POST, or a
 * fuzzed one), byte 1 bit 0 adds "Authorization: Bearer TOKEN"; then the
 * request target up to the first LF, then further header lines up to an
 * empty line, then the body. The request is gated (admin_api_gate: Host
 * names, the token on reads that show keys) and then served, as admin.c
 * does. Invariants: the status is one the API answers with, the answer is
 * a JSON object without a NUL, an error carries "error", and a write (or
 * any read, as every read here shows a key) succeeds only with the token in
 * the head. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include "admin_api.h"
#include "conf.h"
#include "http1.h"
#include "log.h"
#include "memstore.h"

#define fuzz_check(cond) do { if (!(cond)) { \
    fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
    abort(); } } while (0)

#define TOKEN "fuzz-token-0123456789"
#define MAX_HEAD 8192

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The store's parts that only Redis reaches (store_sync and the reset
 * subscriber link against them); with the memory backend never called, and
 * linking store.c would bring the whole Redis store and its scripts. */
struct conf_redis;
int store_same_conf(const struct conf_redis *a, const struct conf_redis *b);
const char *store_limit_script(void);
const char *store_part_reset_script(void);
int store_node_is_master(const void *reply);

int store_same_conf(const struct conf_redis *a, const struct conf_redis *b)
{
    abort();
}

const char *store_limit_script(void)
{
    abort();
}

const char *store_part_reset_script(void)
{
    abort();
}

int store_node_is_master(const void *reply)
{
    abort();
}

static const char config[] =
    "listen: 127.0.0.1:8080\n"
    "admin: { listen: 127.0.0.1:9901, token: " TOKEN " }\n"
    "upstreams:\n"
    "  api: { servers: [127.0.0.1:9000] }\n"
    "routes:\n"
    "  - name: r\n"
    "    match: { path: /r }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - name: fw\n"
    "        algorithm: fixed_window\n"
    "        limit: 2\n"
    "        window: 1h\n"
    "        key: [\"header:X-K\"]\n"
    "        overrides:\n"
    "          - { key: [vip], limit: 100 }\n"
    "      - { name: two, algorithm: sliding_log, limit: 5, window: 1h, key: [ip, \"query:q\"] }\n"
    "  - name: g\n"
    "    match: { path: /g }\n"
    "    upstream: api\n"
    "    limits:\n"
    "      - { name: gc, algorithm: gcra, rate: 10/m, burst: 3, key: [\"cookie:s\"] }\n"
    "      - { name: tb, algorithm: token_bucket, rate: 5/s, burst: 10, key: [ip] }\n"
    "backend: memory\n"
    "memory: { max_keys: 1000 }\n";

static struct conf *fuzz_conf;
static struct memstore *fuzz_mem;
static struct http1 *fuzz_parser;
static struct event_base *fuzz_base;
static struct admin_api *fuzz_api;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    char path[64], *err = NULL;
    log_set_level(LOG_ERROR);
    int fd = memfd_create("sluice-fuzz-admin-api", 0);
    fuzz_check(fd >= 0);
    fuzz_check(write(fd, config, sizeof(config) - 1) == (ssize_t)(sizeof(config) - 1));
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    fuzz_conf = conf_load(path, &err);
    if (fuzz_conf == NULL)
        fprintf(stderr, "fuzz_admin_api: %s\n", err);
    fuzz_check(fuzz_conf != NULL);
    close(fd);
    /* one store for the run: overrides and counts made by one input are
     * there for the next, as on a running admin endpoint (bounded by
     * max_keys) */
    fuzz_mem = memstore_create(1000);
    admin_api_set(fuzz_conf, fuzz_mem);
    fuzz_parser = http1_create(HTTP1_REQUEST);
    fuzz_check(fuzz_parser != NULL);
    fuzz_base = event_base_new();
    fuzz_check(fuzz_base != NULL);
    fuzz_api = admin_api_create(fuzz_base);
    return 0;
}

/* The line at *p (up to LF, CR dropped), *p moved past it. */
static size_t take_line(const uint8_t **p, const uint8_t *end, const uint8_t **line)
{
    const uint8_t *lf = memchr(*p, '\n', (size_t)(end - *p));
    const uint8_t *e = lf ? lf : end;
    *line = *p;
    *p = lf ? lf + 1 : end;
    size_t n = (size_t)(e - *line);
    if (n > 0 && (*line)[n - 1] == '\r')
        n--;
    return n;
}

static void answer_ok(int status, struct evbuffer *out, int authorized)
{
    fuzz_check(status == 200 || status == 400 || status == 401 || status == 403 ||
               status == 404 || status == 405 || status == 421 || status == 500 ||
               status == 503);
    size_t n = evbuffer_get_length(out);
    char *s = malloc(n + 1);
    fuzz_check(s != NULL);
    evbuffer_copyout(out, s, n);
    s[n] = '\0';
    fuzz_check(n >= 2 && s[0] == '{');
    fuzz_check(strlen(s) == n);         /* no NUL: JSON escapes every control byte */
    if (status >= 400)
        fuzz_check(strstr(s, "\"error\": ") != NULL);
    if (status >= 200 && status < 300)
        fuzz_check(authorized);     /* reads of keys need the token too */
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const methods[] = { "GET", "HEAD", "PUT", "DELETE", "POST" };
    if (size < 2)
        return 0;
    int m = data[0] % 6;
    int auth = data[1] & 1;
    const uint8_t *p = data + 2, *end = data + size, *line;
    char *head = malloc(MAX_HEAD);
    fuzz_check(head != NULL);

    size_t n = take_line(&p, end, &line), hl = 0;
    const char *method = m < 5 ? methods[m] : "PATCH";
    int w = snprintf(head, MAX_HEAD, "%s ", method);
    hl = (size_t)w;
    if (n > MAX_HEAD - 512)
        n = MAX_HEAD - 512;
    memcpy(head + hl, line, n);
    hl += n;
    hl += (size_t)snprintf(head + hl, MAX_HEAD - hl, " HTTP/1.1\r\nHost: 127.0.0.1:9901\r\n%s",
                           auth ? "Authorization: Bearer " TOKEN "\r\n" : "");
    while (p < end) {
        n = take_line(&p, end, &line);
        if (n == 0)
            break;
        if (hl + n + 64 > MAX_HEAD)
            break;
        memcpy(head + hl, line, n);
        hl += n;
        memcpy(head + hl, "\r\n", 2);
        hl += 2;
    }
    const char *body = (const char *)p;
    size_t blen = (size_t)(end - p) > ADMIN_API_MAX_BODY ? ADMIN_API_MAX_BODY : (size_t)(end - p);
    memcpy(head + hl, "\r\n", 2);
    hl += 2;

    /* an exactly sized copy, so ASan sees a read past the head */
    char *buf = malloc(hl);
    fuzz_check(buf != NULL);
    memcpy(buf, head, hl);
    free(head);
    struct http1_head h;
    if (http1_head_parse(fuzz_parser, buf, hl, MAX_HEAD, 0, &h) == 0) {
        const char *t = buf + h.target.off, *q = memchr(t, '?', h.target.len);
        size_t plen = q ? (size_t)(q - t) : h.target.len;
        size_t pre = strlen(ADMIN_API_PREFIX);
        /* admin.c hands over /api/limits and /api/limits/... only */
        if (plen >= pre && memcmp(t, ADMIN_API_PREFIX, pre) == 0 && (plen == pre || t[pre] == '/')) {
            char *b = malloc(blen ? blen : 1);
            fuzz_check(b != NULL);
            memcpy(b, body, blen);
            struct evbuffer *out = evbuffer_new(), *hdr = evbuffer_new();
            fuzz_check(out != NULL && hdr != NULL);
            /* admin.c gates every request first (Host names; the token on
             * reads that show keys), then serves; the memory backend never
             * leaves a request pending */
            struct admin_api_pending *pd = NULL;
            int status = admin_api_gate(buf, &h, 1, out, hdr);
            if (status == 0)
                status = admin_api_serve(fuzz_api, buf, &h, t, plen, b, blen, out, hdr, NULL,
                                         NULL, &pd);
            fuzz_check(status != ADMIN_API_PENDING && pd == NULL);
            answer_ok(status, out, memmem(buf, hl, TOKEN, strlen(TOKEN)) != NULL);
            evbuffer_free(out);
            evbuffer_free(hdr);
            free(b);
        }
    }
    free(buf);
    return 0;
}
