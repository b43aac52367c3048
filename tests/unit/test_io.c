/* sluice - test_io.c: the connection I/O layer (io.c).
 *
 * Against real sockets (AF_UNIX socket pairs, a refused TCP port) on the
 * test's own libevent base, plain and TLS (a self-signed P-256 certificate
 * made here): reads reach the input and the read callback, a read mark
 * stops reading without spinning on the still-readable socket and io_flush
 * resumes it, a full socket arms the write event until the output drains
 * (drained callback), an end is reported once (also behind unread bytes,
 * by the end watch), a refused connect comes
 * from the loop, io_free inside the io's own callback, and over TLS a
 * handshake, many records in one segment, and 1 MB both ways through
 * full sockets. Every wait is bounded. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <cmocka.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "clock.h"
#include "io.h"

static struct event_base *base;

/* What an io's callbacks saw. */
struct seen {
    int reads, drained, events;
    short last;
    int free_in_read;           /* io_free from the read callback */
};

static void read_cb(struct io *io, void *arg)
{
    struct seen *s = arg;
    s->reads++;
    if (s->free_in_read)
        io_free(io);
}

static void drained_cb(struct io *io, void *arg)
{
    ((struct seen *)arg)->drained++;
}

static void event_cb(struct io *io, short what, void *arg)
{
    struct seen *s = arg;
    s->events++;
    s->last = what;
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

/* Run the loop until *flag is set or ms pass; returns loop iterations. */
static int loop_until(const int *flag, int64_t ms)
{
    int64_t end = clock_ms() + ms;
    int n = 0;
    struct timeval tv = clock_timeval(5);
    struct event *tick = evtimer_new(base, tick_cb, NULL);
    while ((flag == NULL || !*flag) && clock_ms() < end) {
        evtimer_add(tick, &tv);
        event_base_loop(base, EVLOOP_ONCE);
        n++;
    }
    event_free(tick);
    return n;
}

/* Iterations of the loop within ms, each waking at least every 5 ms: about
 * ms / 5 when nothing is active, thousands on a spin. */
static int loop_count(int64_t ms)
{
    int64_t end = clock_ms() + ms;
    int n = 0;
    struct timeval tv = clock_timeval(5);
    struct event *tick = evtimer_new(base, tick_cb, NULL);
    while (clock_ms() < end) {
        evtimer_add(tick, &tv);
        event_base_loop(base, EVLOOP_ONCE);
        n++;
    }
    event_free(tick);
    return n;
}

/* ---- plain --------------------------------------------------------------- */

static void test_read_and_flush(void **state)
{
    int sv[2];
    pair(sv);
    struct seen s = { 0 };
    struct io *io = io_new(base, sv[0], NULL);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    io_enable(io, EV_READ);
    assert_int_equal(write(sv[1], "hello", 5), 5);
    loop_count(20);
    assert_true(s.reads >= 1);
    assert_int_equal(evbuffer_get_length(io_input(io)), 5);
    assert_memory_equal(evbuffer_pullup(io_input(io), 5), "hello", 5);
    evbuffer_add(io_output(io), "world", 5);
    io_flush(io);               /* written now, no loop needed */
    char buf[16];
    assert_int_equal(read(sv[1], buf, sizeof(buf)), 5);
    assert_memory_equal(buf, "world", 5);
    assert_int_equal(s.events, 0);
    io_free(io);
    close(sv[1]);
}

static char junk[5000];

/* An io over a new pair, its reading stopped at a mark of 1000 bytes with
 * 4000 more waiting in the socket. */
static struct io *io_at_mark(int sv[2], struct seen *s)
{
    pair(sv);
    struct io *io = io_new(base, sv[0], NULL);
    io_setcb(io, read_cb, NULL, event_cb, s);
    io_setwatermark(io, EV_READ, 1000);
    io_enable(io, EV_READ);
    assert_int_equal(write(sv[1], junk, sizeof(junk)), (ssize_t)sizeof(junk));
    loop_count(20);
    return io;
}

static void test_read_mark_stops_without_spin(void **state)
{
    int sv[2];
    struct seen s = { 0 };
    struct io *io = io_at_mark(sv, &s);
    size_t len = evbuffer_get_length(io_input(io));
    assert_int_equal(len, 1000);    /* never more than the mark allows */
    int reads = s.reads;
    /* the socket stays readable: a spin would loop thousands of times */
    assert_true(loop_count(100) < 60);
    assert_int_equal(s.reads, reads);
    evbuffer_drain(io_input(io), len);
    io_flush(io);               /* the layer above took the input: read on */
    loop_count(20);
    assert_int_equal(evbuffer_get_length(io_input(io)), 1000);
    io_free(io);
    close(sv[1]);
}

static void test_full_socket_arms_write_until_drained(void **state)
{
    int sv[2];
    pair(sv);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    struct seen s = { 0 };
    struct io *io = io_new(base, sv[0], NULL);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    io_setwatermark(io, EV_WRITE, 0);
    size_t total = 1 << 20;
    char *big = malloc(total);
    for (size_t i = 0; i < total; i++)
        big[i] = (char)(i * 7);
    evbuffer_add(io_output(io), big, total);
    io_flush(io);
    assert_true(evbuffer_get_length(io_output(io)) > 0);   /* the socket is full */
    char *got = malloc(total);
    size_t n = 0;
    int64_t end = clock_ms() + 3000;
    while (n < total && clock_ms() < end) {
        ssize_t r = read(sv[1], got + n, total - n);
        if (r > 0)
            n += (size_t)r;
        loop_count(1);
    }
    assert_int_equal(n, total);
    assert_memory_equal(got, big, total);
    assert_int_equal(evbuffer_get_length(io_output(io)), 0);
    assert_true(s.drained >= 1);
    assert_true(loop_count(50) < 30);   /* the write event went with the output */
    free(big);
    free(got);
    io_free(io);
    close(sv[1]);
}

static void test_eof_reported_once(void **state)
{
    int sv[2];
    pair(sv);
    struct seen s = { 0 };
    struct io *io = io_new(base, sv[0], NULL);
    io_setcb(io, read_cb, NULL, event_cb, &s);
    io_enable(io, EV_READ);
    assert_int_equal(write(sv[1], "bye", 3), 3);
    close(sv[1]);
    loop_count(30);
    assert_int_equal(evbuffer_get_length(io_input(io)), 3);
    assert_int_equal(s.events, 1);
    assert_int_equal(s.last, IO_EOF | IO_READING);
    assert_true(loop_count(50) < 30);   /* EOF stays readable: not re-armed */
    assert_int_equal(s.events, 1);
    io_free(io);
}

/* Reading stopped at the mark with bytes still in the socket: the end
 * watch tells the peer's end at once, once, and nothing for more bytes. */
static void test_end_watch_sees_an_end_behind_unread_bytes(void **state)
{
    int sv[2];
    struct seen s = { 0 };
    struct io *io = io_at_mark(sv, &s);
    io_watch_end(io, 1);
    assert_int_equal(write(sv[1], junk, 100), 100);
    assert_true(loop_count(100) < 60);      /* more bytes: no spin, no event */
    assert_int_equal(s.events, 0);
    assert_int_equal(shutdown(sv[1], SHUT_WR), 0);
    loop_count(30);
    assert_int_equal(s.events, 1);
    assert_int_equal(s.last, IO_EOF | IO_READING);
    assert_int_equal(evbuffer_get_length(io_input(io)), 1000);  /* the rest unread */
    assert_true(loop_count(50) < 30);
    assert_int_equal(s.events, 1);
    io_free(io);
    close(sv[1]);
}

static void test_free_inside_read_callback(void **state)
{
    int sv[2];
    pair(sv);
    struct seen s = { .free_in_read = 1 };
    struct io *io = io_new(base, sv[0], NULL);
    io_setcb(io, read_cb, NULL, event_cb, &s);
    io_enable(io, EV_READ);
    assert_int_equal(write(sv[1], "x", 1), 1);
    loop_count(20);
    assert_int_equal(s.reads, 1);       /* freed when the callback returned */
    char c;
    assert_int_equal(read(sv[1], &c, 1), 0);    /* our end is closed */
    close(sv[1]);
}

static void test_connect_refused_from_loop(void **state)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(sa);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, len), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &len), 0);
    close(l);                   /* nothing listens there now */
    struct seen s = { 0 };
    struct io *io = io_new(base, -1, NULL);
    io_setcb(io, read_cb, NULL, event_cb, &s);
    assert_int_equal(io_connect(io, (struct sockaddr *)&sa, len, 1000), 0);
    assert_int_equal(s.events, 0);      /* never from inside io_connect */
    loop_until(&s.events, 1000);
    assert_int_equal(s.events, 1);
    assert_true(s.last & IO_ERROR);
    assert_int_equal(io_errno(io), ECONNREFUSED);
    assert_false(io_connected(io));
    io_free(io);
}

/* ---- TLS ----------------------------------------------------------------- */

static SSL_CTX *server_ctx, *client_ctx;

static void tls_contexts(void)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    assert_non_null(key);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               (const unsigned char *)"io.test", -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(x));
    assert_true(X509_sign(x, key, EVP_sha256()) > 0);
    server_ctx = SSL_CTX_new(TLS_server_method());
    assert_int_equal(SSL_CTX_use_certificate(server_ctx, x), 1);
    assert_int_equal(SSL_CTX_use_PrivateKey(server_ctx, key), 1);
    client_ctx = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_NONE, NULL);
    X509_free(x);
    EVP_PKEY_free(key);
}

/* A server io on sv[0] and a client io on sv[1], handshake done. */
static void tls_pair(struct io **srv, struct io **cli, struct seen *ss, struct seen *cs)
{
    int sv[2];
    pair(sv);
    *srv = io_new(base, sv[0], SSL_new(server_ctx));
    io_setcb(*srv, read_cb, drained_cb, event_cb, ss);
    io_enable(*srv, EV_READ);
    /* The client side of a handshake over an accepted-style io: switch the
     * role and send the ClientHello; the events do the rest. */
    *cli = io_new(base, sv[1], SSL_new(client_ctx));
    io_setcb(*cli, read_cb, drained_cb, event_cb, cs);
    io_enable(*cli, EV_READ);
    SSL_set_connect_state(io_ssl(*cli));
    assert_int_equal(SSL_do_handshake(io_ssl(*cli)), -1);     /* wants the reply */
    int64_t end = clock_ms() + 3000;
    while (!(io_connected(*srv) && io_connected(*cli)) && clock_ms() < end)
        loop_count(1);
    assert_true(io_connected(*srv));
    assert_true(io_connected(*cli));
    assert_true(ss->last & IO_CONNECTED);
    assert_true(cs->last & IO_CONNECTED);
}

static void test_tls_records_in_one_segment(void **state)
{
    struct io *srv, *cli;
    struct seen ss = { 0 }, cs = { 0 };
    tls_pair(&srv, &cli, &ss, &cs);
    /* 50 records, flushed as one: one socket read takes many, OpenSSL
     * holds the rest and no readiness event will come for them. */
    char rec[64];
    for (int i = 0; i < 50; i++) {
        int n = snprintf(rec, sizeof(rec), "record %02d;", i);
        assert_int_equal(SSL_write(io_ssl(cli), rec, n), n);
    }
    loop_count(50);
    size_t len = evbuffer_get_length(io_input(srv));
    assert_int_equal(len, 50 * 10);
    assert_memory_equal(evbuffer_pullup(io_input(srv), -1), "record 00;record 01;", 20);
    io_free(srv);
    io_free(cli);
}

static void test_tls_megabyte_both_ways_through_full_sockets(void **state)
{
    struct io *srv, *cli;
    struct seen ss = { 0 }, cs = { 0 };
    tls_pair(&srv, &cli, &ss, &cs);
    size_t total = 1 << 20;
    char *big = malloc(total);
    for (size_t i = 0; i < total; i++)
        big[i] = (char)(i * 13 + 1);
    evbuffer_add(io_output(srv), big, total);
    evbuffer_add(io_output(cli), big, total);
    io_setwatermark(srv, EV_READ, 64 * 1024);   /* and reading in bounded steps */
    io_flush(srv);
    io_flush(cli);
    struct evbuffer *got = evbuffer_new();
    int64_t end = clock_ms() + 5000;
    while ((evbuffer_get_length(got) < total ||
            evbuffer_get_length(io_input(cli)) < total) && clock_ms() < end) {
        assert_true(evbuffer_get_length(io_input(srv)) <= 64 * 1024);
        evbuffer_add_buffer(got, io_input(srv));
        io_flush(srv);      /* the input was taken: reading resumes */
        io_flush(cli);
        loop_count(1);
    }
    assert_int_equal(evbuffer_get_length(got), total);
    assert_memory_equal(evbuffer_pullup(got, -1), big, total);
    assert_int_equal(evbuffer_get_length(io_input(cli)), total);
    assert_memory_equal(evbuffer_pullup(io_input(cli), -1), big, total);
    assert_int_equal(ss.last & (IO_ERROR | IO_EOF), 0);
    assert_int_equal(cs.last & (IO_ERROR | IO_EOF), 0);
    evbuffer_free(got);
    free(big);
    io_free(srv);
    io_free(cli);
}

static void test_tls_close_notify_is_eof(void **state)
{
    struct io *srv, *cli;
    struct seen ss = { 0 }, cs = { 0 };
    tls_pair(&srv, &cli, &ss, &cs);
    evbuffer_add(io_output(cli), "last", 4);
    io_flush(cli);
    io_free(cli);               /* sends close_notify */
    int64_t end = clock_ms() + 2000;
    while (!(ss.last & IO_EOF) && clock_ms() < end)
        loop_count(1);
    assert_int_equal(evbuffer_get_length(io_input(srv)), 4);
    assert_int_equal(ss.last, IO_EOF | IO_READING);
    io_free(srv);
}

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    tls_contexts();
    return base ? 0 : -1;
}

static int teardown(void **state)
{
    SSL_CTX_free(server_ctx);
    SSL_CTX_free(client_ctx);
    event_base_free(base);
    return 0;
}


/* ---- streams ------------------------------------------------------------- */

/* A stream's owner: what it took and heard. */
struct owner {
    size_t take;                /* bytes output() takes per call */
    size_t taken, consumed;
    int outputs, closed;
    size_t unread_at_close;
    char got[64];
};

static void own_output(struct io *io, void *arg)
{
    struct owner *o = arg;
    o->outputs++;
    size_t n = evbuffer_get_length(io_output(io));
    if (n > o->take)
        n = o->take;
    if (o->taken + n <= sizeof(o->got))
        evbuffer_copyout(io_output(io), o->got + o->taken, n);
    evbuffer_drain(io_output(io), n);
    o->taken += n;
}

static void own_consumed(struct io *io, void *arg, size_t n)
{
    ((struct owner *)arg)->consumed += n;
}

static void own_closed(struct io *io, void *arg)
{
    struct owner *o = arg;
    o->closed++;
    o->unread_at_close = evbuffer_get_length(io_input(io));
}

static const struct io_stream_ops own_ops = { own_output, own_consumed, own_closed };

static void drain_read_cb(struct io *io, void *arg)
{
    struct seen *s = arg;
    s->reads++;
    evbuffer_drain(io_input(io), 3);    /* takes 3 bytes a time */
}

/* Input is told from the loop, only while reading is enabled; what the
 * layer above drains is reported as consumed; no spin on bytes it leaves. */
static void test_stream_input_and_consumed(void **state)
{
    struct owner o = { .take = 1000 };
    struct seen s = { 0 };
    struct io *io = io_new_stream(base, &own_ops, &o);
    assert_true(io_connected(io));
    assert_int_equal(io_fd(io), -1);
    io_setcb(io, drain_read_cb, drained_cb, event_cb, &s);
    io_stream_input(io, "hello", 5);
    loop_count(20);
    assert_int_equal(s.reads, 0);           /* reading not enabled */
    io_enable(io, EV_READ);
    assert_int_equal(s.reads, 0);           /* never from inside a call */
    int n = loop_count(50);
    assert_int_equal(s.reads, 1);           /* once per input, not a spin */
    assert_true(n < 40);
    assert_int_equal(o.consumed, 3);
    assert_int_equal(evbuffer_get_length(io_input(io)), 2);
    io_stream_input(io, "abc", 3);
    loop_count(20);
    assert_int_equal(s.reads, 2);
    assert_int_equal(o.consumed, 6);
    assert_int_equal(s.events, 0);
    io_free(io);
    assert_int_equal(o.closed, 1);
    assert_int_equal(o.unread_at_close, 2);
}

/* A read mark stops a stream as it stops a socket: input pushed past it at
 * once waits, enters up to the mark when the layer above takes some and
 * moves the mark (exchange.c's client_reads_fit), and each entry is told
 * by a read callback. Bytes pushed straight into the input past the mark
 * were never told: a streaming upload stalled for good. */
static void test_stream_read_mark_like_a_socket(void **state)
{
    struct owner o = { .take = 100 };
    struct seen s = { 0 };
    struct io *io = io_new_stream(base, &own_ops, &o);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    io_setwatermark(io, EV_READ, 10);
    io_enable(io, EV_READ);
    io_stream_input(io, "0123456789abcdefghijklmno", 25);
    loop_count(20);
    assert_int_equal(s.reads, 1);
    assert_int_equal(evbuffer_get_length(io_input(io)), 10);
    loop_count(20);
    assert_int_equal(s.reads, 1);           /* at the mark: no spin */
    evbuffer_drain(io_input(io), 8);
    io_setwatermark(io, EV_READ, 2 + 10);   /* room for 10 more */
    loop_count(20);
    assert_int_equal(s.reads, 2);
    assert_int_equal(evbuffer_get_length(io_input(io)), 12);
    assert_memory_equal(evbuffer_pullup(io_input(io), -1), "89abcdefghij", 12);
    evbuffer_drain(io_input(io), 12);
    io_setwatermark(io, EV_READ, 10);
    loop_count(20);
    assert_int_equal(s.reads, 3);
    assert_memory_equal(evbuffer_pullup(io_input(io), -1), "klmno", 5);
    assert_int_equal(o.consumed, 20);       /* what the layer above took */
    io_disable(io, EV_READ);
    io_stream_input(io, "pq", 2);
    loop_count(20);
    assert_int_equal(s.reads, 3);           /* not reading: it waits */
    io_free(io);
    assert_int_equal(o.unread_at_close, 7); /* told as never read */
}

/* io_flush hands the output to the owner; what it leaves waits (a write
 * timeout counts) until io_stream_writable, then the drained callback. */
static void test_stream_output_and_drained(void **state)
{
    struct owner o = { .take = 4 };
    struct seen s = { 0 };
    struct io *io = io_new_stream(base, &own_ops, &o);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    evbuffer_add(io_output(io), "0123456789", 10);
    io_flush(io);
    assert_int_equal(o.taken, 4);
    io_flush(io);                           /* waits for the owner */
    assert_int_equal(o.outputs, 1);
    o.take = 100;
    io_stream_writable(io);
    assert_int_equal(o.taken, 10);
    assert_memory_equal(o.got, "0123456789", 10);
    assert_int_equal(s.drained, 0);         /* from the loop */
    loop_until(&s.drained, 1000);
    assert_int_equal(s.drained, 1);
    evbuffer_add(io_output(io), "x", 1);
    io_flush(io);                           /* taken at once */
    assert_int_equal(o.taken, 11);
    loop_count(20);
    assert_int_equal(s.drained, 1);         /* never blocked: no drain */
    io_free(io);
}

/* The end comes after the input it follows, once; a reset at once, with its
 * errno; neither calls back from inside io_stream_end. */
static void test_stream_end_and_reset(void **state)
{
    struct owner o = { .take = 100 };
    struct seen s = { 0 };
    struct io *io = io_new_stream(base, &own_ops, &o);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    io_enable(io, EV_READ);
    io_stream_input(io, "last", 4);
    io_stream_end(io, 0);
    assert_int_equal(s.events, 0);
    loop_until(&s.events, 1000);
    assert_int_equal(s.reads, 1);
    assert_int_equal(s.events, 1);
    assert_true(s.last & IO_EOF);
    loop_count(20);
    assert_int_equal(s.events, 1);
    io_free(io);

    struct seen r = { 0 };
    io = io_new_stream(base, &own_ops, &o);
    io_setcb(io, read_cb, drained_cb, event_cb, &r);
    io_stream_end(io, ECONNRESET);          /* told though nothing reads */
    loop_until(&r.events, 1000);
    assert_true(r.last & IO_ERROR);
    assert_int_equal(io_errno(io), ECONNRESET);
    evbuffer_add(io_output(io), "late", 4);
    int before = o.outputs;
    io_flush(io);                           /* failed: nothing more moves */
    assert_int_equal(o.outputs, before);
    io_free(io);
}

/* A read timeout counts while reading is enabled and no input comes;
 * input restarts it. io_free from the read callback closes once. */
static void test_stream_read_timeout_and_free_in_callback(void **state)
{
    struct owner o = { .take = 100 };
    struct seen s = { 0 };
    struct io *io = io_new_stream(base, &own_ops, &o);
    io_setcb(io, read_cb, drained_cb, event_cb, &s);
    struct timeval tv = clock_timeval(100);
    io_set_timeouts(io, &tv, NULL);
    io_enable(io, EV_READ);
    for (int i = 0; i < 4; i++) {           /* 4 x 60 ms: longer than 100 */
        loop_count(60);
        io_stream_input(io, "k", 1);
    }
    assert_int_equal(s.events, 0);
    loop_until(&s.events, 1000);
    assert_true(s.last & IO_TIMEOUT);
    io_free(io);
    assert_int_equal(o.closed, 1);

    struct owner o2 = { .take = 100 };
    struct seen f = { .free_in_read = 1 };
    io = io_new_stream(base, &own_ops, &o2);
    io_setcb(io, read_cb, drained_cb, event_cb, &f);
    io_enable(io, EV_READ);
    io_stream_input(io, "bye", 3);
    loop_until(&o2.closed, 1000);
    assert_int_equal(o2.closed, 1);
    assert_int_equal(o2.unread_at_close, 3);
    loop_count(20);
    assert_int_equal(f.reads, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_and_flush),
        cmocka_unit_test(test_stream_input_and_consumed),
        cmocka_unit_test(test_stream_read_mark_like_a_socket),
        cmocka_unit_test(test_stream_output_and_drained),
        cmocka_unit_test(test_stream_end_and_reset),
        cmocka_unit_test(test_stream_read_timeout_and_free_in_callback),
        cmocka_unit_test(test_read_mark_stops_without_spin),
        cmocka_unit_test(test_full_socket_arms_write_until_drained),
        cmocka_unit_test(test_eof_reported_once),
        cmocka_unit_test(test_end_watch_sees_an_end_behind_unread_bytes),
        cmocka_unit_test(test_free_inside_read_callback),
        cmocka_unit_test(test_connect_refused_from_loop),
        cmocka_unit_test(test_tls_records_in_one_segment),
        cmocka_unit_test(test_tls_megabyte_both_ways_through_full_sockets),
        cmocka_unit_test(test_tls_close_notify_is_eof),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
