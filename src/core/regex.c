/* sluice - regex.c: path_regex, the only PCRE2 user.
 *
 * A pattern is compiled once at config load (with JIT
 * when the platform allows, the interpreter otherwise) and matched against
 * the normalised path with a step limit that shrinks as the path grows, a
 * depth limit and a heap limit, so one match costs bounded CPU whatever the
 * pattern and the path: a match that hits a limit is an answer of its own
 * (route_match's over_limit), never a stall. Match data, match context and
 * JIT stack are per thread (pcre2 match data must not be shared), created on
 * a thread's first match and freed when it exits. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include "mem.h"
#include "regex.h"

/* Steps (pcre2's match limit) per match: REGEX_STEPS, or fewer on long
 * paths, where one step may scan the whole path: REGEX_BYTE_STEPS /
 * path length. The interpreter gets a tenth of both: its steps cost more.
 * The worst patterns tried (tests/unit/test_route_regex.c and nested or
 * unanchored .*) took ~4 ms with JIT, ~12 ms in the interpreter, on paths
 * up to 78 KB. */
#define REGEX_STEPS       100000
#define REGEX_BYTE_STEPS  10000000
#define REGEX_NOJIT_SHARE 10
#define REGEX_DEPTH       2000            /* interpreter nesting */
#define REGEX_HEAP_KB     1024            /* interpreter frames, per thread */
#define REGEX_JIT_STACK_MIN (32 * 1024)
#define REGEX_JIT_STACK_MAX (256 * 1024)

struct regex {
    pcre2_code *code;
    int jit;                    /* JIT-compiled: the JIT's step budget */
};

struct regex_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;        /* NULL without JIT: its default stack */
};

static pthread_once_t regex_pcre2_once = PTHREAD_ONCE_INIT;
static pthread_key_t regex_scratch_key;
static pcre2_general_context *regex_gctx;

/* pcre2 allocates through mem_alloc: no NULL to check, as everywhere. */
static void *regex_pcre2_alloc(PCRE2_SIZE size, void *data)
{
    return mem_alloc(size);
}

static void regex_pcre2_free(void *p, void *data)
{
    free(p);
}

static void regex_scratch_free(void *p)
{
    struct regex_scratch *s = p;
    pcre2_jit_stack_free(s->js);
    pcre2_match_context_free(s->mc);
    pcre2_match_data_free(s->md);
    free(s);
}

static void regex_pcre2_init(void)
{
    regex_gctx = pcre2_general_context_create(regex_pcre2_alloc, regex_pcre2_free, NULL);
    if (regex_gctx == NULL || pthread_key_create(&regex_scratch_key, regex_scratch_free) != 0)
        abort();                /* mem_alloc aborts first; the key cannot run out */
}

/* This thread's match data, made on its first match. */
static struct regex_scratch *regex_scratch(void)
{
    pthread_once(&regex_pcre2_once, regex_pcre2_init);
    struct regex_scratch *s = pthread_getspecific(regex_scratch_key);
    if (s != NULL)
        return s;
    s = mem_calloc(1, sizeof *s);
    s->md = pcre2_match_data_create(REGEX_MAX_CAPTURES, regex_gctx);
    s->mc = pcre2_match_context_create(regex_gctx);
    s->js = pcre2_jit_stack_create(REGEX_JIT_STACK_MIN, REGEX_JIT_STACK_MAX,
                                   regex_gctx);
    if (s->js != NULL)
        pcre2_jit_stack_assign(s->mc, NULL, s->js);
    pcre2_set_depth_limit(s->mc, REGEX_DEPTH);
    pcre2_set_heap_limit(s->mc, REGEX_HEAP_KB);
    if (pthread_setspecific(regex_scratch_key, s) != 0)
        abort();
    return s;
}

struct regex *regex_compile(const char *pattern, int *ncaptures,
                                        char *why, size_t whylen)
{
    /* POSIX ERE's reading where Perl's differs and a path can tell: '.'
     * matches any byte (a decoded %0A too), '$' only the end of the path
     * (not before a final newline). Bytes, never UTF-8. */
    const uint32_t opts = PCRE2_DOTALL | PCRE2_DOLLAR_ENDONLY | PCRE2_NEVER_UTF |
                          PCRE2_NEVER_UCP | PCRE2_NEVER_BACKSLASH_C;
    int err;
    PCRE2_SIZE at;
    uint32_t groups = 0, backrefs = 0;
    size_t jitsize = 0;

    pthread_once(&regex_pcre2_once, regex_pcre2_init);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts,
                                     &err, &at, NULL);
    if (code == NULL) {
        PCRE2_UCHAR msg[120];
        if (pcre2_get_error_message(err, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", err);
        snprintf(why, whylen, "%s", (const char *)msg);
        return NULL;
    }
    pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &groups);
    pcre2_pattern_info(code, PCRE2_INFO_BACKREFMAX, &backrefs);
    if (backrefs > 0) {         /* \g1, \k<n>, (?P=n): \1 the loader refuses first */
        pcre2_code_free(code);
        snprintf(why, whylen, "backreferences are not supported");
        return NULL;
    }
    /* Without JIT (a platform without it, no executable memory) the
     * interpreter runs the same pattern on a smaller step budget. */
    if (pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0)
        pcre2_pattern_info(code, PCRE2_INFO_JITSIZE, &jitsize);
    struct regex *re = mem_calloc(1, sizeof *re);
    re->code = code;
    re->jit = jitsize > 0;
    *ncaptures = (int)groups;
    return re;
}

void regex_free(struct regex *re)
{
    if (re == NULL)
        return;
    pcre2_code_free(re->code);
    free(re);
}

int regex_jit(const struct regex *re)
{
    return re->jit;
}

static uint32_t regex_steps(const struct regex *re, size_t len)
{
    uint64_t share = re->jit ? 1 : REGEX_NOJIT_SHARE;
    uint64_t steps = REGEX_BYTE_STEPS / share / (len + 1);
    if (steps > REGEX_STEPS / share)
        steps = REGEX_STEPS / share;
    return steps > 0 ? (uint32_t)steps : 1;
}

int regex_match(const struct regex *re, const char *s, size_t len,
                size_t *off, size_t *glen, int max)
{
    struct regex_scratch *sc = regex_scratch();
    pcre2_set_match_limit(sc->mc, regex_steps(re, len));
    int rc = pcre2_match(re->code, (PCRE2_SPTR)s, len, 0, 0, sc->md, sc->mc);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)     /* match, depth, heap or JIT stack limit: nothing else is expected */
        return -1;
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
    int pairs = rc > 0 ? rc : REGEX_MAX_CAPTURES;       /* 0: the ovector is full */
    if (max > REGEX_MAX_CAPTURES)
        max = REGEX_MAX_CAPTURES;
    for (int i = 0; i < max; i++) {
        int set = i < pairs && ov[2 * i] != PCRE2_UNSET && ov[2 * i + 1] >= ov[2 * i];
        off[i] = set ? (size_t)ov[2 * i] : SIZE_MAX;
        glen[i] = set ? (size_t)(ov[2 * i + 1] - ov[2 * i]) : 0;
    }
    return 1;
}
