/* sluice - esc.c: escaping '"', '\' and the bytes a mode cannot carry. */
#include "esc.h"
#include "hex.h"

char *esc_put(char *out, const char *s, size_t n, enum esc_mode mode)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (mode == ESC_PERCENT) {
            if (c < 0x20 || c > 0x7e || c == '%') {
                *out++ = '%';
                out = hex_byte(out, c, 1);
            } else {
                *out++ = (char)c;
            }
        } else if (c == '"' || c == '\\') {
            *out++ = '\\';
            *out++ = (char)c;
        } else if (mode == ESC_LABEL) {
            if (c == '\n') {
                *out++ = '\\';
                *out++ = 'n';
            } else {
                *out++ = (char)c;
            }
        } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && mode == ESC_JSON)) {
            if (mode == ESC_JSON) {
                *out++ = '\\';
                *out++ = 'u';
                *out++ = '0';
                *out++ = '0';
                out = hex_byte(out, c, 0);
            }
        } else {
            *out++ = (char)c;
        }
    }
    return out;
}

/* By escaping into scratch: the rules stay in esc_put only. */
size_t esc_len(const char *s, size_t n, enum esc_mode mode)
{
    char buf[ESC_MAX(64)];
    size_t len = 0;
    for (size_t i = 0; i < n; i += 64) {
        size_t k = n - i < 64 ? n - i : 64;
        len += (size_t)(esc_put(buf, s + i, k, mode) - buf);
    }
    return len;
}
