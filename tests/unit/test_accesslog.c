/* sluice - test_accesslog.c: the JSON access log and its writer thread.
 *
 * Lines are checked twice: byte for byte where the exact text matters
 * (escaping, numbers, time), and by Debian's Python json module for whole
 * files written by several threads at once, through reopen, and through a
 * stuck FIFO where lines must be dropped and counted, never blocking. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <event2/event.h>
#include <event2/thread.h>

#include "accesslog.h"

#define PYTHON "/usr/bin/python3"

/* Checks a log file. argv: file, first_seq, count, nthreads, mode.
 * mode "exact": every (thread, seq) with first_seq <= seq < first_seq+count
 * appears once, each thread's lines in order, and every field matches what
 * fill_entry() put there. mode "prefix": the complete lines (a cut last line
 * is allowed) are valid; their number is printed. */
static const char checker_py[] =
    "import json, sys, datetime\n"
    "path, first, count, nthreads, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]\n"
    "data = open(path, 'rb').read()\n"
    "lines = data.split(b'\\n')\n"
    "tail = lines.pop()\n"
    "if tail and mode != 'prefix': sys.exit('last line not terminated')\n"
    "keys = ['time','client','method','path','status','route','decision','limit','remaining',\n"
    "        'upstream_time','total_time','bytes_in','bytes_out','request_id','tls']\n"
    "decisions = ['allowed','limited','shadow_limited','error','none']\n"
    "last = {}\n"
    "seen = set()\n"
    "for raw in lines:\n"
    "    raw.decode('ascii')\n"
    "    o = json.loads(raw)\n"
    "    if list(o.keys()) != keys: sys.exit('keys %r' % list(o.keys()))\n"
    "    t, i = (int(x) for x in o['request_id'].split('-'))\n"
    "    us = 1700000000000000 + i * 1000 + t\n"
    "    want_time = datetime.datetime.fromtimestamp(us // 1000000, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S') + '.%03dZ' % (us % 1000000 // 1000)\n"
    "    want = {\n"
    "      'time': want_time, 'client': '127.0.0.%d' % t, 'method': 'GET',\n"
    "      'path': '/t/%d/%d?\"\\\\\\x01\\xff' % (t, i), 'status': 200 + i % 300,\n"
    "      'route': None if i % 3 == 0 else 'api', 'decision': decisions[i % 5],\n"
    "      'limit': 'per-ip' if i % 2 else None, 'remaining': None if i % 4 == 0 else i,\n"
    "      'upstream_time': None if i % 5 == 0 else i * 7 / 1e6, 'total_time': i * 11 / 1e6,\n"
    "      'bytes_in': i * 13, 'bytes_out': 2**64 - 1 - i, 'request_id': '%d-%d' % (t, i), 'tls': ''}\n"
    "    for k in keys:\n"
    "        if o[k] != want[k] and not (isinstance(want[k], float) and abs(o[k] - want[k]) < 1e-9):\n"
    "            sys.exit('line %r: %s is %r, want %r' % (raw, k, o[k], want[k]))\n"
    "    if (t, i) in seen: sys.exit('duplicate %d-%d' % (t, i))\n"
    "    seen.add((t, i))\n"
    "    if last.get(t, -1) >= i: sys.exit('thread %d out of order at %d' % (t, i))\n"
    "    last[t] = i\n"
    "if mode == 'exact':\n"
    "    want = {(t, i) for t in range(nthreads) for i in range(first, first + count)}\n"
    "    if seen != want: sys.exit('missing %d, extra %d' % (len(want - seen), len(seen - want)))\n"
    "print(len(lines))\n";

static char checker_path[128];
static char tmpdir[64];

static int setup_all(void **state)
{
    umask(022);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sluice-accesslog-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    snprintf(checker_path, sizeof(checker_path), "%s/check.py", tmpdir);
    FILE *f = fopen(checker_path, "w");
    if (f == NULL)
        return -1;
    fputs(checker_py, f);
    fclose(f);
    return 0;
}

static int teardown_all(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Runs the checker; returns the number of lines it counted, or -1. */
static long check_file(const char *file, int first, int count, int nthreads, const char *mode)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), PYTHON " '%s' '%s' %d %d %d %s", checker_path, file,
             first, count, nthreads, mode);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    long n = -1;
    if (fscanf(p, "%ld", &n) != 1)
        n = -1;
    int rc = pclose(p);
    return rc == 0 ? n : -1;
}

/* The entry every thread writes; the checker derives the same values. */
static void fill_entry(struct accesslog_entry *e, int t, int i, char *client, char *path,
                       char *rid)
{
    static const char *const decisions[] = { "allowed", "limited", "shadow_limited", "error", NULL };
    memset(e, 0, sizeof(*e));
    e->time_us = 1700000000000000LL + (int64_t)i * 1000 + t;
    e->client_len = (size_t)sprintf(client, "127.0.0.%d", t);
    e->client = client;
    e->method = "GET";
    e->method_len = 3;
    e->path_len = (size_t)sprintf(path, "/t/%d/%d?\"\\\x01\xff", t, i);
    e->path = path;
    e->status = 200 + i % 300;
    e->route = i % 3 == 0 ? NULL : "api";
    e->decision = decisions[i % 5];
    e->limit = i % 2 ? "per-ip" : NULL;
    e->remaining = i % 4 == 0 ? -1 : i;
    e->upstream_us = i % 5 == 0 ? -1 : (int64_t)i * 7;
    e->total_us = (int64_t)i * 11;
    e->bytes_in = (uint64_t)i * 13;
    e->bytes_out = UINT64_MAX - (uint64_t)i;
    e->request_id_len = (size_t)sprintf(rid, "%d-%d", t, i);
    e->request_id = rid;
}

static void write_range(struct accesslog *log, int t, int first, int count)
{
    char client[32], path[64], rid[32];
    struct accesslog_entry e;
    for (int i = first; i < first + count; i++) {
        fill_entry(&e, t, i, client, path, rid);
        accesslog_write(log, &e);
    }
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long count_lines(const char *file)
{
    FILE *f = fopen(file, "r");
    if (f == NULL)
        return -1;
    long n = 0;
    int c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* Waits (bounded) until file holds want lines; returns how long it took, or
 * -1 when it never did. */
static int64_t wait_lines(const char *file, long want, int64_t limit_ms)
{
    int64_t start = now_ms();
    while (now_ms() - start < limit_ms) {
        if (count_lines(file) == want)
            return now_ms() - start;
        usleep(5000);
    }
    return -1;
}

/* ---- formatting, byte for byte */

static void test_format_exact(void **state)
{
    struct accesslog_entry e = {
        .time_us = 1796012949334123LL,          /* 2026-11-30T04:29:09.334Z */
        .client = "10.1.2.3", .client_len = 8,
        .method = "POST", .method_len = 4,
        .path = "/api/login?x=1", .path_len = 14,
        .status = 429, .route = "login", .decision = "limited", .limit = "per-ip",
        .remaining = 0, .upstream_us = -1, .total_us = 1234567,
        .bytes_in = 321, .bytes_out = 98,
        .request_id = "abc", .request_id_len = 3, .tls = "TLSv1.3",
    };
    char buf[2048];
    size_t n = accesslog_format(&e, buf, sizeof(buf));
    const char *want = "{\"time\":\"2026-11-30T04:29:09.334Z\",\"client\":\"10.1.2.3\","
        "\"method\":\"POST\",\"path\":\"/api/login?x=1\",\"status\":429,\"route\":\"login\","
        "\"decision\":\"limited\",\"limit\":\"per-ip\",\"remaining\":0,\"upstream_time\":null,"
        "\"total_time\":1.234567,\"bytes_in\":321,\"bytes_out\":98,\"request_id\":\"abc\","
        "\"tls\":\"TLSv1.3\"}\n";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(buf, want, n);

    /* Nothing known: nulls and "none", never garbage. */
    struct accesslog_entry bare = { .time_us = 512, .remaining = -1, .upstream_us = 512,
                                    .total_us = 0, .status = 400 };
    n = accesslog_format(&bare, buf, sizeof(buf));
    want = "{\"time\":\"1970-01-01T00:00:00.000Z\",\"client\":null,\"method\":null,"
        "\"path\":null,\"status\":400,\"route\":null,\"decision\":\"none\",\"limit\":null,"
        "\"remaining\":null,\"upstream_time\":0.000512,\"total_time\":0.000000,"
        "\"bytes_in\":0,\"bytes_out\":0,\"request_id\":null,\"tls\":\"\"}\n";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(buf, want, n);
}

static void test_format_escapes_hostile_bytes(void **state)
{
    /* Quote, backslash, newline, CR, tab, DEL, 0x80 and 0xff, and a fake
     * end of object that must stay inside the string. */
    const char hostile[] = "a\"b\\c\nd\re\tf\x7fg\x80h\xff\"}\n{\"x\":1";
    struct accesslog_entry e = {
        .time_us = 0, .path = hostile, .path_len = sizeof(hostile) - 1,
        .method = "G\"T", .method_len = 3, .client = "\x01", .client_len = 1,
        .request_id = "", .request_id_len = 0, .remaining = -1, .upstream_us = -1,
    };
    char buf[4096];
    size_t n = accesslog_format(&e, buf, sizeof(buf));
    assert_true(n < sizeof(buf));
    buf[n] = '\0';
    assert_non_null(strstr(buf, "\"path\":\"a\\\"b\\\\c\\u000ad\\u000de\\u0009f\\u007fg"
                                "\\u0080h\\u00ff\\\"}\\u000a{\\\"x\\\":1\""));
    assert_non_null(strstr(buf, "\"method\":\"G\\\"T\""));
    assert_non_null(strstr(buf, "\"client\":\"\\u0001\""));
    assert_non_null(strstr(buf, "\"request_id\":\"\""));
    /* One line, plain ASCII. */
    assert_ptr_equal(strchr(buf, '\n'), buf + n - 1);
    for (size_t i = 0; i < n; i++)
        assert_true((unsigned char)buf[i] >= 0x20 || buf[i] == '\n');

    /* Every byte value in a path still gives JSON Python reads back exactly. */
    char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (char)i;
    e.path = all;
    e.path_len = sizeof(all);
    n = accesslog_format(&e, buf, sizeof(buf));
    assert_true(n < sizeof(buf));
    char file[128];
    snprintf(file, sizeof(file), "%s/bytes.json", tmpdir);
    FILE *f = fopen(file, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), PYTHON " -c \"import json,sys; o=json.loads(open(sys.argv[1],'rb')"
             ".read().decode('ascii')); p=o['path']; sys.exit(0 if p==''.join(map(chr,range(256)))"
             " and o['method']=='G\\\"T' else 1)\" '%s'", file);
    assert_int_equal(system(cmd), 0);
}

static void test_format_small_buffer_and_long_fields(void **state)
{
    struct accesslog_entry e = { .path = "/x", .path_len = 2, .remaining = -1, .upstream_us = -1 };
    char small[16];
    memset(small, 'Z', sizeof(small));
    size_t need = accesslog_format(&e, small, sizeof(small));
    assert_true(need > sizeof(small));
    for (size_t i = 0; i < sizeof(small); i++)
        assert_int_equal(small[i], 'Z');        /* untouched */

    /* A 100 KB path (every byte needing an escape) is cut, and the bound
     * the function asks for is enough for it. */
    size_t plen = 100000;
    char *path = malloc(plen);
    assert_non_null(path);
    memset(path, '\xff', plen);
    e.path = path;
    e.path_len = plen;
    need = accesslog_format(&e, small, sizeof(small));
    char *buf = malloc(need);
    assert_non_null(buf);
    size_t n = accesslog_format(&e, buf, need);
    assert_true(n <= need);
    assert_true(n < 8192 * 6 + 1024);
    assert_int_equal(buf[n - 1], '\n');
    assert_non_null(memmem(buf, n, "\\u00ff...\"", 10));
    free(buf);
    free(path);
}

/* ---- the writer */

struct writer_arg {
    struct accesslog *log;
    int thread;
    int count;
};

static void *writer_thread(void *p)
{
    struct writer_arg *a = p;
    write_range(a->log, a->thread, 0, a->count);
    return NULL;
}

static void test_four_threads_every_line_once_in_order(void **state)
{
    enum { NTHREADS = 4, PER_THREAD = 20000 };
    char file[128];
    snprintf(file, sizeof(file), "%s/threads.log", tmpdir);
    /* The threads write ~28 MB as fast as they can, far beyond any real
     * request rate, so the bound is raised: this test is about lines, the
     * FIFO tests below about dropping. */
    char *err = NULL;
    uint64_t dropped_before = accesslog_dropped();
    struct accesslog *log = accesslog_open_bounded(file, 256u << 20, &err);
    assert_non_null(log);
    assert_null(err);
    pthread_t th[NTHREADS];
    struct writer_arg args[NTHREADS];
    for (int t = 0; t < NTHREADS; t++) {
        args[t] = (struct writer_arg){ log, t, PER_THREAD };
        assert_int_equal(pthread_create(&th[t], NULL, writer_thread, &args[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++)
        pthread_join(th[t], NULL);
    accesslog_close(log);
    assert_int_equal(accesslog_dropped(), dropped_before);
    assert_int_equal(check_file(file, 0, PER_THREAD, NTHREADS, "exact"), NTHREADS * PER_THREAD);

    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);          /* umask 022 set in setup */
}

static void test_lines_arrive_without_close(void **state)
{
    char file[128];
    snprintf(file, sizeof(file), "%s/latency.log", tmpdir);
    char *err = NULL;
    struct accesslog *log = accesslog_open(file, &err);
    assert_non_null(log);
    write_range(log, 0, 0, 1);
    int64_t took = wait_lines(file, 1, 3000);
    assert_true(took >= 0);
    /* Nominal wait is under 100 ms; valgrind is slower, so allow a margin. */
    assert_true(took < 1000);
    write_range(log, 0, 1, 2);
    assert_true(wait_lines(file, 3, 3000) >= 0);
    accesslog_close(log);
    assert_int_equal(check_file(file, 0, 3, 1, "exact"), 3);
}

static void test_reopen_after_rename(void **state)
{
    char file[128], moved[160];
    snprintf(file, sizeof(file), "%s/rotate.log", tmpdir);
    snprintf(moved, sizeof(moved), "%s.1", file);
    char *err = NULL;
    struct accesslog *log = accesslog_open(file, &err);
    assert_non_null(log);
    write_range(log, 0, 0, 500);
    assert_true(wait_lines(file, 500, 5000) >= 0);
    assert_int_equal(rename(file, moved), 0);

    accesslog_reopen(log);
    struct stat st;
    int64_t start = now_ms();
    while (stat(file, &st) != 0 && now_ms() - start < 5000)
        usleep(5000);
    assert_int_equal(stat(file, &st), 0);       /* the writer made a new file */
    assert_int_equal(st.st_mode & 0777, 0640);

    write_range(log, 0, 500, 700);
    accesslog_close(log);
    assert_int_equal(check_file(moved, 0, 500, 1, "exact"), 500);
    assert_int_equal(check_file(file, 500, 700, 1, "exact"), 700);
}

static void test_reopen_keeps_old_file_when_open_fails(void **state)
{
    char dir[128], file[160];
    snprintf(dir, sizeof(dir), "%s/gone", tmpdir);
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(file, sizeof(file), "%s/a.log", dir);
    char *err = NULL;
    struct accesslog *log = accesslog_open(file, &err);
    assert_non_null(log);
    uint64_t dropped_before = accesslog_dropped();
    write_range(log, 0, 0, 10);
    assert_true(wait_lines(file, 10, 5000) >= 0);
    int keep = open(file, O_RDONLY);
    assert_true(keep >= 0);
    /* Unlink the file and its directory: reopen must fail and keep going
     * on the old descriptor rather than lose lines or crash. */
    assert_int_equal(unlink(file), 0);
    assert_int_equal(rmdir(dir), 0);
    accesslog_reopen(log);
    usleep(200 * 1000);
    write_range(log, 0, 10, 10);
    accesslog_close(log);
    assert_int_equal(accesslog_dropped(), dropped_before);
    struct stat st;
    assert_int_not_equal(stat(file, &st), 0);
    /* The later lines went to the old, unlinked file. */
    char buf[65536];
    ssize_t n = read(keep, buf, sizeof(buf));
    close(keep);
    assert_true(n > 0);
    long lines = 0;
    for (ssize_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    assert_int_equal(lines, 20);
}

static void test_stuck_fifo_drops_and_counts(void **state)
{
    enum { LINES = 20000 };
    char fifo[128];
    snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);

    /* No reader yet: opening must fail at once rather than hang. */
    char *err = NULL;
    struct accesslog *log = accesslog_open(fifo, &err);
    assert_null(log);
    assert_non_null(err);
    assert_non_null(strstr(err, fifo));
    free(err);

    /* A reader that never reads until the end. */
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(rfd >= 0);
    uint64_t dropped_before = accesslog_dropped();
    log = accesslog_open_bounded(fifo, 16 * 1024, &err);
    assert_non_null(log);

    int64_t start = now_ms();
    write_range(log, 0, 0, LINES);
    int64_t took = now_ms() - start;
    /* 20000 lines, ~5 MB, against a 64 KB pipe: the caller never waited on
     * the reader (generous for valgrind). */
    assert_true(took < 5000);
    assert_true(accesslog_dropped() - dropped_before > 0);

    start = now_ms();
    accesslog_close(log);
    took = now_ms() - start;
    assert_true(took < 8000);   /* gives up on the stuck reader after ~2 s */

    /* Every line is accounted for: read whole, or counted as dropped. */
    char out[128];
    snprintf(out, sizeof(out), "%s/fifo.out", tmpdir);
    FILE *f = fopen(out, "wb");
    assert_non_null(f);
    char buf[65536];
    ssize_t n;
    while ((n = read(rfd, buf, sizeof(buf))) > 0)
        fwrite(buf, 1, (size_t)n, f);
    fclose(f);
    close(rfd);
    long got = check_file(out, 0, LINES, 1, "prefix");
    assert_true(got > 0);
    assert_int_equal((uint64_t)got + (accesslog_dropped() - dropped_before), LINES);
}

static void test_stdout_target(void **state)
{
    char file[128];
    snprintf(file, sizeof(file), "%s/stdout.log", tmpdir);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, STDOUT_FILENO), STDOUT_FILENO);
    close(fd);

    char *err = NULL;
    struct accesslog *log = accesslog_open("stdout", &err);
    assert_non_null(log);
    write_range(log, 0, 0, 100);
    accesslog_reopen(log);                      /* a no-op for stdout */
    write_range(log, 0, 100, 100);
    accesslog_close(log);
    /* stdout is still open and usable after close. */
    assert_int_equal(write(STDOUT_FILENO, "", 0), 0);

    assert_int_equal(dup2(saved, STDOUT_FILENO), STDOUT_FILENO);
    close(saved);
    long got = check_file(file, 0, 200, 1, "exact");
    assert_int_equal(got, 200);
}

static void test_open_errors_and_null(void **state)
{
    char *err = NULL;
    assert_null(accesslog_open("/nonexistent-dir/x/access.log", &err));
    assert_non_null(err);
    assert_non_null(strstr(err, "/nonexistent-dir/x/access.log"));
    free(err);
    err = NULL;
    assert_null(accesslog_open("", &err));
    assert_non_null(err);
    free(err);

    struct accesslog_entry e = { .remaining = -1 };
    accesslog_write(NULL, &e);
    accesslog_reopen(NULL);
    accesslog_close(NULL);
}

int main(void)
{
    evthread_use_pthreads();    /* workers wake the writer's loop, as in main.c */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_exact),
        cmocka_unit_test(test_format_escapes_hostile_bytes),
        cmocka_unit_test(test_format_small_buffer_and_long_fields),
        cmocka_unit_test(test_four_threads_every_line_once_in_order),
        cmocka_unit_test(test_lines_arrive_without_close),
        cmocka_unit_test(test_reopen_after_rename),
        cmocka_unit_test(test_reopen_keeps_old_file_when_open_fails),
        cmocka_unit_test(test_stuck_fifo_drops_and_counts),
        cmocka_unit_test(test_stdout_target),
        cmocka_unit_test(test_open_errors_and_null),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
