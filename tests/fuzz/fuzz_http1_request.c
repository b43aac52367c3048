/* sluice - fuzz_http1_request.c: libFuzzer target for request framing.
 *
 * http1_head_parse() over the input as a request (max_bytes 16384, or a small
 * bound picked by the first byte so 414/431 run too), then the rest through
 * http1_body_feed() whole and split; the invariants are listed in
 * fuzz_http1.h. */
#include "fuzz_http1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_http1_one(HTTP1_REQUEST, data, size);
    return 0;
}
