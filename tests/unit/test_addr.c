/* sluice - test_addr.c: host:port splitting, CIDRs and the X-Forwarded-For
 * walk of addr.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <cmocka.h>

#include "addr.h"

static void test_split(void **state)
{
    static const struct {
        const char *in;
        int form;
        const char *host;
        int port;
    } t[] = {
        { "127.0.0.1:6379", ADDR_HOST_PORT, "127.0.0.1", 6379 },
        { "redis:1", ADDR_HOST_PORT, "redis", 1 },
        { "a.example.com:65535", ADDR_HOST_PORT, "a.example.com", 65535 },
        { "[::1]:6380", ADDR_V6_PORT, "::1", 6380 },
        { "[2001:db8::1]:443", ADDR_V6_PORT, "2001:db8::1", 443 },
        { "::1:6381", ADDR_LAST_COLON, "::1", 6381 },      /* Redis' MOVED for v6 */
        { "2001:db8::7:7000", ADDR_LAST_COLON, "2001:db8::7", 7000 },
        /* bad: no port, bad port, empty host, brackets not closed */
        { "127.0.0.1", -1, NULL, 0 },
        { "127.0.0.1:", -1, NULL, 0 },
        { "127.0.0.1:0", -1, NULL, 0 },
        { "127.0.0.1:65536", -1, NULL, 0 },
        { "127.0.0.1:099999", -1, NULL, 0 },
        { "127.0.0.1:+80", -1, NULL, 0 },
        { "127.0.0.1: 80", -1, NULL, 0 },
        { "127.0.0.1:80x", -1, NULL, 0 },
        { "127.0.0.1:-1", -1, NULL, 0 },
        { ":80", -1, NULL, 0 },
        { "[]:80", -1, NULL, 0 },
        { "[::1]", -1, NULL, 0 },
        { "[::1]80", -1, NULL, 0 },
        { "[::1:80", -1, NULL, 0 },
        { "", -1, NULL, 0 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        char host[64] = "untouched";
        int port = -7;
        int form = addr_split(t[i].in, host, sizeof host, &port);
        if (form != t[i].form)
            fail_msg("'%s': form %d, want %d", t[i].in, form, t[i].form);
        if (form < 0)
            continue;
        assert_string_equal(host, t[i].host);
        assert_int_equal(port, t[i].port);
    }
    /* the host must fit: hostsize counts the NUL */
    char small[4];
    int port;
    assert_int_equal(addr_split("abc:80", small, sizeof small, &port), ADDR_HOST_PORT);
    assert_int_equal(addr_split("abcd:80", small, sizeof small, &port), -1);
}

static void test_port(void **state)
{
    int port = 0;
    assert_int_equal(addr_port("1", 1, &port), 0);
    assert_int_equal(port, 1);
    assert_int_equal(addr_port("65535", 5, &port), 0);
    assert_int_equal(port, 65535);
    assert_int_equal(addr_port("8080x", 4, &port), 0);      /* only n bytes count */
    assert_int_equal(port, 8080);
    assert_int_equal(addr_port("", 0, &port), -1);
    assert_int_equal(addr_port("0", 1, &port), -1);
    assert_int_equal(addr_port("65536", 5, &port), -1);
    assert_int_equal(addr_port("000080", 6, &port), -1);
    assert_int_equal(addr_port("8\00080", 4, &port), -1);
}

static struct sockaddr_storage sa(const char *text)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, text, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
    } else {
        assert_int_equal(inet_pton(AF_INET6, text, &s6->sin6_addr), 1);
        s6->sin6_family = AF_INET6;
    }
    return ss;
}

static int in(const char *cidr, const char *ip)
{
    struct addr_cidr c;
    struct sockaddr_storage ss = sa(ip);
    if (addr_cidr_parse(cidr, &c) != 0)
        fail_msg("cidr '%s' refused", cidr);
    return addr_cidr_match(&c, 1, (const struct sockaddr *)&ss);
}

static void test_cidr(void **state)
{
    /* /0: everything of its family (IPv4 also as mapped IPv6) */
    assert_int_equal(in("0.0.0.0/0", "1.2.3.4"), 1);
    assert_int_equal(in("0.0.0.0/0", "::ffff:1.2.3.4"), 1);
    assert_int_equal(in("0.0.0.0/0", "2001:db8::1"), 0);
    assert_int_equal(in("::/0", "2001:db8::1"), 1);
    assert_int_equal(in("::/0", "1.2.3.4"), 1);            /* as ::ffff:1.2.3.4 */
    /* /32 and a bare IPv4 address: that address only */
    assert_int_equal(in("10.1.2.3/32", "10.1.2.3"), 1);
    assert_int_equal(in("10.1.2.3/32", "10.1.2.4"), 0);
    assert_int_equal(in("10.1.2.3", "10.1.2.3"), 1);
    assert_int_equal(in("10.1.2.3", "10.1.2.2"), 0);
    /* /128 and a bare IPv6 address */
    assert_int_equal(in("2001:db8::1/128", "2001:db8::1"), 1);
    assert_int_equal(in("2001:db8::1/128", "2001:db8::2"), 0);
    assert_int_equal(in("2001:db8::1", "2001:db8::1"), 1);
    /* prefixes not on a byte boundary; host bits in the CIDR are masked */
    assert_int_equal(in("10.0.0.0/9", "10.127.255.255"), 1);
    assert_int_equal(in("10.0.0.0/9", "10.128.0.0"), 0);
    assert_int_equal(in("10.200.1.1/8", "10.0.0.1"), 1);
    assert_int_equal(in("fd00::/7", "fcff::1"), 1);
    assert_int_equal(in("fd00::/8", "fcff::1"), 0);
    assert_int_equal(in("::ffff:0:0/96", "9.9.9.9"), 1);
    /* refused */
    static const char *bad[] = {
        "", "/8", "10.0.0.0/33", "::/129", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/+8",
        "10.0.0.0/0008", "10.0.0.0/8x", "10.0.0/8", "host/8", "[::1]/128", "1.2.3.4 /8",
    };
    struct addr_cidr c;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (addr_cidr_parse(bad[i], &c) != -1)
            fail_msg("cidr '%s' accepted", bad[i]);
    /* no CIDRs, no address, another family: no match */
    struct sockaddr_storage ss = sa("1.2.3.4");
    assert_int_equal(addr_cidr_parse("0.0.0.0/0", &c), 0);
    assert_int_equal(addr_cidr_match(&c, 0, (const struct sockaddr *)&ss), 0);
    assert_int_equal(addr_cidr_match(&c, 1, NULL), 0);
    ss.ss_family = AF_UNIX;
    assert_int_equal(addr_cidr_match(&c, 1, (const struct sockaddr *)&ss), 0);
}

static struct addr_cidr trusted[3];

static int setup_trusted(void **state)
{
    assert_int_equal(addr_cidr_parse("10.0.0.0/8", &trusted[0]), 0);
    assert_int_equal(addr_cidr_parse("192.168.0.0/16", &trusted[1]), 0);
    assert_int_equal(addr_cidr_parse("fd00::/8", &trusted[2]), 0);
    return 0;
}

/* One field value walked from a trusted peer: the address picked and
 * whether the walk would go on to an earlier field. */
static void walk(const char *peer, const char *value, const char *want, int more)
{
    struct sockaddr_storage client = sa(peer);
    char out[ADDR_IP_MAX];
    int r = addr_xff_walk(trusted, 3, value, strlen(value), &client);
    addr_ntop(&client, out);
    if (strcmp(out, want) != 0 || r != more)
        fail_msg("'%s' from %s: %s (%d), want %s (%d)", value, peer, out, r, want, more);
}

static void test_xff_walk(void **state)
{
    /* the right-most untrusted entry is the client */
    walk("10.0.0.1", "1.2.3.4", "1.2.3.4", 0);
    walk("10.0.0.1", "6.6.6.6, 1.2.3.4", "1.2.3.4", 0);
    walk("10.0.0.1", "6.6.6.6, 1.2.3.4, 10.9.9.9", "1.2.3.4", 0);
    walk("10.0.0.1", "6.6.6.6,1.2.3.4,192.168.1.1,10.2.2.2", "1.2.3.4", 0);
    /* a chain of trusted proxies only: the left-most, and on to the next field */
    walk("10.0.0.1", "192.168.1.1, 10.2.2.2", "192.168.1.1", 1);
    walk("10.0.0.1", "fd00::1", "fd00::1", 1);
    /* garbage stops the walk: the last trusted hop stands */
    walk("10.0.0.1", "1.2.3.4, junk, 10.2.2.2", "10.2.2.2", 0);
    walk("10.0.0.1", "1.2.3.4, junk", "10.0.0.1", 0);
    walk("10.0.0.1", "", "10.0.0.1", 0);
    walk("10.0.0.1", "1.2.3.4,", "10.0.0.1", 0);
    walk("10.0.0.1", "1.2.3.4:99999", "10.0.0.1", 0);
    walk("10.0.0.1", "1.2.3.4:", "10.0.0.1", 0);
    walk("10.0.0.1", "2001:db8::1]", "10.0.0.1", 0);
    /* ports and brackets, OWS around entries */
    walk("10.0.0.1", "1.2.3.4:5678", "1.2.3.4", 0);
    walk("10.0.0.1", "[2001:db8::1]:443", "2001:db8::1", 0);
    walk("10.0.0.1", " [2001:db8::1] ,\t10.1.1.1\t", "2001:db8::1", 0);
    walk("10.0.0.1", "2001:db8::1", "2001:db8::1", 0);
    /* IPv4-mapped IPv6 counts (and is written) as IPv4 */
    walk("10.0.0.1", "1.2.3.4, ::ffff:10.3.3.3", "1.2.3.4", 0);
    walk("10.0.0.1", "::ffff:1.2.3.4", "1.2.3.4", 0);
    /* a NUL inside an entry never reaches inet_pton */
    struct sockaddr_storage client = sa("10.0.0.1");
    char out[ADDR_IP_MAX];
    assert_int_equal(addr_xff_walk(trusted, 3, "1.2.3.4\0005", 9, &client), 0);
    addr_ntop(&client, out);
    assert_string_equal(out, "10.0.0.1");
    /* with no trusted CIDR only the last entry is taken */
    client = sa("10.0.0.1");
    assert_int_equal(addr_xff_walk(trusted, 0, "1.2.3.4, 10.2.2.2", 17, &client), 0);
    addr_ntop(&client, out);
    assert_string_equal(out, "10.2.2.2");
}

static void test_from_peer(void **state)
{
    struct sockaddr_storage ss, peer = sa("::ffff:203.0.113.9");
    char out[ADDR_IP_MAX];
    assert_int_equal(addr_from_peer((const struct sockaddr *)&peer, &ss), 0);
    assert_int_equal(ss.ss_family, AF_INET);
    assert_int_equal(addr_ntop(&ss, out), strlen("203.0.113.9"));
    assert_string_equal(out, "203.0.113.9");
    peer = sa("2001:db8::5");
    assert_int_equal(addr_from_peer((const struct sockaddr *)&peer, &ss), 0);
    addr_ntop(&ss, out);
    assert_string_equal(out, "2001:db8::5");
    assert_int_equal(addr_from_peer(NULL, &ss), -1);
    peer.ss_family = AF_UNIX;
    assert_int_equal(addr_from_peer((const struct sockaddr *)&peer, &ss), -1);
}

/* ip/N keys: the network in canonical form, the address alone when whole. */
static void test_net(void **state)
{
    static const struct { const char *ip; int b4, b6; const char *want; } t[] = {
        { "192.0.2.77", 24, 128, "192.0.2.0/24" },
        { "192.0.2.77", 32, 64, "192.0.2.77" },
        { "192.0.2.77", 0, 128, "0.0.0.0/0" },
        { "192.0.2.77", 31, 128, "192.0.2.76/31" },
        { "192.0.2.77", 1, 128, "128.0.0.0/1" },
        { "255.255.255.255", 9, 128, "255.128.0.0/9" },
        { "::ffff:203.0.113.9", 16, 64, "203.0.0.0/16" },  /* mapped is IPv4 */
        { "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 24, 64, "2001:db8:1:2::/64" },
        { "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 24, 128, "2001:db8:1:2:aaaa:bbbb:cccc:dddd" },
        { "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 24, 0, "::/0" },
        { "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 24, 127, "2001:db8:1:2:aaaa:bbbb:cccc:dddc/127" },
        { "2001:db8:1:2:aaaa:bbbb:cccc:dddd", 24, 56, "2001:db8:1::/56" },
        { "2001:db8:ffff::1", 32, 33, "2001:db8:8000::/33" },
        { "::1", 32, 100, "::/100" },
        { "not an address", 24, 64, "" },
        { "", 24, 64, "" },
    };
    char out[ADDR_NET_MAX];
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        size_t n = addr_net(t[i].ip, t[i].b4, t[i].b6, out);
        if (n != strlen(t[i].want) || strcmp(out, t[i].want) != 0)
            fail_msg("net %s /%d /%d: expected '%s', got %zu '%s'", t[i].ip, t[i].b4, t[i].b6,
                     t[i].want, n, out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_port),
        cmocka_unit_test(test_cidr),
        cmocka_unit_test_setup(test_xff_walk, setup_trusted),
        cmocka_unit_test(test_from_peer),
        cmocka_unit_test(test_net),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
