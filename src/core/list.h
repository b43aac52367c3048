/* sluice - list.h: the one doubly linked list, intrusive.
 *
 * A struct list_link sits in each member's struct; a struct list (all zero
 * is empty) holds the first and the last. list_push makes a link the first,
 * so a list used as an LRU has its newest first and its oldest last.
 * LIST_ITEM turns a link (or NULL) back into its struct. No allocation and
 * no locking: the list's owner guards it and owns its members. */
#ifndef SLUICE_LIST_H
#define SLUICE_LIST_H

#include <stddef.h>

struct list_link {
    struct list_link *prev, *next;      /* toward the first, toward the last */
};

struct list {
    struct list_link *first, *last;
};

/* The struct of type whose member link is; NULL for a NULL link. */
#define LIST_ITEM(link, type, member) \
    ((link) ? (type *)(void *)((char *)(link) - offsetof(type, member)) : (type *)NULL)

/* n, on no list, becomes l's first. */
void list_push(struct list *l, struct list_link *n);
/* Takes n, which is on l, off it. */
void list_unlink(struct list *l, struct list_link *n);

#endif
