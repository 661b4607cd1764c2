/* cmd_sign.c - kiln sign: a minisign-compatible signature of a file, or a signed archive's
 * (sign/sign.h does the work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

/* Sign an archive and add the signature to its signature file (a new file for the first
 * signer, appended for the next). */
static int sign_archive(const char *file, const char *key, const char *sigpath,
                        bool allow_unvalidated) {
    kiln_sign_seckey *sk = NULL;
    char *text = NULL, *old = NULL, *all = NULL;
    size_t oldlen = 0;
    kiln_sign_archive_info info;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !kiln_path_exists(file), KILN_ERR_IO, "cannot open '%s': no such file",
                  file);
    KILN_CHECK(rc, out, cli_load_seckey(key, &sk));
    KILN_CHECK(rc, out, kiln_sign_archive(sk, file, allow_unvalidated, &text, &info));
    if (kiln_path_exists(sigpath))
        KILN_CHECK(rc, out, kiln_read_file(sigpath, KILN_SIGN_ARCHIVE_SIGS_LIMIT, &old, &oldlen));
    KILN_CHECK(rc, out, kiln_sign_archive_sigs_add(old, oldlen, sigpath, text, &all));
    KILN_CHECK(rc, out, kiln_write_file_atomic(sigpath, all, strlen(all)));
    kiln_sign_pubkey pk;
    char id[KILN_SIGN_KEYID_HEX], hex[KILN_SHA256_HEX];
    KILN_CHECK(rc, out, kiln_sign_seckey_pubkey(sk, &pk));
    kiln_sign_keyid_hex(pk.keyid, id);
    kiln_hex(info.manifest_sha256, 32, hex);
    printf("wrote %s (key id %s, %s signature)\n", sigpath, id, old ? "another" : "first");
    printf("archive %s %s, manifest sha256:%s, validation %s%s\n", info.model, info.version, hex,
           kiln_sign_validation_name(info.validation),
           info.allow_unvalidated ? " (signed with --allow-unvalidated)" : "");
out:
    kiln_sign_seckey_free(sk);
    free(text);
    free(old);
    free(all);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}

int cmd_sign(int argc, char **argv) {
    const char *key = NULL, *tc = NULL, *outp = NULL;
    bool legacy = false, unvalidated = false;
    const cli_opt opts[] = {
        {"key", CLI_STR, &key, "BASE.key", "the secret key", true},
        {"trusted-comment", CLI_STR, &tc, "TEXT",
         "one line signed with the file (default: timestamp and file name; not for archives)",
         false},
        {"out", CLI_STR, &outp, "SIG",
         "signature file (default: FILE.minisig; an archive's is appended to)", false},
        {"legacy", CLI_FLAG, &legacy, NULL, "sign the file itself ('Ed'), not its BLAKE2b-512 hash",
         false},
        {"allow-unvalidated", CLI_FLAG, &unvalidated, NULL,
         "sign an archive without a passing validation report (said in the trusted comment)",
         false},
        {0},
    };
    const cli_spec spec = {"kiln sign FILE --key BASE.key [--trusted-comment TEXT] [--out SIG]\n"
                           "       kiln sign FILE.kiln --key BASE.key [--allow-unvalidated] "
                           "[--out SIG]",
                           "Sign a file; writes FILE.minisig in minisign's format. A .kiln "
                           "archive is signed with a\ntrusted comment naming its model, version, "
                           "manifest and validation verdict; each further\nsigner's signature is "
                           "appended to the same file.",
                           opts, 1, 1};
    const char *file;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &file, &st)) return st;
    if (cli_is_archive(file) && (tc || legacy))
        return cli_usage_error("'%s': an archive's trusted comment is kiln's and its algorithm "
                               "'ED': --trusted-comment and --legacy do not apply",
                               file);
    if (!cli_is_archive(file) && unvalidated)
        return cli_usage_error("--allow-unvalidated applies to .kiln archives only");
    kiln_sign_seckey *sk = NULL;
    char *sigpath = outp ? kiln_strdup(outp) : kiln_asprintf("%s.minisig", file);
    if (!sigpath) return cli_fail(KILN_ERR_NOMEM);
    if (cli_is_archive(file)) {
        int st = sign_archive(file, key, sigpath, unvalidated);
        free(sigpath);
        return st;
    }
    char *deftc = NULL, *text = NULL, *buf = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !kiln_path_exists(file), KILN_ERR_IO, "cannot open '%s': no such file",
                  file);
    if (!tc) {
        deftc = kiln_sign_default_comment(file, kiln_unix_time());
        KILN_CHECK_IF(rc, out, !deftc, KILN_ERR_NOMEM, "out of memory");
        tc = deftc;
    }
    KILN_CHECK(rc, out, cli_load_seckey(key, &sk));
    if (legacy) {
        size_t len;
        KILN_CHECK(rc, out, kiln_read_file(file, (size_t)1 << 30, &buf, &len));
        KILN_CHECK(rc, out, kiln_sign_buffer(sk, buf, len, tc, KILN_SIGN_LEGACY, &text));
    } else {
        KILN_CHECK(rc, out, kiln_sign_file(sk, file, tc, &text));
    }
    KILN_CHECK(rc, out, kiln_write_file_atomic(sigpath, text, strlen(text)));
    kiln_sign_pubkey pk;
    char id[KILN_SIGN_KEYID_HEX];
    KILN_CHECK(rc, out, kiln_sign_seckey_pubkey(sk, &pk));
    kiln_sign_keyid_hex(pk.keyid, id);
    printf("wrote %s (key id %s)\n", sigpath, id);
out:
    kiln_sign_seckey_free(sk);
    free(sigpath);
    free(deftc);
    free(text);
    free(buf);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}
