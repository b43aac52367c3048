/* sluice - list.c: the one doubly linked list (list.h).
 *
 * Out of line on purpose: a call is cheap next to what the lists' owners
 * do per push (an accept, a decision), and clang's analyser then reads the
 * list as updated by the call instead of guessing at n->prev's paths. */
#include "list.h"

void list_push(struct list *l, struct list_link *n)
{
    n->prev = NULL;
    n->next = l->first;
    if (l->first)
        l->first->prev = n;
    else
        l->last = n;
    l->first = n;
}

void list_unlink(struct list *l, struct list_link *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        l->first = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        l->last = n->prev;
    n->prev = n->next = NULL;
}
