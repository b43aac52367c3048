/* sluice - fuzz_h2srv.c: libFuzzer target for the HTTP/2 server session.
 *
 * A session (h2srv.c, nghttp2 with sluice's callbacks and h2msg.c) over a
 * socketpair: the input after its first bytes is what a client sends after
 * the preface; every stream the session opens is read (its window given
 * back) and answered with an HTTP/1.1 response taken from the input (byte 0:
 * its length in 8-byte units; 0: a fixed 200 with a body), then freed, some
 * before and some after the session (the zombie path). Nothing may crash,
 * leak or grow without bound; ASan and UBSan watch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <event2/buffer.h>
#include <event2/event.h>

#include "h2srv.h"
#include "io.h"

#define MAX_STREAMS 64

static struct io *opened[MAX_STREAMS];
static int nopened;

static void nothing(struct io *io, void *arg) {}
static void nothing_ev(struct io *io, short what, void *arg) {}

static int open_cb(void *arg, struct io *io, int refused)
{
    if (nopened == MAX_STREAMS)
        return -1;
    io_setcb(io, nothing, nothing, nothing_ev, NULL);
    opened[nopened++] = io;
    return 0;
}

static void ended_cb(void *arg)
{
    *(int *)arg = 1;
}

static const struct h2srv_ops ops = {.open = open_cb, .ended = ended_cb};

static void drain(int fd)
{
    char buf[16384];
    while (read(fd, buf, sizeof(buf)) > 0)
        ;
}

static void feed(struct event_base *base, int fd, const uint8_t *p, size_t n)
{
    for (int rounds = 0; n > 0 && rounds < 64; rounds++) {
        ssize_t w = write(fd, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        drain(fd);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char fixed[] = "HTTP/1.1 103 Early\r\nLink: </a>\r\n\r\n"
                                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n";
    if (size < 1)
        return 0;
    size_t rlen = (size_t)data[0] * 8;
    if (rlen > size - 1)
        rlen = size - 1;
    const uint8_t *resp = rlen ? data + 1 : (const uint8_t *)fixed;
    size_t resplen = rlen ? rlen : sizeof(fixed) - 1;
    const uint8_t *in = data + 1 + rlen;
    size_t inlen = size - 1 - rlen;

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        abort();
    struct event_base *base = event_base_new();
    int ended = 0;
    nopened = 0;
    struct h2srv_limits lim = {.max_streams = 8, .max_requests = 20, .max_header_bytes = 4096,
                               .preface_timeout_ms = 10000, .idle_timeout_ms = 10000};
    struct h2srv *s = h2srv_new(base, io_new(base, sv[0], NULL), &lim, 0, &ops, &ended);
    feed(base, sv[1], (const uint8_t *)H2SRV_PREFACE, H2SRV_PREFACE_LEN);
    feed(base, sv[1], in, inlen);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < nopened; i++) {
            if (opened[i] == NULL)
                continue;
            struct evbuffer *b = io_input(opened[i]);
            evbuffer_drain(b, evbuffer_get_length(b) / 2 + 1);
            if (round == 0) {
                evbuffer_add(io_output(opened[i]), resp, resplen);
                io_flush(opened[i]);
            }
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        drain(sv[1]);
    }
    /* the first half of the streams end before the session, the rest after */
    for (int i = 0; i < nopened / 2; i++)
        io_free(opened[i]);
    event_base_loop(base, EVLOOP_NONBLOCK);
    h2srv_free(s);
    for (int i = nopened / 2; i < nopened; i++)
        io_free(opened[i]);
    event_base_loop(base, EVLOOP_NONBLOCK);
    close(sv[1]);
    event_base_free(base);
    return 0;
}
