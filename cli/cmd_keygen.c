/* cmd_keygen.c - kiln keygen: a minisign-compatible key pair. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

int cmd_keygen(int argc, char **argv) {
    const char *base = NULL;
    bool nopw = false;
    const cli_opt opts[] = {
        {"out", CLI_STR, &base, "BASE", "write BASE.key (secret) and BASE.pub (public)", true},
        {"no-password", CLI_FLAG, &nopw, NULL, "leave the secret key unencrypted (as minisign -W)",
         false},
        {0},
    };
    const cli_spec spec = {"kiln keygen --out BASE [--no-password]",
                           "Create a minisign-compatible Ed25519 key pair. The secret key is "
                           "encrypted with scrypt;\nthe password comes from the terminal or "
                           "from the file named by $KILN_PASSWORD_FILE.",
                           opts, 0, 0};
    int st;
    if (!cli_parse_args(&spec, argc, argv, NULL, &st)) return st;
    char *kpath = kiln_asprintf("%s.key", base), *ppath = kiln_asprintf("%s.pub", base);
    char *pw = NULL;
    size_t pwlen = 0;
    kiln_sign_seckey *sk = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !kpath || !ppath, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, kiln_path_exists(kpath), KILN_ERR_CONFLICT,
                  "'%s' exists already; refusing to overwrite a key", kpath);
    KILN_CHECK_IF(rc, out, kiln_path_exists(ppath), KILN_ERR_CONFLICT,
                  "'%s' exists already; refusing to overwrite a key", ppath);
    if (!nopw) {
        KILN_CHECK(rc, out,
                   cli_get_password("Password for the new secret key: ", true, &pw, &pwlen));
        KILN_CHECK_IF(rc, out, pwlen == 0, KILN_ERR_USAGE,
                      "empty password; use --no-password for an unencrypted key");
    }
    KILN_CHECK(rc, out, kiln_sign_seckey_generate(&sk));
    kiln_sign_pubkey pk;
    KILN_CHECK(rc, out, kiln_sign_seckey_pubkey(sk, &pk));
    KILN_CHECK(rc, out, kiln_sign_seckey_save(sk, kpath, pw, pwlen));
    rc = kiln_sign_pubkey_save(&pk, ppath);
    if (rc != KILN_OK) {
        unlink(kpath); /* no half pair */
        goto out;
    }
    char id[KILN_SIGN_KEYID_HEX], b64[KILN_SIGN_PUBKEY_B64];
    kiln_sign_keyid_hex(pk.keyid, id);
    kiln_sign_pubkey_base64(&pk, b64);
    printf("key id %s\nsecret key: %s (%s)\npublic key: %s\n%s\n", id, kpath,
           nopw ? "unencrypted" : "encrypted", ppath, b64);
out:
    if (pw) kiln_sign_secret_free(pw);
    kiln_sign_seckey_free(sk);
    free(kpath);
    free(ppath);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}
