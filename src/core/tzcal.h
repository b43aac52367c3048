/* sluice - tzcal.h: calendar periods (day, week, month, year) in a time zone.
 *
 * Calendar windows turn over at local midnight in an IANA zone, DST
 * included, not at multiples of their length since the epoch. The zone is
 * read once from its TZif file (RFC 8536) under /usr/share/zoneinfo (or
 * $TZDIR): its transitions, and the POSIX TZ rule of its footer for the
 * times after them. No process-wide TZ, no libc time-zone calls: a loaded
 * zone is immutable, and every function here is pure and safe from any
 * thread. */
#ifndef SLUICE_TZCAL_H
#define SLUICE_TZCAL_H

#include <stdint.h>

enum tzcal_unit {
    TZCAL_NONE,             /* not a calendar window */
    TZCAL_DAY,
    TZCAL_WEEK,             /* starting Monday */
    TZCAL_MONTH,
    TZCAL_YEAR,
};

struct tzcal;

/* Load zone name ("Europe/Berlin", "UTC"). NULL with *why set (a fixed
 * string) when the name is not a zone or its file cannot be read. The
 * caller owns the zone and frees it with tzcal_free (NULL is fine). */
struct tzcal *tzcal_load(const char *name, const char **why);
void tzcal_free(struct tzcal *z);

/* The zone's UTC offset, in seconds east, at t (seconds since the epoch). */
int32_t tzcal_utoff(const struct tzcal *z, int64_t t);

/* The periods of unit around t_ms (ms since the epoch), as the instants
 * they begin (ms since the epoch, each the first instant of its local
 * day): b[0] the previous period, b[1] the one holding t_ms, b[2] the next
 * and b[3] the one after (so b[1] <= t_ms < b[2]). */
void tzcal_bounds(const struct tzcal *z, enum tzcal_unit unit, int64_t t_ms, int64_t b[4]);

#endif
