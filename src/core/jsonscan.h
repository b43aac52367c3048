/* sluice - jsonscan.h: one number at a dotted path of a JSON stream.
 *
 * A response body passes through sluice unchanged; this looks at it on the
 * way, piece by piece, in constant memory, for the whole number at a path
 * of object keys such as usage.total_tokens (no array indexes). Not a
 * validator: bytes that are not JSON stop the scan (nothing found). The
 * text/event-stream kind reads each event's data as one JSON document and
 * keeps the value of the last event that carried it (OpenAI-style streams
 * send usage in their final chunk). Pure: no I/O, no allocation. */
#ifndef SLUICE_JSONSCAN_H
#define SLUICE_JSONSCAN_H

#include <stddef.h>
#include <stdint.h>

#define JSONSCAN_MAX_SEGS  8        /* path segments */
#define JSONSCAN_MAX_PATH  128      /* path bytes */
#define JSONSCAN_MAX_DEPTH 64       /* deeper nesting stops the scan */

/* 0 when path is 1..JSONSCAN_MAX_SEGS segments of [A-Za-z0-9_-] joined by
 * '.', at most JSONSCAN_MAX_PATH bytes; -1 otherwise. */
int jsonscan_path_valid(const char *path);

struct jsonscan {
    /* the path (not owned: outlives the scan), split into segments */
    const char *path;
    uint8_t nseg, segoff[JSONSCAN_MAX_SEGS], seglen[JSONSCAN_MAX_SEGS];
    /* one JSON document */
    int st;                     /* the tokenizer's state */
    int depth;                  /* open containers */
    uint64_t arrays;            /* bit d-1: container d is an array */
    int onpath;                 /* containers 1..onpath lie on the path */
    int keyok;                  /* the key being read matches so far */
    unsigned keylen;
    int keyhit;                 /* the last key read is the next segment */
    int target;                 /* the value being read is the one wanted */
    int64_t num;
    int numok;                  /* num is a whole number so far */
    int found;                  /* value holds the document's number */
    int64_t value;
    /* text/event-stream */
    int sse;
    int line;                   /* where on a line the stream is */
    unsigned lpos;              /* bytes of "data:" matched */
    int event_data;             /* the event has data lines */
    int have;                   /* last holds the last event's value */
    int64_t last;
};

/* Scan for path (valid, see above), as one JSON document (sse 0) or as a
 * text/event-stream (sse 1). */
void jsonscan_init(struct jsonscan *j, const char *path, int sse);
/* More bytes of the body. */
void jsonscan_feed(struct jsonscan *j, const char *p, size_t n);
/* The body ended (or is no longer read): 1 with *v the number found (the
 * last event's for a stream), 0 when none was. */
int jsonscan_result(const struct jsonscan *j, int64_t *v);

#endif
