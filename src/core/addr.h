/* sluice - addr.h: addresses as text: host:port, CIDR, X-Forwarded-For.
 *
 * The one place that splits host:port, parses and matches CIDRs, and walks
 * the X-Forwarded-For entries for the client address. Pure functions: no
 * name resolution, no allocation, safe from any thread. */
#ifndef SLUICE_ADDR_H
#define SLUICE_ADDR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define ADDR_IP_MAX 64          /* an address as text, with its NUL */
#define ADDR_NET_MAX (ADDR_IP_MAX + 4)  /* a network as text: address "/" bits */

struct addr_cidr {
    int family;                 /* AF_INET or AF_INET6 */
    uint8_t addr[16];           /* network bytes, masked */
    int bits;                   /* prefix length */
};

/* How addr_split found the port. */
enum addr_form {
    ADDR_HOST_PORT = 1,         /* "host:port", one colon */
    ADDR_V6_PORT,               /* "[v6]:port" */
    ADDR_LAST_COLON,            /* "v6:port" unbracketed, as Redis writes MOVED */
};

/* s[0..n) is "1".."65535": digits only, at most five. 0 and *port, or -1. */
int addr_port(const char *s, size_t n, int *port);

/* Split host:port, [v6]:port or a:b::c:port (at the last colon) into host
 * (NUL-terminated, shorter than hostsize, not empty) and *port. Returns the
 * enum addr_form, or -1 on bad syntax or port. The host is not checked. */
int addr_split(const char *s, char *host, size_t hostsize, int *port);

/* "10.0.0.0/8", "fd00::/8", or a bare address (/32, /128): 0, or -1. */
int addr_cidr_parse(const char *s, struct addr_cidr *out);

/* 1 when addr (AF_INET/AF_INET6, IPv4-mapped IPv6 counts as IPv4) is inside
 * any of cidrs[0..n), else 0 (NULL and other families included). */
int addr_cidr_match(const struct addr_cidr *cidrs, int n, const struct sockaddr *addr);

/* peer (AF_INET/AF_INET6) into *ss, an IPv4-mapped IPv6 folded to AF_INET.
 * -1 for NULL, a unix socket or another family. */
int addr_from_peer(const struct sockaddr *peer, struct sockaddr_storage *ss);

/* One X-Forwarded-For field value v[0..n), walked from its right end: each
 * trusted entry becomes *client and the walk goes on; the first untrusted
 * one becomes *client and stops it; an entry that is not an address stops
 * it leaving *client as it was. Returns 1 when every entry was trusted (the
 * caller goes on with the field before), 0 when the walk stopped. */
int addr_xff_walk(const struct addr_cidr *trusted, int ntrusted, const char *v, size_t n,
                  struct sockaddr_storage *client);

/* ss's address as text into out[ADDR_IP_MAX]; its length ("" and 0 on
 * failure). */
size_t addr_ntop(const struct sockaddr_storage *ss, char *out);

/* The network of address text ip (as addr_ntop writes it) under a prefix of
 * bits4 bits for IPv4 (IPv4-mapped IPv6 included) or bits6 bits for IPv6,
 * in canonical form into out[ADDR_NET_MAX]: "192.0.2.0/24",
 * "2001:db8:1:2::/64"; the address alone when the prefix is whole (32 or
 * 128). Returns its length, 0 ("" in out) when ip is not an address. */
size_t addr_net(const char *ip, int bits4, int bits6, char *out);

#endif
