/* sluice - log.h: one line per event on stderr, "TIME LEVEL module: message".
 *
 * Lines are written with one fprintf each, so lines from worker threads never
 * interleave. Non-fatal failures say what was done instead. */
#ifndef SLUICE_LOG_H
#define SLUICE_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_set_level(enum log_level level);
void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_write(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)

#endif
