/* sluice - fuzz_http1_response.c: libFuzzer target for response framing.
 *
 * As the request target, for an upstream's answer: 1xx heads followed by
 * the final one, the HEAD flag from the first byte, and http1_body_eof() at
 * the end of the input (an EOF-delimited body must then be exactly the bytes
 * sent; no other body may complete on EOF). Invariants: fuzz_http1.h. */
#include "fuzz_http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_http1_one(HTTP1_RESPONSE, data, size);
    return 0;
}
