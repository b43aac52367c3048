/* sluice - esc.h: the one escaper for strings sluice quotes in its output.
 *
 * Access-log JSON, Prometheus label values and the quoted strings of JSON
 * bodies and the IETF RateLimit fields all escape '"' and '\' the same way;
 * they differ only in what they do with other bytes, which the mode says.
 * A gRPC status message is percent-encoded instead (ESC_PERCENT). */
#ifndef SLUICE_ESC_H
#define SLUICE_ESC_H

#include <stddef.h>

enum esc_mode {
    ESC_JSON,       /* controls, DEL and bytes >= 0x80 as \u00XX: plain ASCII out */
    ESC_LABEL,      /* Prometheus label value: '\n' as \n, other bytes as they are */
    ESC_QUOTED,     /* JSON and RFC 8941 sf-string: controls and DEL dropped */
    ESC_PERCENT,    /* grpc-message: '%' and bytes outside 0x20..0x7e as %XX
                     * ('"' and '\' as they are) */
};

/* The most bytes esc_put writes for n input bytes. */
#define ESC_MAX(n) ((n) * 6)

/* s[0..n) escaped for mode into out, which has room for ESC_MAX(n) bytes;
 * no quotes around it, no NUL after it. Returns the end of what it wrote. */
char *esc_put(char *out, const char *s, size_t n, enum esc_mode mode);

/* How many bytes esc_put writes for s[0..n) (for sizing before writing). */
size_t esc_len(const char *s, size_t n, enum esc_mode mode);

#endif
