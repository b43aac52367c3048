/* sluice - tzcal.c: a TZif reader and calendar periods in its zone.
 *
 * Reads the version 2+ data of a TZif file (64-bit transition times), keeps
 * the UTC offset after each transition, and parses the footer's POSIX TZ
 * rule ("CET-1CEST,M3.5.0,M10.5.0/3") for times after the last one (a
 * "slim" file has no transitions past the year its rule took over).
 * Calendar arithmetic is on days since 1970-01-01 (proleptic Gregorian). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "tzcal.h"

#define TZCAL_FILE_MAX (256 * 1024)     /* the largest zone file is ~4 KB */
#define DAY_S 86400

/* A POSIX TZ rule's date: Mm.w.d (month, week 1..5 with 5 = last, weekday
 * 0 = Sunday) at secs after local midnight. */
struct tzcal_date {
    int m, w, d;
    int32_t secs;
};

struct tzcal {
    int64_t *at;            /* transition times, s, ascending */
    int32_t *off;           /* the offset from at[i] on */
    int n;
    int32_t off0;           /* before the first transition */
    int rule;               /* 0: none (the last offset stays), 1: std only, 2: DST too */
    int32_t std, dst;       /* the rule's offsets, s east of UTC */
    struct tzcal_date start, end;   /* DST begins (local std time), ends (local DST time) */
};

/* ---- calendar arithmetic --------------------------------------------------- */

static int64_t floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* Days since 1970-01-01 of y-m-d (m 1..12); H. Hinnant's days_from_civil. */
static int64_t days_of(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = floor_div(y, 400);
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_of(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = floor_div(z, 146097);
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

/* 0 = Sunday, as POSIX TZ rules count (1970-01-01 was a Thursday). */
static int weekday_sun0(int64_t days)
{
    return (int)(floor_div(days + 4, 7) * -7 + days + 4);
}

/* The local seconds (since the epoch, in the rule's local time) of date dt
 * in year y. */
static int64_t rule_local(int64_t y, const struct tzcal_date *dt)
{
    int64_t first = days_of(y, dt->m, 1);
    int mdays = (int)(days_of(dt->m == 12 ? y + 1 : y, dt->m == 12 ? 1 : dt->m + 1, 1) - first);
    int day = (dt->d - weekday_sun0(first) + 7) % 7 + (dt->w - 1) * 7;
    while (day >= mdays)
        day -= 7;
    return (first + day) * DAY_S + dt->secs;
}

static int32_t rule_utoff(const struct tzcal *z, int64_t t)
{
    if (z->rule == 1)
        return z->std;
    int64_t y;
    int m, d;
    civil_of(floor_div(t + z->std, DAY_S), &y, &m, &d);
    int64_t on = rule_local(y, &z->start) - z->std, off = rule_local(y, &z->end) - z->dst;
    int in_dst = on < off ? t >= on && t < off : t >= on || t < off;
    return in_dst ? z->dst : z->std;
}

int32_t tzcal_utoff(const struct tzcal *z, int64_t t)
{
    if (z->n == 0 || t < z->at[0])
        return z->n == 0 && z->rule ? rule_utoff(z, t) : z->off0;
    int lo = 0, hi = z->n - 1;          /* the last at[i] <= t */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (z->at[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo == z->n - 1 && z->rule ? rule_utoff(z, t) : z->off[lo];
}

/* The first instant (s) whose local time is at or after local seconds l:
 * l - offset when l exists, the end of the gap when DST skips it. */
static int64_t tzcal_first_at(const struct tzcal *z, int64_t l)
{
    int64_t t = l - tzcal_utoff(z, l);
    t = l - tzcal_utoff(z, t);
    if (t + tzcal_utoff(z, t) >= l)
        return t;
    int64_t lo = t, hi = t + 2 * DAY_S;  /* in a gap: search its end */
    while (lo + 1 < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (mid + tzcal_utoff(z, mid) >= l)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

void tzcal_bounds(const struct tzcal *z, enum tzcal_unit unit, int64_t t_ms, int64_t b[4])
{
    int64_t t = floor_div(t_ms, 1000);
    int64_t days = floor_div(t + tzcal_utoff(z, t), DAY_S), y;
    int m, d;
    civil_of(days, &y, &m, &d);
    for (int k = -1; k <= 2; k++) {
        int64_t first;
        switch (unit) {
        case TZCAL_DAY: first = days + k; break;
        case TZCAL_WEEK: first = days - (weekday_sun0(days) + 6) % 7 + 7 * k; break;
        case TZCAL_MONTH: {
            int64_t mm = y * 12 + (m - 1) + k;
            first = days_of(floor_div(mm, 12), (int)(mm - floor_div(mm, 12) * 12) + 1, 1);
            break;
        }
        case TZCAL_YEAR: first = days_of(y + k, 1, 1); break;
        default: abort();
        }
        b[k + 1] = tzcal_first_at(z, first * DAY_S) * 1000;
    }
}

/* ---- the TZif file ------------------------------------------------------- */

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A POSIX TZ name: letters, or <...> quoted; its end, or NULL. */
static const char *tz_name(const char *s)
{
    const char *p = s;
    if (*p == '<') {
        while (*p && *p != '>')
            p++;
        return *p == '>' && p - s >= 4 ? p + 1 : NULL;
    }
    while ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z'))
        p++;
    return p - s >= 3 ? p : NULL;
}

/* [+-]hh[:mm[:ss]] (hh up to 167, RFC 8536's extension) into *secs. */
static const char *tz_time(const char *s, int32_t *secs)
{
    int sign = 1, part[3] = { 0, 0, 0 };
    if (*s == '+' || *s == '-')
        sign = *s++ == '-' ? -1 : 1;
    for (int i = 0; i < 3; i++) {
        if (i > 0 && *s != ':')
            break;
        if (i > 0)
            s++;
        if (*s < '0' || *s > '9')
            return NULL;
        int v = 0, nd = 0;
        while (*s >= '0' && *s <= '9' && nd < 3)
            v = v * 10 + (*s++ - '0'), nd++;
        if (v > (i == 0 ? 167 : 59))
            return NULL;
        part[i] = v;
    }
    *secs = sign * (part[0] * 3600 + part[1] * 60 + part[2]);
    return s;
}

/* ",Mm.w.d[/time]"; only the M form (every zone of tzdata uses it). */
static const char *tz_date(const char *s, struct tzcal_date *dt)
{
    if (s[0] != ',' || s[1] != 'M')
        return NULL;
    char *e;
    s += 2;
    dt->m = (int)strtol(s, &e, 10);
    if (e == s || *e != '.' || dt->m < 1 || dt->m > 12)
        return NULL;
    s = e + 1;
    dt->w = (int)strtol(s, &e, 10);
    if (e == s || *e != '.' || dt->w < 1 || dt->w > 5)
        return NULL;
    s = e + 1;
    dt->d = (int)strtol(s, &e, 10);
    if (e == s || dt->d < 0 || dt->d > 6)
        return NULL;
    s = e;
    dt->secs = 7200;
    if (*s == '/')
        s = tz_time(s + 1, &dt->secs);
    return s;
}

/* The footer rule: "STDoff[DST[off][,start,end]]". 0, or -1. */
static int tz_rule(struct tzcal *z, const char *s)
{
    int32_t o;
    if (*s == '\0')
        return 0;                       /* no rule: the last offset stays */
    if ((s = tz_name(s)) == NULL || (s = tz_time(s, &o)) == NULL)
        return -1;
    z->std = -o;                        /* POSIX counts west */
    z->rule = 1;
    if (*s == '\0')
        return 0;
    if ((s = tz_name(s)) == NULL)
        return -1;
    z->dst = z->std + 3600;
    if (*s != ',' && *s != '\0') {
        if ((s = tz_time(s, &o)) == NULL)
            return -1;
        z->dst = -o;
    }
    if ((s = tz_date(s, &z->start)) == NULL || (s = tz_date(s, &z->end)) == NULL || *s)
        return -1;
    z->rule = 2;
    return 0;
}

/* The v2+ data at p[0..n): 0, or -1. */
static int tz_parse(struct tzcal *z, const unsigned char *p, size_t n)
{
    size_t cnt[6], v1;
    if (n < 44 || memcmp(p, "TZif", 4) || p[4] < '2')
        return -1;
    for (int i = 0; i < 6; i++)
        cnt[i] = be32(p + 20 + 4 * i);
    /* isutcnt isstdcnt leapcnt timecnt typecnt charcnt */
    v1 = 44 + cnt[3] * 5 + cnt[4] * 6 + cnt[5] + cnt[2] * 8 + cnt[1] + cnt[0];
    if (v1 + 44 > n || memcmp(p + v1, "TZif", 4))
        return -1;
    p += v1, n -= v1;
    for (int i = 0; i < 6; i++)
        cnt[i] = be32(p + 20 + 4 * i);
    if (cnt[2] != 0 || cnt[4] == 0 || cnt[4] > 256 || cnt[3] > 100000)
        return -1;                      /* leap seconds ("right/") are not ours */
    size_t data = cnt[3] * 9 + cnt[4] * 6 + cnt[5] + cnt[1] + cnt[0];
    if (44 + data + 2 > n)
        return -1;
    const unsigned char *times = p + 44, *idx = times + cnt[3] * 8, *types = idx + cnt[3];
    z->n = (int)cnt[3];
    z->at = mem_calloc(cnt[3] + 1, sizeof *z->at);
    z->off = mem_calloc(cnt[3] + 1, sizeof *z->off);
    z->off0 = (int32_t)be32(types);
    for (size_t i = 0; i < cnt[3]; i++) {
        z->at[i] = (int64_t)((uint64_t)be32(times + 8 * i) << 32 | be32(times + 8 * i + 4));
        if (idx[i] >= cnt[4] || (i > 0 && z->at[i] <= z->at[i - 1]))
            return -1;
        z->off[i] = (int32_t)be32(types + 6 * idx[i]);
    }
    const char *foot = (const char *)p + 44 + data;
    size_t fl = n - 44 - data;
    if (foot[0] != '\n' || foot[fl - 1] != '\n' || fl > 128 || memchr(foot + 1, '\n', fl - 2))
        return -1;
    char rule[128];
    memcpy(rule, foot + 1, fl - 2);
    rule[fl - 2] = '\0';
    return tz_rule(z, rule);
}

static int tz_name_ok(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > 100 || name[0] == '/' || name[0] == '.' || strstr(name, "..") ||
        strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/_+-") != n)
        return 0;
    return 1;
}

struct tzcal *tzcal_load(const char *name, const char **why)
{
    char path[512];
    const char *dir = getenv("TZDIR");
    struct tzcal *z = NULL;
    unsigned char *buf = NULL;
    size_t n = 0;
    FILE *f = NULL;
    *why = "not a time zone name";
    if (!tz_name_ok(name))
        goto fail;
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "/usr/share/zoneinfo", name);
    *why = "unknown time zone";
    if ((f = fopen(path, "rb")) == NULL)
        goto fail;
    buf = mem_alloc(TZCAL_FILE_MAX);
    n = fread(buf, 1, TZCAL_FILE_MAX, f);
    *why = "not a TZif file of version 2 or later";
    z = mem_calloc(1, sizeof *z);
    if (n == TZCAL_FILE_MAX || tz_parse(z, buf, n) < 0)
        goto fail;
    fclose(f);
    free(buf);
    return z;
fail:
    if (f)
        fclose(f);
    free(buf);
    tzcal_free(z);
    return NULL;
}

void tzcal_free(struct tzcal *z)
{
    if (z == NULL)
        return;
    free(z->at);
    free(z->off);
    free(z);
}
