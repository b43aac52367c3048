/* sluice - tests/unit/testlib.c: the unit tests' shared redis-server and
 * port helpers (testlib.h). Test code: failures to set up abort(). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <cmocka.h>
#include <event2/buffer.h>

#include "testlib.h"

char *testlib_drain(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    assert_non_null(s);
    assert_int_equal(evbuffer_remove(b, s, n), (int)n);
    s[n] = '\0';
    return s;
}

int testlib_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = { .sin_family = AF_INET };
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sin);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 ||
        getsockname(fd, (struct sockaddr *)&sin, &len) != 0)
        abort();
    close(fd);
    return ntohs(sin.sin_port);
}

pid_t testlib_redis_start(int port, const char *const *extra)
{
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    const char *argv[32] = { "redis-server", "--port", port_s, "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no" };
    int argc = 9;
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        if (argc == 31)
            abort();
        argv[argc++] = extra[i];
    }
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);    /* never outlive a crashed test */
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    return pid;
}

void testlib_redis_stop(pid_t pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGKILL);
    for (int i = 0; i < 300; i++) {          /* up to ~3 s */
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        struct timespec ts = { 0, 10 * 1000000 };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
}
