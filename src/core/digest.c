/* sluice - digest.c: SHA-1 in hex over OpenSSL's EVP (see digest.h). */
#include <stdlib.h>
#include <openssl/evp.h>

#include "digest.h"
#include "hex.h"

struct digest *digest_sha1(void)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    if (c == NULL || EVP_DigestInit_ex(c, EVP_sha1(), NULL) != 1)
        abort();                        /* out of memory, as mem.c */
    return (struct digest *)c;
}

void digest_update(struct digest *d, const void *data, size_t len)
{
    EVP_DigestUpdate((EVP_MD_CTX *)d, data, len);
}

void digest_final_hex(struct digest *d, char hex[DIGEST_SHA1_HEX + 1])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    EVP_DigestFinal_ex((EVP_MD_CTX *)d, md, NULL);
    EVP_MD_CTX_free((EVP_MD_CTX *)d);
    hex_bytes(hex, md, DIGEST_SHA1_HEX / 2);
    hex[DIGEST_SHA1_HEX] = '\0';
}

void digest_sha1_hex(const void *data, size_t len, char hex[DIGEST_SHA1_HEX + 1])
{
    struct digest *d = digest_sha1();
    digest_update(d, data, len);
    digest_final_hex(d, hex);
}
