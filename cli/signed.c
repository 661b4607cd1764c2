/* signed.c - what the commands that check signatures share: which file is an archive, the
 * exit status of a check, the line naming who signed. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

int cli_check_fail(kiln_err rc) {
    cli_fail(rc);
    return rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT ? 1 : 2;
}

bool cli_is_archive(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcmp(path + n - 5, ".kiln");
}

void cli_print_signers(const kiln_sign_trust_key *const *signers, size_t n, int threshold,
                       const char *what) {
    printf("signed by");
    for (size_t i = 0; i < n; i++) {
        char id[KILN_SIGN_KEYID_HEX];
        kiln_sign_keyid_hex(signers[i]->pub.keyid, id);
        printf("%s %s (%s)", i ? "," : "", signers[i]->name, id);
    }
    printf(": %zu of %d required%s\n", n, threshold, what);
}
