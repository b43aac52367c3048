/* sluice - fuzz_http1_differential.c: libFuzzer target holding
 * src/http/http1.c to the parser sluice had before (tests/unit/http1_ref.c,
 * http_parser 2.9 plus sluice's checks).
 *
 * Input layout as the other http1 targets: byte 0 flags (bit 0: a small
 * max_bytes from byte 1; bit 1: the response answers a HEAD; bit 2: parse
 * as a response), bytes 1-4 as fuzz_http1.h, then the message. Both parse
 * the heads (1xx followed) and the body; a difference that
 * tests/unit/http1_diff.h's known_diffs[] does not explain aborts. */
#include "../unit/http1_diff.h"

#define FUZZ_HDR_BYTES 5

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[256];

    if (size < FUZZ_HDR_BYTES)
        return 0;
    enum http1_kind kind = (data[0] & 4) ? HTTP1_RESPONSE : HTTP1_REQUEST;
    size_t max = (data[0] & 1) ? 16 + (size_t)data[1] * 4 : 16384;
    int hr = kind == HTTP1_RESPONSE && (data[0] & 2);
    const uint8_t *d = data + FUZZ_HDR_BYTES;
    size_t n = size - FUZZ_HDR_BYTES;
    size_t at;
    const char *diff = http1_diff(kind, d, n, max, hr, why, sizeof(why), &at);
    if (diff != NULL && diff_known(kind, d + at, n - at) == NULL) {
        fprintf(stderr, "http1 differs from http_parser (%s): %s\n",
                kind == HTTP1_REQUEST ? "request" : "response", diff);
        abort();
    }
    return 0;
}
