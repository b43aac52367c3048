/* sluice - log.c: timestamped log lines on stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"
#include "log.h"

static enum log_level log_min = LOG_INFO;
static const char *const log_names[] = { "debug", "info", "warn", "error" };

void log_set_level(enum log_level level)
{
    log_min = level;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    if (level < log_min)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    int64_t now_us = clock_wall_us();
    time_t sec = (time_t)(now_us / 1000000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
            tm.tm_sec, (long)(now_us / 1000 % 1000), log_names[level], msg);
}

long log_every_second(struct log_every *e)
{
    int64_t now_ms = clock_ms();
    atomic_fetch_add(&e->count, 1);
    int64_t next = atomic_load(&e->next_ms);
    if (now_ms < next || !atomic_compare_exchange_strong(&e->next_ms, &next, now_ms + 1000))
        return 0;
    return atomic_exchange(&e->count, 0);
}
