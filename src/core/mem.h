/* sluice - mem.h: allocation that never returns NULL.
 *
 * Running out of memory on a proxy's hot path has no useful recovery, so
 * every allocation goes through these and aborts with a log line instead of
 * leaving NULL checks scattered through the code. */
#ifndef SLUICE_MEM_H
#define SLUICE_MEM_H

#include <stddef.h>

void *mem_alloc(size_t size);
void *mem_calloc(size_t n, size_t size);
char *mem_strndup(const char *s, size_t len);

/* libevent allocates through a per-thread pool of its buffer chains' sizes
 * (mem.c); call once, before anything of libevent. */
void mem_pool_install(void);
/* The calling thread's kept blocks go back to glibc (another thread's go
 * when it ends). */
void mem_pool_drain(void);

#endif
