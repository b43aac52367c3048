/* sluice - jsonscan.c: one number at a dotted path of a JSON stream (jsonscan.h).
 *
 * A byte-at-a-time tokenizer that keeps only the nesting (a bit per level:
 * object or array) and how many of the open objects lie on the path, so a
 * body of any size and shape costs the same few bytes. Strings are not
 * decoded: a key written with an escape never matches. */
#include <string.h>

#include "jsonscan.h"

enum {
    J_VALUE,        /* a value is next */
    J_KEY,          /* a key (or the end of an object) is next */
    J_COLON,
    J_AFTER,        /* a value ended: ',' or a closing bracket is next */
    J_STR, J_STR_ESC,
    J_KEYSTR, J_KEYSTR_ESC,
    J_NUM,
    J_LIT,          /* true, false, null */
    J_END,          /* the document ended: only whitespace may follow */
    J_FAIL,
};

enum { L_START, L_PREFIX, L_DATA_SP, L_DATA, L_SKIP, L_CR };

#define JSONSCAN_NUM_MAX 1000000000000000LL     /* 10^15: larger is no count */

static int seg_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

int jsonscan_path_valid(const char *path)
{
    size_t n = strlen(path), seg = 0, segs = 1;
    if (n == 0 || n > JSONSCAN_MAX_PATH)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (path[i] == '.') {
            if (seg == 0 || ++segs > JSONSCAN_MAX_SEGS)
                return -1;
            seg = 0;
        } else if (seg_char(path[i])) {
            seg++;
        } else {
            return -1;
        }
    }
    return seg == 0 ? -1 : 0;
}

static void doc_reset(struct jsonscan *j)
{
    j->st = J_VALUE;
    j->depth = j->onpath = 0;
    j->arrays = 0;
    j->keyhit = j->target = j->found = 0;
}

void jsonscan_init(struct jsonscan *j, const char *path, int sse)
{
    memset(j, 0, sizeof(*j));
    j->path = path;
    size_t n = strlen(path), from = 0;
    for (size_t i = 0; i <= n && j->nseg < JSONSCAN_MAX_SEGS; i++)
        if (i == n || path[i] == '.') {
            j->segoff[j->nseg] = (uint8_t)from;
            j->seglen[j->nseg] = (uint8_t)(i - from);
            j->nseg++;
            from = i + 1;
        }
    j->sse = sse;
    doc_reset(j);
}

/* A value ended: the number, if it was the one wanted, is the result. */
static void value_end(struct jsonscan *j, int number)
{
    if (j->target && number && j->numok) {
        j->found = 1;
        j->value = j->num;
    }
    j->target = 0;
    j->st = j->depth == 0 ? J_END : J_AFTER;
}

static void push(struct jsonscan *j, int array)
{
    if (j->depth >= JSONSCAN_MAX_DEPTH) {
        j->st = J_FAIL;
        return;
    }
    /* an object that is the root, or the value of a key on the path */
    int on = !array && !j->target && j->onpath == j->depth && (j->depth == 0 || j->keyhit);
    j->target = 0;
    if (array)
        j->arrays |= (uint64_t)1 << j->depth;
    else
        j->arrays &= ~((uint64_t)1 << j->depth);
    j->depth++;
    if (on)
        j->onpath = j->depth;
    j->keyhit = 0;
    j->st = array ? J_VALUE : J_KEY;
}

static int is_array(const struct jsonscan *j)
{
    return (j->arrays >> (j->depth - 1)) & 1;
}

static void pop(struct jsonscan *j, char c)
{
    if (j->depth == 0 || (c == ']') != is_array(j)) {
        j->st = J_FAIL;
        return;
    }
    if (j->onpath == j->depth)
        j->onpath--;
    j->depth--;
    value_end(j, 0);
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* The start of a value at c. */
static void value_begin(struct jsonscan *j, char c)
{
    if (c == '{' || c == '[') {
        push(j, c == '[');
    } else if (c == '"') {
        j->st = J_STR;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        j->st = J_NUM;
        j->numok = c != '-';
        j->num = c == '-' ? 0 : c - '0';
    } else if (c >= 'a' && c <= 'z') {
        j->st = J_LIT;
    } else {
        j->st = J_FAIL;
    }
}

/* One byte of a JSON document. */
static void doc_byte(struct jsonscan *j, char c)
{
    for (;;) {
        switch (j->st) {
        case J_VALUE:
            if (is_ws(c))
                return;
            if (c == ']' && j->depth > 0 && is_array(j)) {    /* [] */
                pop(j, c);
                return;
            }
            value_begin(j, c);
            return;
        case J_KEY:
            if (is_ws(c))
                return;
            if (c == '}') {
                pop(j, c);
                return;
            }
            if (c != '"') {
                j->st = J_FAIL;
                return;
            }
            j->st = J_KEYSTR;
            j->keylen = 0;
            j->keyok = j->depth == j->onpath && j->depth - 1 < j->nseg;
            return;
        case J_KEYSTR: {
            if (c == '\\') {
                j->keyok = 0;
                j->st = J_KEYSTR_ESC;
                return;
            }
            if (c == '"') {
                int s = j->depth - 1;
                j->keyhit = j->keyok && j->keylen == j->seglen[s];
                j->st = J_COLON;
                return;
            }
            if (j->keyok) {
                int s = j->depth - 1;
                if (j->keylen >= j->seglen[s] || j->path[j->segoff[s] + j->keylen] != c)
                    j->keyok = 0;
            }
            j->keylen++;
            return;
        }
        case J_KEYSTR_ESC:
            j->st = J_KEYSTR;
            return;
        case J_COLON:
            if (is_ws(c))
                return;
            if (c != ':') {
                j->st = J_FAIL;
                return;
            }
            j->target = j->keyhit && j->depth == j->nseg;
            j->st = J_VALUE;
            return;
        case J_STR:
            if (c == '\\')
                j->st = J_STR_ESC;
            else if (c == '"')
                value_end(j, 0);
            return;
        case J_STR_ESC:
            j->st = J_STR;
            return;
        case J_NUM:
            if (c >= '0' && c <= '9') {
                if (j->num >= JSONSCAN_NUM_MAX / 10)
                    j->numok = 0;
                else
                    j->num = j->num * 10 + (c - '0');
                return;
            }
            if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
                j->numok = 0;
                return;
            }
            value_end(j, 1);
            continue;           /* c is what follows the number */
        case J_LIT:
            if (c >= 'a' && c <= 'z')
                return;
            value_end(j, 0);
            continue;
        case J_AFTER:
            if (is_ws(c))
                return;
            if (c == ',') {
                j->st = is_array(j) ? J_VALUE : J_KEY;
                j->keyhit = 0;
                return;
            }
            if (c == '}' || c == ']') {
                pop(j, c);
                return;
            }
            j->st = J_FAIL;
            return;
        case J_END:
            if (!is_ws(c))
                j->st = J_FAIL;
            return;
        default:
            return;
        }
    }
}

/* The document's number, a number still being read at its end included. */
static int doc_found(const struct jsonscan *j, int64_t *v)
{
    if (j->st == J_NUM && j->target && j->numok) {
        *v = j->num;
        return 1;
    }
    if (j->found)
        *v = j->value;
    return j->found;
}

/* The blank line that ends an event: its data's number, if any, is the
 * stream's latest. */
static void event_end(struct jsonscan *j)
{
    int64_t v;
    if (j->event_data && doc_found(j, &v)) {
        j->have = 1;
        j->last = v;
    }
    j->event_data = 0;
    doc_reset(j);
}

static void sse_feed(struct jsonscan *j, const char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        char c = p[i];
        switch (j->line) {
        case L_CR:
            j->line = L_START;
            if (c == '\n')
                i++;
            continue;
        case L_START:
            if (c == '\r' || c == '\n') {
                event_end(j);
                j->line = c == '\r' ? L_CR : L_START;
                i++;
                continue;
            }
            j->line = L_PREFIX;
            j->lpos = 0;
            continue;
        case L_PREFIX:
            if (c == "data:"[j->lpos]) {
                i++;
                if (++j->lpos == 5)
                    j->line = L_DATA_SP;
                continue;
            }
            j->line = L_SKIP;
            continue;
        case L_DATA_SP:
            if (j->event_data)
                doc_byte(j, '\n');      /* data lines join with a newline */
            j->event_data = 1;
            j->line = L_DATA;
            if (c == ' ')
                i++;
            continue;
        case L_DATA:
        case L_SKIP:
            if (c == '\r' || c == '\n') {
                j->line = c == '\r' ? L_CR : L_START;
                i++;
                continue;
            }
            if (j->line == L_DATA && j->st != J_FAIL)
                doc_byte(j, c);
            i++;
            continue;
        }
    }
}

void jsonscan_feed(struct jsonscan *j, const char *p, size_t n)
{
    if (j->sse) {
        sse_feed(j, p, n);
        return;
    }
    for (size_t i = 0; i < n && j->st != J_FAIL; i++)
        doc_byte(j, p[i]);
}

int jsonscan_result(const struct jsonscan *j, int64_t *v)
{
    if (!j->sse)
        return doc_found(j, v);
    if (j->event_data && doc_found(j, v))     /* a last event without its blank line */
        return 1;
    if (j->have)
        *v = j->last;
    return j->have;
}
