/* sluice - mem.c: aborting allocation wrappers, and libevent's buffer pool. */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

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

/* ---- libevent's buffers ------------------------------------------------- */

/* libevent allocates an evbuffer's chains in powers of two from 1 KiB
 * (16 KiB for a read of IO_READ_SIZE) and frees each one as soon as it is
 * drained, so every request of a keep-alive connection allocated and freed
 * about four (its head read, written upstream, the answer read and written
 * back): a 16 KiB block is beyond glibc's per-thread cache and costs its
 * bins' work each time (malloc and free took about 1,400 of the 23,100
 * instructions of a proxied request, callgrind). Each thread keeps a few
 * freed blocks of those sizes for its next ones, as HAProxy's buffer pools
 * and nginx's per-connection buffers do: at most MEM_POOL_KEEP per size, so
 * at most 31 x MEM_POOL_KEEP KiB per thread. Every block is glibc's (malloc's, not carved), so a block
 * freed here that was allocated before mem_pool_install(), or the other
 * way round, is still right. Under a sanitizer the pool is off, so that a
 * use after free of a chain is still seen. */
#define MEM_POOL_MIN_SHIFT 10           /* 1 KiB: libevent's smallest chain */
#define MEM_POOL_CLASSES   5            /* up to 16 KiB */
#define MEM_POOL_KEEP      32

#if defined(__SANITIZE_ADDRESS__)
#define MEM_POOL_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MEM_POOL_OFF 1
#endif
#endif

#ifndef MEM_POOL_OFF
struct mem_pool {
    void *head[MEM_POOL_CLASSES];       /* each block's first word: the next */
    int n[MEM_POOL_CLASSES];
    int keyed;                          /* the thread's exit empties it */
};

static __thread struct mem_pool pool;
static pthread_key_t pool_key;

/* The class of a power of two from 1 KiB to 16 KiB, or -1. */
static int pool_class_of_size(size_t n)
{
    if (n < (1u << MEM_POOL_MIN_SHIFT) || (n & (n - 1)) != 0)
        return -1;
    int k = __builtin_ctzl(n) - MEM_POOL_MIN_SHIFT;
    return k < MEM_POOL_CLASSES ? k : -1;
}

/* The class a block can serve by what glibc gave it: at least 2^k bytes
 * and less than 2^k + 64 (a block much larger goes back to glibc). */
static int pool_class_of_block(void *p)
{
    size_t u = malloc_usable_size(p);
    if (u < (1u << MEM_POOL_MIN_SHIFT))
        return -1;
    int k = 63 - __builtin_clzl(u);
    if (u - ((size_t)1 << k) >= 64)
        return -1;
    k -= MEM_POOL_MIN_SHIFT;
    return k < MEM_POOL_CLASSES ? k : -1;
}

static void pool_drain(void *arg)
{
    struct mem_pool *mp = arg;
    for (int k = 0; k < MEM_POOL_CLASSES; k++) {
        while (mp->head[k] != NULL) {
            void *p = mp->head[k];
            mp->head[k] = *(void **)p;
            free(p);
        }
        mp->n[k] = 0;
    }
}

static void *pool_malloc(size_t n)
{
    int k = pool_class_of_size(n);
    if (k >= 0 && pool.head[k] != NULL) {
        void *p = pool.head[k];
        pool.head[k] = *(void **)p;
        pool.n[k]--;
        return p;
    }
    return malloc(n);
}

static void pool_free(void *p)
{
    if (p == NULL)
        return;
    int k = pool_class_of_block(p);
    if (k < 0 || pool.n[k] >= MEM_POOL_KEEP) {
        free(p);
        return;
    }
    if (!pool.keyed) {
        pool.keyed = 1;
        pthread_setspecific(pool_key, &pool);
    }
    *(void **)p = pool.head[k];
    pool.head[k] = p;
    pool.n[k]++;
}

void mem_pool_install(void)
{
    if (pthread_key_create(&pool_key, pool_drain) != 0)
        return;
    event_set_mem_functions(pool_malloc, realloc, pool_free);
}

void mem_pool_drain(void)
{
    pool_drain(&pool);
}
#else
void mem_pool_install(void)
{
}

void mem_pool_drain(void)
{
}
#endif
