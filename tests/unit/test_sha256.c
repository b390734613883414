/* SHA-256 against the FIPS 180-4 examples and a million 'a's fed in odd-sized pieces. */
#include <string.h>

#include "base/sha256.h"

#include "../check.h"

static void one(const char *msg, size_t piece, const char *want) {
    lily_sha256 s;
    char hex[65];
    lily_sha256_init(&s);
    size_t n = strlen(msg);
    for (size_t i = 0; i < n; i += piece)
        lily_sha256_update(&s, msg + i, n - i < piece ? n - i : piece);
    lily_sha256_hex(&s, hex);
    CHECK(!strcmp(hex, want), "'%.20s' in pieces of %zu: %s", msg, piece, hex);
}

int main(void) {
    one("", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    one("abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m2 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    for (size_t p = 1; p <= 64; p += 7)
        one(m2, p, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    static char a[1000001];
    memset(a, 'a', 1000000);
    one(a, 4093, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
