/* sluice - mem.c: aborting allocation wrappers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

static void mem_fail(size_t size)
{
    fprintf(stderr, "mem: out of memory allocating %zu bytes\n", size);
    abort();
}

void *mem_alloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (p == NULL)
        mem_fail(size);
    return p;
}

void *mem_calloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL)
        mem_fail(n * size);
    return p;
}

char *mem_strndup(const char *s, size_t len)
{
    char *p = mem_alloc(len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}
