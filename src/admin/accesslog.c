/* sluice - accesslog.c: the JSON access log and its writer thread.
 *
 * Each thread that writes gets a slot: a chunk it appends lines to under the
 * slot's own lock (uncontended but for the writer's sweep). A full chunk goes
 * onto the log's queue and wakes the writer (a loop thread, loopthread.h);
 * the writer also sweeps partly filled chunks every 50 ms so no line waits
 * long. Written chunks return to a free list, so the
 * steady state allocates nothing. Lock order: slot, then log; the writer
 * never holds both. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <event2/event.h>

#include "accesslog.h"
#include "clock.h"
#include "esc.h"
#include "log.h"
#include "loopthread.h"
#include "mem.h"
#include "metrics.h"

#define ACCESSLOG_CHUNK_BYTES (64 * 1024)
#define ACCESSLOG_FREE_MAX 32           /* chunks kept for reuse */
#define ACCESSLOG_SWEEP_MS 50           /* longest a line waits in a slot */
#define ACCESSLOG_POLL_MS 100           /* writer's wait for a stuck reader */
#define ACCESSLOG_CLOSE_DRAIN_MS 2000   /* then close gives up on it */
#define ACCESSLOG_FIELD_MAX 8192        /* longer strings are cut, "..." added */
#define ACCESSLOG_REPORT_MS 1000        /* drop reports at most this often */

struct accesslog_chunk {
    struct accesslog_chunk *next;
    size_t len;
    size_t cap;
    char data[];
};

/* Owned by the log, freed by accesslog_close; one per writing thread. */
struct accesslog_slot {
    struct accesslog_slot *next;        /* immutable once published */
    pthread_t owner;
    pthread_mutex_t lock;               /* guards cur */
    struct accesslog_chunk *cur;
    char *scratch;                      /* owner only: the line being formatted */
    size_t scratch_cap;
};

struct accesslog {
    uint64_t id;                        /* process-unique, keys the thread cache */
    char *path;                         /* NULL for stdout */
    int fd;                             /* the writer's after open */
    int fd_regular;                     /* a regular file: writes never wait */
    int64_t last_error_ms;              /* writer only: error log rate limit */
    int64_t give_up_ms;                 /* writer only: closing, stuck reader */
    uint64_t reported;                  /* writer only: drops already logged */
    int64_t last_report_ms;             /* writer only */
    struct loopthread *writer;
    struct event *sweep_ev;             /* every ACCESSLOG_SWEEP_MS */
    struct event *wake_ev;              /* activated when a chunk is queued */
    pthread_mutex_t lock;               /* guards everything below but reopen */
    struct accesslog_chunk *queue;      /* full chunks, oldest first */
    struct accesslog_chunk **queue_tail;
    struct accesslog_chunk *free_chunks;
    int nfree;
    size_t pending_bytes;               /* queued plus being written */
    size_t max_pending_bytes;
    struct accesslog_slot *slots;
    int stopping;
    uint64_t dropped;
    atomic_int reopen;                  /* set from a signal handler */
};

static atomic_uint_fast64_t accesslog_next_id = 1;

/* The calling thread's slot for the log it wrote to last. */
static _Thread_local struct {
    uint64_t log_id;
    struct accesslog_slot *slot;
} accesslog_tls;

static char *accesslog_errf(const char *what, const char *target, int errnum)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "accesslog: %s '%s': %s", what, target, strerror(errnum));
    return mem_strndup(buf, strlen(buf));
}

/* ---- formatting */

/* Worst case for one string: every byte becomes \u00XX, plus quotes. */
static size_t accesslog_str_bound(const char *s, size_t len)
{
    if (s == NULL)
        return 4;
    if (len > ACCESSLOG_FIELD_MAX)
        len = ACCESSLOG_FIELD_MAX + 3;
    return len * 6 + 2;
}

static size_t accesslog_cstr_len(const char *s)
{
    return s ? strnlen(s, ACCESSLOG_FIELD_MAX + 1) : 0;
}

static char *accesslog_put(char *p, const char *s, size_t len)
{
    memcpy(p, s, len);
    return p + len;
}

#define ACCESSLOG_PUT_LIT(p, lit) accesslog_put((p), (lit), sizeof(lit) - 1)

static char *accesslog_put_u64(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static char *accesslog_put_i64(char *p, int64_t v)
{
    if (v < 0) {
        *p++ = '-';
        return accesslog_put_u64(p, (uint64_t)0 - (uint64_t)v);
    }
    return accesslog_put_u64(p, (uint64_t)v);
}

/* Seconds with microseconds: 512 -> "0.000512"; negative -> null. */
static char *accesslog_put_seconds(char *p, int64_t usec)
{
    if (usec < 0)
        return ACCESSLOG_PUT_LIT(p, "null");
    p = accesslog_put_u64(p, (uint64_t)usec / 1000000);
    *p++ = '.';
    uint64_t frac = (uint64_t)usec % 1000000;
    for (uint64_t div = 100000; div; div /= 10)
        *p++ = (char)('0' + frac / div % 10);
    return p;
}

/* JSON string; bytes >= 0x80 are escaped one by one, so a line is valid
 * JSON and plain ASCII whatever the client sent. */
static char *accesslog_put_str(char *p, const char *s, size_t len)
{
    if (s == NULL)
        return ACCESSLOG_PUT_LIT(p, "null");
    int cut = len > ACCESSLOG_FIELD_MAX;
    if (cut)
        len = ACCESSLOG_FIELD_MAX;
    *p++ = '"';
    p = esc_put(p, s, len, ESC_JSON);
    if (cut)
        p = ACCESSLOG_PUT_LIT(p, "...");
    *p++ = '"';
    return p;
}

/* RFC 3339 UTC with milliseconds; the seconds part is cached per thread
 * because consecutive lines almost always share it. */
static char *accesslog_put_time(char *p, int64_t time_us)
{
    static _Thread_local int64_t cached_sec = -1;
    static _Thread_local char cached[64];
    if (time_us < 0)
        time_us = 0;
    int64_t sec = time_us / 1000000;
    if (sec != cached_sec) {
        time_t t = (time_t)sec;
        struct tm tm;
        memset(&tm, 0, sizeof(tm));
        if (gmtime_r(&t, &tm) == NULL)
            tm.tm_mday = 1;     /* past year 2^31: keep the shape, not the date */
        snprintf(cached, sizeof(cached), "%04d-%02d-%02dT%02d:%02d:%02d",
                 (tm.tm_year + 1900) % 10000, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec);
        cached_sec = sec;
    }
    int ms = (int)(time_us % 1000000 / 1000);
    *p++ = '"';
    p = accesslog_put(p, cached, 19);
    *p++ = '.';
    *p++ = (char)('0' + ms / 100);
    *p++ = (char)('0' + ms / 10 % 10);
    *p++ = (char)('0' + ms % 10);
    *p++ = 'Z';
    *p++ = '"';
    return p;
}

size_t accesslog_format(const struct accesslog_entry *e, char *buf, size_t cap)
{
    const char *decision = e->decision ? e->decision : "none";
    size_t route_len = accesslog_cstr_len(e->route);
    size_t limit_len = accesslog_cstr_len(e->limit);
    size_t decision_len = accesslog_cstr_len(decision);

    /* Keys, punctuation, the time and six numbers of at most 21 bytes each
     * fit in 512 bytes; the strings are bounded separately. */
    size_t bound = 512
        + accesslog_str_bound(e->client, e->client_len)
        + accesslog_str_bound(e->method, e->method_len)
        + accesslog_str_bound(e->path, e->path_len)
        + accesslog_str_bound(e->route, route_len)
        + accesslog_str_bound(decision, decision_len)
        + accesslog_str_bound(e->limit, limit_len)
        + accesslog_str_bound(e->request_id, e->request_id_len)
        + accesslog_str_bound(e->tls ? e->tls : "", accesslog_cstr_len(e->tls));
    if (cap < bound)
        return bound;

    char *p = buf;
    p = ACCESSLOG_PUT_LIT(p, "{\"time\":");
    p = accesslog_put_time(p, e->time_us);
    p = ACCESSLOG_PUT_LIT(p, ",\"client\":");
    p = accesslog_put_str(p, e->client, e->client_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"method\":");
    p = accesslog_put_str(p, e->method, e->method_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"path\":");
    p = accesslog_put_str(p, e->path, e->path_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"status\":");
    p = accesslog_put_i64(p, e->status);
    p = ACCESSLOG_PUT_LIT(p, ",\"route\":");
    p = accesslog_put_str(p, e->route, route_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"decision\":");
    p = accesslog_put_str(p, decision, decision_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"limit\":");
    p = accesslog_put_str(p, e->limit, limit_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"remaining\":");
    if (e->remaining < 0)
        p = ACCESSLOG_PUT_LIT(p, "null");
    else
        p = accesslog_put_i64(p, e->remaining);
    p = ACCESSLOG_PUT_LIT(p, ",\"upstream_time\":");
    p = accesslog_put_seconds(p, e->upstream_us);
    p = ACCESSLOG_PUT_LIT(p, ",\"total_time\":");
    p = accesslog_put_seconds(p, e->total_us < 0 ? 0 : e->total_us);
    p = ACCESSLOG_PUT_LIT(p, ",\"bytes_in\":");
    p = accesslog_put_u64(p, e->bytes_in);
    p = ACCESSLOG_PUT_LIT(p, ",\"bytes_out\":");
    p = accesslog_put_u64(p, e->bytes_out);
    p = ACCESSLOG_PUT_LIT(p, ",\"request_id\":");
    p = accesslog_put_str(p, e->request_id, e->request_id_len);
    p = ACCESSLOG_PUT_LIT(p, ",\"tls\":");
    p = accesslog_put_str(p, e->tls ? e->tls : "", accesslog_cstr_len(e->tls));
    if (e->delay_ms > 0) {
        p = ACCESSLOG_PUT_LIT(p, ",\"delay_ms\":");
        p = accesslog_put_i64(p, e->delay_ms);
    }
    if (e->key_fallback)
        p = ACCESSLOG_PUT_LIT(p, ",\"key_fallback\":true");
    if (e->has_cost) {
        p = ACCESSLOG_PUT_LIT(p, ",\"cost\":");
        p = accesslog_put_i64(p, e->cost);
    }
    if (e->has_grpc_status) {
        p = ACCESSLOG_PUT_LIT(p, ",\"grpc_status\":");
        p = accesslog_put_i64(p, e->grpc_status);
    }
    if (e->http2)
        p = ACCESSLOG_PUT_LIT(p, ",\"protocol\":\"HTTP/2.0\"");
    if (e->decision_mode)
        p = ACCESSLOG_PUT_LIT(p, ",\"mode\":\"decision\"");
    p = ACCESSLOG_PUT_LIT(p, "}\n");
    if ((size_t)(p - buf) > bound)
        abort();        /* the bound above is wrong: never write past it */
    return (size_t)(p - buf);
}

/* ---- chunks and slots */

static struct accesslog_chunk *accesslog_chunk_new(size_t cap)
{
    struct accesslog_chunk *c = mem_alloc(sizeof(*c) + cap);
    c->next = NULL;
    c->len = 0;
    c->cap = cap;
    return c;
}

static size_t accesslog_count_lines(const char *data, size_t len)
{
    size_t n = 0;
    const char *end = data + len;
    while (data < end && (data = memchr(data, '\n', (size_t)(end - data))) != NULL) {
        n++;
        data++;
    }
    return n;
}

/* Log lock held. Keeps ordinary chunks for reuse, frees the rest. */
static void accesslog_recycle_locked(struct accesslog *log, struct accesslog_chunk *c)
{
    if (c->cap == ACCESSLOG_CHUNK_BYTES && log->nfree < ACCESSLOG_FREE_MAX) {
        c->len = 0;
        c->next = log->free_chunks;
        log->free_chunks = c;
        log->nfree++;
    } else {
        free(c);
    }
}

static struct accesslog_slot *accesslog_slot_find(struct accesslog *log)
{
    if (accesslog_tls.log_id == log->id)
        return accesslog_tls.slot;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&log->lock);
    struct accesslog_slot *s;
    for (s = log->slots; s != NULL; s = s->next)
        if (pthread_equal(s->owner, self))
            break;
    if (s == NULL) {
        s = mem_calloc(1, sizeof(*s));
        s->owner = self;
        pthread_mutex_init(&s->lock, NULL);
        s->next = log->slots;
        log->slots = s;
    }
    pthread_mutex_unlock(&log->lock);
    accesslog_tls.log_id = log->id;
    accesslog_tls.slot = s;
    return s;
}

/* Slot lock held; s->cur cannot take need more bytes. Queues the current
 * chunk and installs one with room. Returns 0, or -1 when the writer is too
 * far behind (the line is then dropped and counted). */
static int accesslog_slot_rotate(struct accesslog *log, struct accesslog_slot *s, size_t need)
{
    struct accesslog_chunk *c = s->cur;
    struct accesslog_chunk *fresh = NULL;
    pthread_mutex_lock(&log->lock);
    if (c != NULL && c->len > 0) {
        /* One chunk may always wait, so even a tiny bound makes progress. */
        if (log->pending_bytes > 0
            && log->pending_bytes + c->len > log->max_pending_bytes) {
            log->dropped++;
            pthread_mutex_unlock(&log->lock);
            metrics_count(METRICS_ACCESS_LOG_DROPPED);
            return -1;
        }
        log->pending_bytes += c->len;
        *log->queue_tail = c;
        log->queue_tail = &c->next;
        event_active(log->wake_ev, EV_TIMEOUT, 0);
    } else if (c != NULL) {
        accesslog_recycle_locked(log, c);       /* empty but too small */
    }
    s->cur = NULL;
    if (need <= ACCESSLOG_CHUNK_BYTES && log->free_chunks != NULL) {
        fresh = log->free_chunks;
        log->free_chunks = fresh->next;
        log->nfree--;
        fresh->next = NULL;
    }
    pthread_mutex_unlock(&log->lock);
    if (fresh == NULL)
        fresh = accesslog_chunk_new(need > ACCESSLOG_CHUNK_BYTES ? need : ACCESSLOG_CHUNK_BYTES);
    s->cur = fresh;
    return 0;
}

void accesslog_write(struct accesslog *log, const struct accesslog_entry *e)
{
    if (log == NULL || e == NULL)
        return;
    struct accesslog_slot *s = accesslog_slot_find(log);
    size_t n = accesslog_format(e, s->scratch, s->scratch_cap);
    if (n > s->scratch_cap) {
        free(s->scratch);
        s->scratch_cap = n < 4096 ? 4096 : n;
        s->scratch = mem_alloc(s->scratch_cap);
        n = accesslog_format(e, s->scratch, s->scratch_cap);
    }
    pthread_mutex_lock(&s->lock);
    if ((s->cur == NULL || s->cur->cap - s->cur->len < n)
        && accesslog_slot_rotate(log, s, n) < 0) {
        pthread_mutex_unlock(&s->lock);
        return;
    }
    memcpy(s->cur->data + s->cur->len, s->scratch, n);
    s->cur->len += n;
    pthread_mutex_unlock(&s->lock);
}

/* ---- the writer thread */

static int accesslog_fd_regular(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

static int accesslog_is_stopping(struct accesslog *log)
{
    pthread_mutex_lock(&log->lock);
    int stopping = log->stopping;
    pthread_mutex_unlock(&log->lock);
    return stopping;
}

static uint64_t accesslog_log_dropped(struct accesslog *log)
{
    pthread_mutex_lock(&log->lock);
    uint64_t n = log->dropped;
    pthread_mutex_unlock(&log->lock);
    return n;
}

/* Says once a second how many lines were lost since the last report. */
static void accesslog_report_drops(struct accesslog *log, uint64_t *reported, int64_t *last_ms)
{
    int64_t now = clock_ms();
    if (now - *last_ms < ACCESSLOG_REPORT_MS)
        return;
    uint64_t dropped = accesslog_log_dropped(log);
    if (dropped != *reported) {
        log_warn("accesslog: dropped %llu lines in the last second: writer behind "
                 "or output failing", (unsigned long long)(dropped - *reported));
        *reported = dropped;
    }
    *last_ms = now;
}

/* Writes one chunk, waiting for a slow reader in short polls so the thread
 * still notices a close. Returns how many bytes were written; fewer than
 * len means the rest is to be dropped (write error, or closing and the
 * reader stayed stuck past the drain time). */
static size_t accesslog_write_chunk(struct accesslog *log, const char *data, size_t len,
                                    uint64_t *reported, int64_t *last_report_ms)
{
    size_t done = 0;
    while (done < len) {
        int past_drain = log->give_up_ms >= 0 && clock_ms() >= log->give_up_ms;
        struct pollfd pfd = { .fd = log->fd, .events = POLLOUT };
        int r = poll(&pfd, 1, past_drain ? 0 : ACCESSLOG_POLL_MS);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0) {
            if (past_drain)
                break;
            accesslog_report_drops(log, reported, last_report_ms);
            if (log->give_up_ms < 0 && accesslog_is_stopping(log))
                log->give_up_ms = clock_ms() + ACCESSLOG_CLOSE_DRAIN_MS;
            continue;
        }
        /* POLLOUT promises room for PIPE_BUF bytes on a pipe, so a write of
         * that size cannot block; a regular file takes the whole rest. */
        size_t n = len - done;
        if (n > PIPE_BUF && !log->fd_regular)
            n = PIPE_BUF;
        ssize_t w = write(log->fd, data + done, n);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            int64_t now = clock_ms();
            if (now - log->last_error_ms >= ACCESSLOG_REPORT_MS) {
                log_error("accesslog: write to '%s' failed: %s; dropping lines",
                          log->path ? log->path : "stdout", strerror(errno));
                log->last_error_ms = now;
            }
            break;
        }
        done += (size_t)w;
    }
    return done;
}

static void accesslog_do_reopen(struct accesslog *log)
{
    if (log->path == NULL)
        return;
    int fd = open(log->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0640);
    if (fd < 0) {
        log_error("accesslog: reopen '%s' failed: %s; still writing to the old file",
                  log->path, strerror(errno));
        return;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    close(log->fd);
    log->fd = fd;
    log->fd_regular = accesslog_fd_regular(fd);
    log_info("accesslog: reopened '%s'", log->path);
}

/* Queues every slot's partly filled chunk behind its full ones, so each
 * thread's lines stay in order. The slot list only grows at its head, so
 * walking it from a snapshot of the head is safe. Lock order as the
 * workers': slot, then log. */
static void accesslog_sweep(struct accesslog *log)
{
    pthread_mutex_lock(&log->lock);
    struct accesslog_slot *s = log->slots;
    pthread_mutex_unlock(&log->lock);
    for (; s != NULL; s = s->next) {
        pthread_mutex_lock(&s->lock);
        struct accesslog_chunk *c = s->cur;
        if (c != NULL && c->len > 0) {
            s->cur = NULL;
            pthread_mutex_lock(&log->lock);
            log->pending_bytes += c->len;
            *log->queue_tail = c;
            log->queue_tail = &c->next;
            pthread_mutex_unlock(&log->lock);
        }
        pthread_mutex_unlock(&s->lock);
    }
}

/* One round of the writer: reopen when asked, queue every slot's lines,
 * write the queue. Returns 1 when the log is closing and nothing is left. */
static int accesslog_writer_round(struct accesslog *log)
{
    int stopping = accesslog_is_stopping(log);
    if (atomic_exchange(&log->reopen, 0))
        accesslog_do_reopen(log);
    accesslog_sweep(log);

    pthread_mutex_lock(&log->lock);
    struct accesslog_chunk *batch = log->queue;
    log->queue = NULL;
    log->queue_tail = &log->queue;
    pthread_mutex_unlock(&log->lock);

    uint64_t lost = 0;
    size_t written = 0;
    for (struct accesslog_chunk *c = batch; c != NULL; c = c->next) {
        size_t done = accesslog_write_chunk(log, c->data, c->len, &log->reported,
                                            &log->last_report_ms);
        if (done < c->len)
            lost += accesslog_count_lines(c->data + done, c->len - done);
        written += c->len;
    }

    pthread_mutex_lock(&log->lock);
    log->pending_bytes -= written;
    log->dropped += lost;
    if (lost)
        metrics_add(METRICS_ACCESS_LOG_DROPPED, lost);
    while (batch != NULL) {
        struct accesslog_chunk *next = batch->next;
        accesslog_recycle_locked(log, batch);
        batch = next;
    }
    int done = stopping && log->queue == NULL;
    pthread_mutex_unlock(&log->lock);

    accesslog_report_drops(log, &log->reported, &log->last_report_ms);
    return done;
}

static void accesslog_writer_cb(evutil_socket_t fd, short what, void *arg)
{
    accesslog_writer_round(arg);
}

/* The writer's last work, on its thread: writers are gone once stopping is
 * set (the caller's promise), so the sweep after it takes the last lines. */
static void accesslog_writer_stop(void *arg)
{
    struct accesslog *log = arg;
    while (!accesslog_writer_round(log))
        ;
    uint64_t dropped = accesslog_log_dropped(log);
    if (dropped != log->reported)
        log_warn("accesslog: dropped %llu lines at close",
                 (unsigned long long)(dropped - log->reported));
}

/* ---- life cycle */

/* The writer's events and thread (stopped already, or never started). */
static void accesslog_writer_free(struct accesslog *log)
{
    if (log->sweep_ev)
        event_free(log->sweep_ev);
    if (log->wake_ev)
        event_free(log->wake_ev);
    loopthread_destroy(log->writer);
}

static int accesslog_open_fd(const char *target, char **path, char **err)
{
    if (strcmp(target, "stdout") == 0) {
        *path = NULL;
        return STDOUT_FILENO;
    }
    /* O_NONBLOCK only for the open itself: a FIFO without a reader fails
     * with ENXIO instead of hanging start-up. */
    int fd = open(target, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0640);
    if (fd < 0) {
        *err = accesslog_errf("cannot open", target, errno);
        return -1;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *path = mem_strndup(target, strlen(target));
    return fd;
}

struct accesslog *accesslog_open_bounded(const char *target, size_t max_pending_bytes,
                                         char **err)
{
    *err = NULL;
    if (target == NULL || target[0] == '\0') {
        *err = mem_strndup("accesslog: empty target", 23);
        return NULL;
    }
    char *path = NULL;
    int fd = accesslog_open_fd(target, &path, err);
    if (fd < 0)
        return NULL;

    struct accesslog *log = mem_calloc(1, sizeof(*log));
    log->id = atomic_fetch_add(&accesslog_next_id, 1);
    log->path = path;
    log->fd = fd;
    log->fd_regular = accesslog_fd_regular(fd);
    log->last_error_ms = clock_ms() - ACCESSLOG_REPORT_MS;
    log->give_up_ms = -1;
    log->last_report_ms = clock_ms();
    log->queue_tail = &log->queue;
    log->max_pending_bytes = max_pending_bytes;
    atomic_init(&log->reopen, 0);
    pthread_mutex_init(&log->lock, NULL);

    /* The writer blocks every signal (loopthread.h), so SIGPIPE from a
     * vanished reader becomes EPIPE and no handler ever runs on it. */
    int rc = ENOMEM;
    log->writer = loopthread_create(accesslog_writer_stop, log);
    if (log->writer != NULL) {
        struct event_base *base = loopthread_base(log->writer);
        struct timeval sweep = { 0, ACCESSLOG_SWEEP_MS * 1000 };
        log->sweep_ev = event_new(base, -1, EV_PERSIST, accesslog_writer_cb, log);
        log->wake_ev = event_new(base, -1, 0, accesslog_writer_cb, log);
        if (log->sweep_ev != NULL && log->wake_ev != NULL && event_add(log->sweep_ev, &sweep) == 0)
            rc = loopthread_start(log->writer);
    }
    if (rc != 0) {
        *err = accesslog_errf("cannot start writer for", target, rc);
        goto fail;
    }
    return log;

fail:
    accesslog_writer_free(log);
    pthread_mutex_destroy(&log->lock);
    if (log->path != NULL)
        close(log->fd);
    free(log->path);
    free(log);
    return NULL;
}

struct accesslog *accesslog_open(const char *target, char **err)
{
    return accesslog_open_bounded(target, ACCESSLOG_MAX_PENDING_DEFAULT, err);
}

void accesslog_close(struct accesslog *log)
{
    if (log == NULL)
        return;
    pthread_mutex_lock(&log->lock);
    log->stopping = 1;
    pthread_mutex_unlock(&log->lock);
    loopthread_stop(log->writer);       /* accesslog_writer_stop, then joined */
    accesslog_writer_free(log);

    struct accesslog_slot *s = log->slots;
    while (s != NULL) {
        struct accesslog_slot *next = s->next;
        free(s->cur);
        free(s->scratch);
        pthread_mutex_destroy(&s->lock);
        free(s);
        s = next;
    }
    struct accesslog_chunk *c = log->free_chunks;
    while (c != NULL) {
        struct accesslog_chunk *next = c->next;
        free(c);
        c = next;
    }
    if (log->path != NULL)
        close(log->fd);
    pthread_mutex_destroy(&log->lock);
    free(log->path);
    free(log);
}

void accesslog_reopen(struct accesslog *log)
{
    if (log != NULL)
        atomic_store(&log->reopen, 1);
}

uint64_t accesslog_dropped(void)
{
    return metrics_counter_get(METRICS_ACCESS_LOG_DROPPED);
}

