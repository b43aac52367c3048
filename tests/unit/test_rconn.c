/* sluice - test_rconn.c: one Redis connection (rconn.c) against a real redis-server.
 *
 * Replies in the order of the commands, even those sent before the
 * connection was up; a name resolved through evdns and /etc/hosts; a unix
 * socket; a refused connect reported from the loop; a connection freed from
 * inside its own callback; a server that closes with commands pending; a
 * reply too large to wait for. Every
 * wait is bounded; the server is killed by its PID at the end. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <cmocka.h>

#include <event2/dns.h>
#include <event2/event.h>

#include "clock.h"
#include "rconn.h"
#include "testlib.h"

static pid_t redis_pid = -1;
static int redis_port;
static char sock_path[64];
static struct event_base *base;
static struct evdns_base *dns;
static struct event *tick;

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

/* The loop runs until *flag reaches want or max_ms pass; a 5 ms tick
 * bounds each blocking iteration. */
static void loop_until(const int *flag, int want, int64_t max_ms)
{
    int64_t end = clock_ms() + max_ms;
    while ((flag == NULL || *flag < want) && clock_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
}

/* ---- what the callbacks saw ------------------------------------------------- */

struct seen {
    int connects, fails, closes;
    char why[256];
    int replies, nulls;
    long long ints[256];
    struct rconn *free_on_first;    /* rconn_free() from inside the first reply */
};

static void on_connect(struct rconn *c, int status, const char *why)
{
    struct seen *s = rconn_data(c);
    if (status == 0) {
        s->connects++;
    } else {
        s->fails++;
        snprintf(s->why, sizeof(s->why), "%s", why);
    }
}

static void on_close(struct rconn *c, const char *why)
{
    struct seen *s = rconn_data(c);
    s->closes++;
    snprintf(s->why, sizeof(s->why), "%s", why);
}

static void on_reply(struct rconn *c, redisReply *r, void *privdata)
{
    struct seen *s = privdata;
    if (r == NULL) {
        s->nulls++;
        return;
    }
    if (s->replies < 256)
        s->ints[s->replies] = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    s->replies++;
    if (s->free_on_first != NULL) {
        struct rconn *f = s->free_on_first;
        s->free_on_first = NULL;
        rconn_free(f);
    }
}

static int send_cmd(struct rconn *c, struct seen *s, int argc, const char **argv)
{
    size_t len[4];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    return rconn_send_argv(c, argc, argv, len, on_reply, s);
}

/* ---- tests ---------------------------------------------------------------------- */

/* Sent before the connection is up, through a name: replies 1..100 in order. */
static void test_order_and_name(void **state)
{
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, "localhost", redis_port, 0,
                                    on_connect, on_close, &s);
    const char *del[2] = { "DEL", "rc:n" }, *incr[2] = { "INCR", "rc:n" };
    assert_int_equal(send_cmd(c, &s, 2, del), 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(send_cmd(c, &s, 2, incr), 0);
    assert_int_equal(s.connects, 0);        /* never from inside rconn_connect */
    loop_until(&s.replies, 101, 3000);
    assert_int_equal(s.connects, 1);
    assert_int_equal(s.replies, 101);
    for (int i = 1; i <= 100; i++)
        assert_int_equal(s.ints[i], i);
    rconn_free(c);
    assert_int_equal(s.closes, 0);          /* rconn_free calls no event callback */
}

static void test_unix_socket(void **state)
{
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, sock_path, 0, 1, on_connect, on_close, &s);
    const char *incr[2] = { "INCR", "rc:unix" };
    assert_int_equal(send_cmd(c, &s, 2, incr), 0);
    loop_until(&s.replies, 1, 3000);
    assert_int_equal(s.replies, 1);
    assert_true(s.ints[0] >= 1);
    rconn_free(c);
}

static void test_refused(void **state)
{
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, "127.0.0.1", testlib_free_port(), 0,
                                    on_connect, on_close, &s);
    const char *ping[1] = { "PING" };
    assert_int_equal(send_cmd(c, &s, 1, ping), 0);
    assert_int_equal(s.fails, 0);
    loop_until(&s.fails, 1, 3000);          /* c is freed by rconn after on_connect */
    assert_int_equal(s.fails, 1);
    assert_int_equal(s.nulls, 1);
    assert_string_equal(s.why, "Connection refused");
}

/* Freed from inside its first reply: the rest get NULL replies, no event
 * callback runs, nothing is touched afterwards (ASan would say). */
static void test_free_inside_callback(void **state)
{
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, "127.0.0.1", redis_port, 0,
                                    on_connect, on_close, &s);
    const char *ping[1] = { "PING" };
    for (int i = 0; i < 3; i++)
        assert_int_equal(send_cmd(c, &s, 1, ping), 0);
    s.free_on_first = c;
    loop_until(&s.nulls, 2, 3000);
    loop_until(NULL, 0, 50);
    assert_int_equal(s.replies, 1);
    assert_int_equal(s.nulls, 2);
    assert_int_equal(s.closes + s.fails, 0);
}

/* QUIT: the server answers and closes; what was sent after it gets NULL,
 * then on_close runs once. */
static void test_server_closes(void **state)
{
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, "127.0.0.1", redis_port, 0,
                                    on_connect, on_close, &s);
    const char *ping[1] = { "PING" }, *quit[1] = { "QUIT" };
    assert_int_equal(send_cmd(c, &s, 1, ping), 0);
    assert_int_equal(send_cmd(c, &s, 1, quit), 0);
    assert_int_equal(send_cmd(c, &s, 1, ping), 0);
    loop_until(&s.closes, 1, 3000);
    assert_int_equal(s.replies, 2);
    assert_int_equal(s.nulls, 1);
    assert_int_equal(s.closes, 1);
}

/* A server that answers with a 32 MB bulk string: the reply is refused at
 * 16 MB of it, the pending callback gets NULL and on_close says why. */
static void test_reply_too_large(void **state)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET };
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sin);
    assert_true(lfd >= 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(lfd, 1), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &len), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = accept(lfd, NULL, NULL);
        static char chunk[1 << 16];
        memset(chunk, 'x', sizeof(chunk));
        const char *head = "$33554432\r\n";
        if (fd < 0 || write(fd, head, strlen(head)) < 0)
            _exit(1);
        for (int i = 0; i < 512; i++)
            if (write(fd, chunk, sizeof(chunk)) < 0)
                _exit(0);               /* the client closed: done */
        _exit(0);
    }
    close(lfd);
    struct seen s = { 0 };
    struct rconn *c = rconn_connect(base, dns, NULL, "127.0.0.1", ntohs(sin.sin_port), 0,
                                    on_connect, on_close, &s);
    const char *get[2] = { "GET", "big" };
    assert_int_equal(send_cmd(c, &s, 2, get), 0);
    loop_until(&s.closes, 1, 5000);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(s.closes, 1);
    assert_int_equal(s.replies, 0);
    assert_int_equal(s.nulls, 1);
    assert_string_equal(s.why, "a reply larger than 16 MB");
}

/* ---- setup ------------------------------------------------------------------------ */

static int setup(void **state)
{
    redis_port = testlib_free_port();
    snprintf(sock_path, sizeof(sock_path), "/tmp/sluice-test-rconn-%d.sock", (int)getpid());
    const char *unix_arg[] = { "--unixsocket", sock_path, NULL };
    redis_pid = testlib_redis_start(redis_port, unix_arg);
    base = event_base_new();
    dns = evdns_base_new(base, 0);
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = { 0, 5000 };
    if (base == NULL || dns == NULL || tick == NULL || event_add(tick, &tv) != 0)
        abort();
    evdns_base_resolv_conf_parse(dns, DNS_OPTIONS_ALL, "/etc/resolv.conf");
    /* up when a connection to it answers PING */
    for (int i = 0; i < 200; i++) {
        struct seen s = { 0 };
        struct rconn *c = rconn_connect(base, dns, NULL, "127.0.0.1", redis_port, 0,
                                        on_connect, on_close, &s);
        const char *ping[1] = { "PING" };
        send_cmd(c, &s, 1, ping);
        loop_until(&s.replies, 1, 100);
        int up = s.replies == 1 && access(sock_path, F_OK) == 0;
        if (s.fails == 0)
            rconn_free(c);
        if (up)
            return 0;
        usleep(20000);
    }
    fprintf(stderr, "test_rconn: redis-server did not start on port %d\n", redis_port);
    return -1;
}

static int teardown(void **state)
{
    testlib_redis_stop(redis_pid);
    unlink(sock_path);
    event_free(tick);
    evdns_base_free(dns, 0);
    event_base_free(base);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_and_name),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_free_inside_callback),
        cmocka_unit_test(test_server_closes),
        cmocka_unit_test(test_reply_too_large),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
