/* sluice - regex.h: a compiled path_regex (PCRE2, JIT when available).
 *
 * Made by the config loader, matched by route.c with a bounded cost per
 * match (a step, depth and heap limit). A leaf: both conf.c and route.c
 * use it, it uses neither. */
#ifndef SLUICE_REGEX_H
#define SLUICE_REGEX_H

#include <stddef.h>

#define REGEX_MAX_CAPTURES 10           /* groups reported, group 0 included */

struct regex;

/* Compile pattern; NULL with why filled on a syntax error or a
 * backreference. *ncaptures gets the group count. The caller owns the
 * result: regex_free. */
struct regex *regex_compile(const char *pattern, int *ncaptures, char *why, size_t whylen);
void regex_free(struct regex *re);
/* 1 when JIT-compiled (the interpreter gets a smaller step budget). */
int regex_jit(const struct regex *re);
/* Match s[0..len): 1 with off/glen[0..max) filled (off SIZE_MAX: group
 * unset), 0 for no match, -1 when a limit was hit before it could tell. */
int regex_match(const struct regex *re, const char *s, size_t len,
                size_t *off, size_t *glen, int max);

#endif
