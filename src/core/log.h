/* sluice - log.h: one line per event on stderr, "TIME LEVEL module: message".
 *
 * Lines are written with one fprintf each, so lines from worker threads never
 * interleave. Non-fatal failures say what was done instead. */
#ifndef SLUICE_LOG_H
#define SLUICE_LOG_H

#include <stdatomic.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_set_level(enum log_level level);
void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* For a line a peer can trigger at any rate (accept failures, refused
 * connections): one static struct log_every per call site, zero-initialised.
 * log_every_second() returns 0 when the line is to be skipped, or how many
 * times it was asked for since the last line written (>= 1), at most once a
 * second, from any thread. */
struct log_every {
    _Atomic int64_t next_ms;    /* monotonic; the next line may go out then */
    _Atomic long count;         /* asked for since the last line */
};
long log_every_second(struct log_every *e);

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
