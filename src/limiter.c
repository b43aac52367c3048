/* sluice - limiter.c: the rate-limit algorithms in C.
 *
 * For now only their names, shared by the config loader (which parses them)
 * and the headers and logs (which print them). The pure C algorithms of the
 * in-process backend (issue 3) will live here too, on the same
 * struct limiter_params as scripts/limit.lua. */
#include "limiter.h"

const char *limiter_algo_name(enum limiter_algo algo)
{
    switch (algo) {
    case LIMITER_FIXED_WINDOW: return "fixed_window";
    case LIMITER_SLIDING_WINDOW: return "sliding_window";
    case LIMITER_SLIDING_LOG: return "sliding_log";
    case LIMITER_TOKEN_BUCKET: return "token_bucket";
    case LIMITER_GCRA: return "gcra";
    }
    return "unknown";
}
