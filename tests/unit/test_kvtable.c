/* sluice - test_kvtable.c: the hash + LRU table under the deny cache and
 * the memory store. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvtable.h"

struct item {
    struct kvtable_entry kv;
    int value;
};

static struct item *add(struct kvtable *t, const struct kvtable_key *k,
                        struct list *l, const char *key, int value)
{
    size_t len = strlen(key);
    struct item *it = kvtable_add(t, sizeof(*it), kvtable_hash(k, key, len), key, len);
    it->value = value;
    list_push(l, &it->kv.lru);
    return it;
}

static struct item *find(struct kvtable *t, const struct kvtable_key *k, const char *key)
{
    size_t len = strlen(key);
    return (struct item *)kvtable_find(t, kvtable_hash(k, key, len), key, len);
}

static void drop(struct kvtable *t, struct list *l, struct item *it)
{
    kvtable_remove(t, &it->kv);
    list_unlink(l, &it->kv.lru);
    free(it);
}

static void test_find_grow_remove(void **state)
{
    struct kvtable t;
    struct kvtable_key k;
    struct list l = { 0 };
    char key[32];
    kvtable_init(&t, 4);
    kvtable_key_init(&k);
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "key-%d", i);
        add(&t, &k, &l, key, i);
    }
    assert_int_equal(t.count, 1000);
    assert_true(t.nbuckets >= 1000);            /* load stays <= 1 */
    assert_int_equal(t.nbuckets & (t.nbuckets - 1), 0);
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "key-%d", i);
        struct item *it = find(&t, &k, key);
        assert_non_null(it);
        assert_int_equal(it->value, i);
        assert_memory_equal(it->kv.key, key, it->kv.keylen);
    }
    assert_null(find(&t, &k, "key-1000"));
    assert_null(find(&t, &k, "key-"));          /* a prefix is another key */
    /* keys with NUL bytes and the empty key are keys */
    size_t n = 3;
    struct item *z = kvtable_add(&t, sizeof(*z), kvtable_hash(&k, "a\0b", n), "a\0b", n);
    z->value = -1;
    list_push(&l, &z->kv.lru);
    assert_ptr_equal(kvtable_find(&t, kvtable_hash(&k, "a\0b", n), "a\0b", n), &z->kv);
    assert_null(kvtable_find(&t, kvtable_hash(&k, "a\0c", n), "a\0c", n));
    assert_ptr_equal(kvtable_of(l.first), &z->kv);
    assert_ptr_equal(kvtable_of(l.last), &find(&t, &k, "key-0")->kv);
    /* remove every other one: the rest stay findable */
    for (int i = 0; i < 1000; i += 2) {
        snprintf(key, sizeof(key), "key-%d", i);
        drop(&t, &l, find(&t, &k, key));
    }
    assert_int_equal(t.count, 501);
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof(key), "key-%d", i);
        assert_true((find(&t, &k, key) != NULL) == (i % 2 == 1));
    }
    assert_ptr_equal(kvtable_of(l.last), &find(&t, &k, "key-1")->kv);
    while (l.last)
        drop(&t, &l, (struct item *)kvtable_of(l.last));
    assert_int_equal(t.count, 0);
    assert_null(kvtable_of(l.first));
    kvtable_fini(&t);
}

/* Two lists over one table, as the memory store's open and held lists:
 * moving an entry between them keeps each in order. */
static void test_lists(void **state)
{
    struct kvtable t;
    struct kvtable_key k;
    struct list open = { 0 }, held = { 0 };
    kvtable_init(&t, 16);
    kvtable_key_init(&k);
    struct item *a = add(&t, &k, &open, "a", 1);
    struct item *b = add(&t, &k, &open, "b", 2);
    struct item *c = add(&t, &k, &open, "c", 3);
    assert_ptr_equal(kvtable_of(open.last), &a->kv);
    assert_ptr_equal(kvtable_of(open.first), &c->kv);
    list_unlink(&open, &b->kv.lru);
    list_push(&held, &b->kv.lru);
    assert_ptr_equal(kvtable_of(held.last), &b->kv);
    assert_ptr_equal(kvtable_of(held.first), &b->kv);
    assert_ptr_equal(kvtable_of(a->kv.lru.prev), &c->kv);
    assert_ptr_equal(kvtable_of(c->kv.lru.next), &a->kv);
    /* touch a: c becomes the oldest */
    list_unlink(&open, &a->kv.lru);
    list_push(&open, &a->kv.lru);
    assert_ptr_equal(kvtable_of(open.last), &c->kv);
    assert_ptr_equal(kvtable_of(open.first), &a->kv);
    assert_null(open.first->prev);
    assert_null(open.last->next);
    drop(&t, &open, c);
    drop(&t, &open, a);
    assert_null(kvtable_of(open.last));
    assert_null(kvtable_of(open.first));
    drop(&t, &held, b);
    assert_null(kvtable_of(held.last));
    assert_int_equal(t.count, 0);
    kvtable_fini(&t);
}

/* Same bytes, same hash under one key; two random keys differ. */
static void test_hash(void **state)
{
    struct kvtable_key k1, k2;
    kvtable_key_init(&k1);
    kvtable_key_init(&k2);
    assert_true(kvtable_hash(&k1, "rl:ip:1.2.3.4", 13) == kvtable_hash(&k1, "rl:ip:1.2.3.4", 13));
    assert_true(kvtable_hash(&k1, "rl:ip:1.2.3.4", 13) != kvtable_hash(&k1, "rl:ip:1.2.3.5", 13));
    assert_true(kvtable_hash(&k1, "x", 1) != kvtable_hash(&k1, "x", 0));
    assert_true(k1.k0 != k2.k0 || k1.k1 != k2.k1);
    /* SipHash-2-4 reference vector: key 00..0f, message 00..0e (15 bytes) */
    struct kvtable_key ref = { 0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL };
    char msg[15];
    for (int i = 0; i < 15; i++)
        msg[i] = (char)i;
    assert_true(kvtable_hash(&ref, msg, 15) == 0xa129ca6149be45e5ULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_grow_remove),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_hash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
