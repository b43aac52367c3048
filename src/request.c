/* sluice - request.c: one request's own state (request.h). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

void request_reset(struct request *rq)
{
    size_t from = offsetof(struct request, path_len);
    memset((char *)rq + from, 0, sizeof(*rq) - from);
    rq->decision = -1;
}

void request_free(struct request *rq)
{
    free(rq->path);
    free(rq->keybuf);
    free(rq->log);
    rq->path = rq->keybuf = NULL;
    rq->log = NULL;
    rq->path_cap = rq->key_cap = 0;
}

/* Grown by doubling, never shrunk: a connection's requests reuse it. */
static char *grow(char **buf, size_t *cap, size_t need)
{
    if (need > *cap) {
        size_t n = *cap ? *cap : 256;
        while (n < need)
            n *= 2;
        char *p = realloc(*buf, n);
        if (p == NULL)
            abort();
        *buf = p;
        *cap = n;
    }
    return *buf;
}

char *request_path_room(struct request *rq, size_t n)
{
    return grow(&rq->path, &rq->path_cap, n + 1);
}

size_t request_key_add(struct request *rq, const char *key, size_t len)
{
    size_t off = rq->key_used;
    memcpy(grow(&rq->keybuf, &rq->key_cap, off + len) + off, key, len);
    rq->key_used += len;
    return off;
}
