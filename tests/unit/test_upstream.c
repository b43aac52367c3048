/* sluice - test_upstream.c: the per-worker upstream pool (upstream.c).
 *
 * Against real sockets: listeners on 127.0.0.1 made here, accepted on the
 * test's own libevent base, and the pool's ios on the same base.
 * Acquire (idle first, or fresh), release (kept up to keepalive, more for
 * a second while the pool churns, closed when dirty), close, idle connections dropped when their server closes them or
 * speaks unasked, round robin over servers, a failed connect, and retire on
 * reload: idle ones closed at once, borrowed ones closed as they come back,
 * the pool freed with the last (a leak or a use after free shows under
 * SANITIZE=1). Open upstream connections are counted through the
 * sluice_connections{side="upstream"} gauge, and seen from the server side
 * as open or at EOF. Every wait is bounded. */
#include <errno.h>
#include <fcntl.h>
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

#include "clock.h"
#include "metrics.h"
#include "io.h"
#include "upstream.h"

#define MAX_ACCEPTED 64

/* A listening server on 127.0.0.1 that accepts and keeps what it accepts. */
struct server {
    int fd;
    int port;
    struct event *ev;
    int accepted[MAX_ACCEPTED];
    int naccepted;
};

static struct event_base *base;
static struct event *tick;
static struct server srv[2];

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

static void accept_cb(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;
    int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0)
        return;
    if (s->naccepted == MAX_ACCEPTED) {
        close(c);
        return;
    }
    s->accepted[s->naccepted++] = c;
}

static void server_open(struct server *s)
{
    memset(s, 0, sizeof(*s));
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    assert_true(s->fd >= 0);
    struct sockaddr_in sin = { .sin_family = AF_INET };
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sin);
    assert_int_equal(bind(s->fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(s->fd, 64), 0);
    assert_int_equal(getsockname(s->fd, (struct sockaddr *)&sin, &len), 0);
    s->port = ntohs(sin.sin_port);
    s->ev = event_new(base, s->fd, EV_READ | EV_PERSIST, accept_cb, s);
    event_add(s->ev, NULL);
}

static void server_close(struct server *s)
{
    for (int i = 0; i < s->naccepted; i++)
        if (s->accepted[i] >= 0)
            close(s->accepted[i]);
    event_free(s->ev);
    close(s->fd);
    memset(s, 0, sizeof(*s));
}

/* 1: the server's end of connection i is open; 0: its peer closed it. */
static int server_conn_open(struct server *s, int i)
{
    char ch;
    ssize_t n = recv(s->accepted[i], &ch, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n == 0)
        return 0;
    assert_true(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    return 1;
}

static int server_open_count(struct server *s)
{
    int n = 0;
    for (int i = 0; i < s->naccepted; i++)
        n += server_conn_open(s, i);
    return n;
}

static void loop_ms(int64_t ms)
{
    int64_t end = clock_us() / 1000 + ms;
    while (clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
}

/* Run the loop until server s has accepted want connections. */
static void loop_accepted(struct server *s, int want)
{
    int64_t end = clock_us() / 1000 + 3000;
    while (s->naccepted < want && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(s->naccepted, want);
}

/* An upstream of n servers (srv[0..n) ports) keeping `keepalive`. */
struct upcfg {
    struct conf_upstream cu;
    struct conf_addr addr[2];
};

static void upcfg_init(struct upcfg *u, int n, const int *ports, int keepalive)
{
    memset(u, 0, sizeof(*u));
    for (int i = 0; i < n; i++) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&u->addr[i].ss;
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)ports[i]);
        sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        u->addr[i].sslen = sizeof(*sin);
        u->addr[i].text = "127.0.0.1:test";
    }
    u->cu.name = "up";
    u->cu.servers = u->addr;
    u->cu.nservers = n;
    u->cu.keepalive = keepalive;
    u->cu.connect_timeout_ms = 2000;
    u->cu.timeout_ms = 2000;
}

/* What the borrower's callbacks saw on a connection. */
struct borrow {
    struct upstream_conn *uc;
    int connected, error, eof;
};

static void borrow_event_cb(struct io *io, short what, void *arg)
{
    struct borrow *br = arg;
    if (what & IO_CONNECTED) {
        br->connected = 1;
        br->uc->connected = 1;
    }
    if (what & IO_ERROR)
        br->error = 1;
    if (what & IO_EOF)
        br->eof = 1;
}

static void borrow_read_cb(struct io *io, void *arg)
{
}

/* Acquire as a borrower does: set its callbacks, and for a fresh connection
 * wait until the connect completes. */
static struct upstream_conn *borrow(struct upstream_pool *p, int fresh, struct borrow *br)
{
    memset(br, 0, sizeof(*br));
    struct upstream_conn *uc = upstream_acquire(p, fresh);
    assert_non_null(uc);
    br->uc = uc;
    io_setcb(uc->io, borrow_read_cb, NULL, borrow_event_cb, br);
    io_enable(uc->io, EV_READ);
    int64_t end = clock_us() / 1000 + 3000;
    while (!uc->connected && !br->error && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(uc->connected);
    return uc;
}

static int64_t up_gauge(void)
{
    return metrics_gauge_get(METRICS_CONN_UPSTREAM);
}

/* ---- acquire, release, close ----------------------------------------------------- */

static void test_acquire_release_reuse(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    assert_ptr_equal(upstream_conf(p), &u.cu);
    struct borrow br;
    struct upstream_conn *uc = borrow(p, 0, &br);
    assert_ptr_equal(uc->pool, p);
    assert_int_equal(uc->reused, 0);
    assert_int_equal(uc->server, 0);
    assert_non_null(uc->parser);
    assert_int_equal(up_gauge(), g0 + 1);
    loop_accepted(&srv[0], 1);

    upstream_release(uc);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0 + 1);           /* kept idle */
    assert_int_equal(server_open_count(&srv[0]), 1);

    struct upstream_conn *again = borrow(p, 0, &br);
    assert_ptr_equal(again, uc);                    /* the idle one */
    assert_int_equal(again->reused, 1);
    assert_int_equal(again->connected, 1);
    loop_ms(20);
    assert_int_equal(srv[0].naccepted, 1);          /* no new connect */

    /* fresh: never the idle one. */
    upstream_release(again);
    struct borrow br2;
    struct upstream_conn *fresh = borrow(p, 1, &br2);
    assert_ptr_not_equal(fresh, again);
    assert_int_equal(fresh->reused, 0);
    loop_accepted(&srv[0], 2);
    assert_int_equal(up_gauge(), g0 + 2);

    upstream_close(fresh);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0 + 1);
    assert_int_equal(server_conn_open(&srv[0], 1), 0);  /* the server sees EOF */
    assert_int_equal(server_conn_open(&srv[0], 0), 1);  /* the idle one stays */

    upstream_pool_destroy(p);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
    upstream_pool_destroy(NULL);
}

/* At most keepalive connections stay idle; the others close on release. */
static void test_keepalive_bound(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 2);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br[4];
    struct upstream_conn *uc[4];
    for (int i = 0; i < 4; i++)
        uc[i] = borrow(p, 1, &br[i]);
    loop_accepted(&srv[0], 4);
    assert_int_equal(up_gauge(), g0 + 4);
    for (int i = 0; i < 4; i++)
        upstream_release(uc[i]);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0 + 2);
    assert_int_equal(server_open_count(&srv[0]), 2);
    /* Three wanted: the two idle ones, then a new one. */
    struct upstream_conn *got[3];
    int reused = 0;
    for (int i = 0; i < 3; i++) {
        got[i] = borrow(p, 0, &br[i]);
        reused += got[i]->reused;
    }
    assert_int_equal(reused, 2);
    assert_int_equal(got[2]->reused, 0);
    loop_accepted(&srv[0], 5);
    for (int i = 0; i < 3; i++)
        upstream_close(got[i]);
    upstream_pool_destroy(p);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
}

/* Churn: a close above keepalive, then a connect within a second because
 * none was idle. From then on the pool keeps up to keepalive more idle
 * (a burst's), and closes each once it idled a second. */
static void test_keepalive_churn(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 2);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br[8];
    struct upstream_conn *uc[8];
    for (int i = 0; i < 3; i++)
        uc[i] = borrow(p, 1, &br[i]);
    for (int i = 0; i < 3; i++)
        upstream_release(uc[i]);            /* the third closes: above 2 */
    loop_ms(20);
    assert_int_equal(server_open_count(&srv[0]), 2);
    /* Three wanted again: two idle, one connected anew: churn. */
    for (int i = 0; i < 3; i++)
        uc[i] = borrow(p, 0, &br[i]);
    loop_accepted(&srv[0], 4);
    for (int i = 0; i < 3; i++)
        upstream_release(uc[i]);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0 + 3);   /* the surplus one kept */
    assert_int_equal(server_open_count(&srv[0]), 3);
    /* Six wanted: three idle, three new; back, at most 2 x keepalive stay. */
    int reused = 0;
    for (int i = 0; i < 6; i++) {
        uc[i] = borrow(p, 0, &br[i]);
        reused += uc[i]->reused;
    }
    assert_int_equal(reused, 3);
    loop_accepted(&srv[0], 7);
    for (int i = 0; i < 6; i++)
        upstream_release(uc[i]);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0 + 4);
    assert_int_equal(server_open_count(&srv[0]), 4);
    /* A second idle: the surplus closes, keepalive stays. */
    int64_t end = clock_ms() + 3000;
    while (server_open_count(&srv[0]) > 2 && clock_ms() < end)
        loop_ms(50);
    assert_int_equal(up_gauge(), g0 + 2);
    assert_int_equal(server_open_count(&srv[0]), 2);
    upstream_pool_destroy(p);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
}

static void test_keepalive_zero(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 0);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br;
    struct upstream_conn *uc = borrow(p, 0, &br);
    loop_accepted(&srv[0], 1);
    upstream_release(uc);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_conn_open(&srv[0], 0), 0);
    uc = borrow(p, 0, &br);
    assert_int_equal(uc->reused, 0);
    upstream_close(uc);
    upstream_pool_destroy(p);
    assert_int_equal(up_gauge(), g0);
}

/* A connection released with unread bytes in its input is not clean. */
static void test_release_dirty_closes(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br;
    struct upstream_conn *uc = borrow(p, 0, &br);
    loop_accepted(&srv[0], 1);
    io_disable(uc->io, EV_READ);
    io_setwatermark(uc->io, EV_READ, 0);
    assert_int_equal(write(srv[0].accepted[0], "HTTP/1.1 200 OK\r\n", 17), 17);
    io_enable(uc->io, EV_READ);
    int64_t end = clock_us() / 1000 + 3000;
    while (evbuffer_get_length(io_input(uc->io)) == 0 && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(evbuffer_get_length(io_input(uc->io)) > 0);
    upstream_release(uc);
    loop_ms(20);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_conn_open(&srv[0], 0), 0);
    upstream_pool_destroy(p);
}

/* ---- idle connections ------------------------------------------------------------- */

/* The server closes an idle connection: the pool notices and drops it, and
 * the next acquire connects anew. */
static void test_idle_closed_by_server(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br;
    struct upstream_conn *uc = borrow(p, 0, &br);
    loop_accepted(&srv[0], 1);
    upstream_release(uc);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0 + 1);
    close(srv[0].accepted[0]);
    srv[0].accepted[0] = -1;
    int64_t end = clock_us() / 1000 + 3000;
    while (up_gauge() != g0 && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(up_gauge(), g0);
    srv[0].naccepted = 0;
    uc = borrow(p, 0, &br);
    assert_int_equal(uc->reused, 0);
    loop_accepted(&srv[0], 1);
    upstream_close(uc);
    upstream_pool_destroy(p);
}

/* Bytes nobody asked for on an idle connection: it cannot carry another
 * request, so it is dropped. */
static void test_idle_unsolicited_bytes(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br;
    struct upstream_conn *uc = borrow(p, 0, &br);
    loop_accepted(&srv[0], 1);
    upstream_release(uc);
    loop_ms(10);
    assert_int_equal(write(srv[0].accepted[0], "X", 1), 1);
    int64_t end = clock_us() / 1000 + 3000;
    while (up_gauge() != g0 && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_int_equal(up_gauge(), g0);
    loop_ms(10);
    assert_int_equal(server_conn_open(&srv[0], 0), 0);
    uc = borrow(p, 0, &br);
    assert_int_equal(uc->reused, 0);
    upstream_close(uc);
    upstream_pool_destroy(p);
}

/* ---- servers ---------------------------------------------------------------------- */

static void test_round_robin(void **state)
{
    struct upcfg u;
    int ports[2] = { srv[0].port, srv[1].port };
    upcfg_init(&u, 2, ports, 8);
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br[4];
    struct upstream_conn *uc[4];
    for (int i = 0; i < 4; i++) {
        uc[i] = borrow(p, 1, &br[i]);
        assert_int_equal(uc[i]->server, i % 2);
    }
    loop_accepted(&srv[0], 2);
    loop_accepted(&srv[1], 2);
    for (int i = 0; i < 4; i++)
        upstream_close(uc[i]);
    upstream_pool_destroy(p);
}

/* Nothing listens: the acquire still hands out a connection under way, the
 * borrower hears the error and closes it. */
static void test_connect_refused(void **state)
{
    struct server dead;
    server_open(&dead);
    int port = dead.port;
    server_close(&dead);
    struct upcfg u;
    upcfg_init(&u, 1, &port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct upstream_conn *uc = upstream_acquire(p, 0);
    assert_non_null(uc);
    struct borrow br = { uc, 0, 0, 0 };
    io_setcb(uc->io, borrow_read_cb, NULL, borrow_event_cb, &br);
    io_enable(uc->io, EV_READ);
    int64_t end = clock_us() / 1000 + 3000;
    while (!br.error && clock_us() / 1000 < end)
        event_base_loop(base, EVLOOP_ONCE);
    assert_true(br.error);
    assert_false(uc->connected);
    upstream_close(uc);
    assert_int_equal(up_gauge(), g0);
    upstream_pool_destroy(p);
}

/* ---- retire on reload ------------------------------------------------------------- */

/* Retired with two borrowed and one idle: the idle one closes at once, the
 * borrowed ones close when they come back (never kept), and the pool is
 * freed with the last (its conf must stay valid until then: poisoned here
 * after the last release, so a late read shows under ASan/valgrind). */
static void test_retire(void **state)
{
    struct upcfg *u = malloc(sizeof(*u));
    assert_non_null(u);
    upcfg_init(u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u->cu);
    struct borrow br[3];
    struct upstream_conn *uc[3];
    for (int i = 0; i < 3; i++)
        uc[i] = borrow(p, 1, &br[i]);
    loop_accepted(&srv[0], 3);
    upstream_release(uc[2]);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0 + 3);

    upstream_pool_retire(p);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0 + 2);           /* the idle one */
    assert_int_equal(server_conn_open(&srv[0], 2), 0);

    upstream_release(uc[0]);                        /* clean, but retired */
    loop_ms(10);
    assert_int_equal(up_gauge(), g0 + 1);
    assert_int_equal(server_conn_open(&srv[0], 0), 0);
    assert_int_equal(server_conn_open(&srv[0], 1), 1);

    upstream_close(uc[1]);                          /* the last: frees the pool */
    loop_ms(10);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
    memset(u, 0xa5, sizeof(*u));
    free(u);
}

/* Destroy with connections out is a retire: the pool lives until they are
 * back; released after destroy, they close rather than stay idle. */
static void test_destroy_with_borrowed(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br[2];
    struct upstream_conn *a = borrow(p, 1, &br[0]);
    struct upstream_conn *b = borrow(p, 1, &br[1]);
    loop_accepted(&srv[0], 2);
    upstream_pool_destroy(p);
    upstream_release(a);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0 + 1);
    assert_int_equal(server_conn_open(&srv[0], 0), 0);
    upstream_release(b);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
}

/* Retired with nothing out: freed at once, its idle connections closed. */
static void test_retire_idle_only(void **state)
{
    struct upcfg u;
    upcfg_init(&u, 1, &srv[0].port, 4);
    int64_t g0 = up_gauge();
    struct upstream_pool *p = upstream_pool_create(base, &u.cu);
    struct borrow br[2];
    struct upstream_conn *a = borrow(p, 1, &br[0]);
    struct upstream_conn *b = borrow(p, 1, &br[1]);
    loop_accepted(&srv[0], 2);
    upstream_release(a);
    upstream_release(b);
    upstream_pool_retire(p);
    loop_ms(10);
    assert_int_equal(up_gauge(), g0);
    assert_int_equal(server_open_count(&srv[0]), 0);
}

/* ---- setup ------------------------------------------------------------------------ */

static int setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    base = event_base_new();
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = clock_timeval(2);
    event_add(tick, &tv);
    return 0;
}

static int teardown(void **state)
{
    event_free(tick);
    event_base_free(base);
    return 0;
}

/* Fresh listeners per case, so accepted[] counts only this case's. */
static int case_setup(void **state)
{
    server_open(&srv[0]);
    server_open(&srv[1]);
    return 0;
}

static int case_teardown(void **state)
{
    server_close(&srv[0]);
    server_close(&srv[1]);
    return 0;
}

#define CASE(t) cmocka_unit_test_setup_teardown(t, case_setup, case_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        CASE(test_acquire_release_reuse),
        CASE(test_keepalive_bound),
        CASE(test_keepalive_churn),
        CASE(test_keepalive_zero),
        CASE(test_release_dirty_closes),
        CASE(test_idle_closed_by_server),
        CASE(test_idle_unsolicited_bytes),
        CASE(test_round_robin),
        CASE(test_connect_refused),
        CASE(test_retire),
        CASE(test_destroy_with_borrowed),
        CASE(test_retire_idle_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
