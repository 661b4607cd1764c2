/* cmd_verify.c - kiln verify: a file's minisign signature, or a signed archive against a
 * trust policy. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

/* Verify a signed archive against a policy, unpack it (to --out, or a temporary directory
 * that is removed) and report the signers. */
static int verify_archive(const char *file, const char *trust, const char *sigpath,
                          const char *outdir) {
    kiln_sign_trust *t = NULL;
    char *sigs = NULL;
    size_t len = 0;
    kiln_sign_archive_report rep;
    int status = 0;
    kiln_err rc = kiln_sign_trust_load(trust, &t);
    if (rc != KILN_OK) {
        status = cli_fail(rc); /* the policy is configuration: 2 */
        goto out;
    }
    rc = kiln_read_file(sigpath, KILN_SIGN_ARCHIVE_SIGS_LIMIT, &sigs, &len);
    if (rc == KILN_OK) rc = kiln_sign_verify_archive(file, sigs, len, sigpath, t, outdir, &rep);
    if (rc != KILN_OK) {
        status = cli_check_fail(rc);
        goto out;
    }
    char hex[KILN_SHA256_HEX];
    kiln_hex(rep.info.manifest_sha256, 32, hex);
    printf("archive verified: %s\nmodel %s\nversion %s\nmanifest sha256:%s\nvalidation %s%s\n",
           file, rep.info.model, rep.info.version, hex,
           kiln_sign_validation_name(rep.info.validation),
           rep.info.validation != KILN_SIGN_VALIDATION_PASSED
               ? " (signed with allow-unvalidated; the policy accepts it)"
               : "");
    cli_print_signers(rep.signers, rep.nsigners, rep.threshold, " release keys");
    if (outdir)
        printf("every file matches the manifest; unpacked to %s\n", outdir);
    else
        printf("every file matches the manifest (checked without unpacking)\n");
out:
    kiln_sign_trust_free(t);
    free(sigs);
    return status;
}

int cmd_verify(int argc, char **argv) {
    const char *pub = NULL, *trust = NULL, *sigp = NULL, *outdir = NULL;
    const cli_opt opts[] = {
        {"pub", CLI_STR, &pub, "BASE.pub", "the public key that must have signed", false},
        {"trust", CLI_STR, &trust, "trust.json", "accept any release key of this trust policy",
         false},
        {"sig", CLI_STR, &sigp, "SIG", "signature file (default: FILE.minisig)", false},
        {"out", CLI_STR, &outdir, "DIR", "archives: unpack the verified archive to DIR", false},
        {0},
    };
    const cli_spec spec = {
        "kiln verify FILE (--pub BASE.pub | --trust trust.json) [--sig SIG]\n"
        "       kiln verify FILE.kiln --trust trust.json [--sig SIG] [--out DIR]",
        "Verify a minisign signature (key id, signature, trusted comment) and "
        "print the trusted comment.\nA .kiln archive is checked against the "
        "trust policy: every signature by a release key,\nenough distinct "
        "signers, the comment naming the archive's manifest, every file.\nExits "
        "1 when verification fails.",
        opts, 1, 1};
    const char *file;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &file, &st)) return st;
    if (cli_is_archive(file) && !trust)
        return cli_usage_error("'%s': an archive is verified against a trust policy: give --trust",
                               file);
    if (!cli_is_archive(file) && outdir)
        return cli_usage_error("--out applies to .kiln archives only");
    if (!pub == !trust) return cli_usage_error("give exactly one of --pub and --trust");
    char *sigpath = sigp ? kiln_strdup(sigp) : kiln_asprintf("%s.minisig", file);
    if (!sigpath) return cli_fail(KILN_ERR_NOMEM);
    if (cli_is_archive(file)) {
        int st = verify_archive(file, trust, sigpath, outdir);
        free(sigpath);
        return st;
    }
    kiln_sign_sig sig;
    kiln_sign_sig_init(&sig);
    kiln_sign_trust *t = NULL;
    kiln_sign_pubkey pk;
    const kiln_sign_trust_key *signer = NULL;
    int status = 0;
    /* The policy is configuration (2, as for archives and channel records); the signature
     * and the key are what is checked (1). */
    kiln_err rc = trust ? kiln_sign_trust_load(trust, &t) : KILN_OK;
    if (rc != KILN_OK) {
        status = cli_fail(rc);
        goto out;
    }
    rc = kiln_sign_sig_load(sigpath, &sig);
    if (rc == KILN_OK && pub) rc = kiln_sign_pubkey_load(pub, &pk);
    if (rc != KILN_OK) {
        status = cli_check_fail(rc);
        goto out;
    }
    rc = pub ? kiln_sign_verify_file(&pk, &sig, file)
             : kiln_sign_trust_verify_file(t, &sig, file, KILN_SIGN_ROLE_RELEASE, &signer);
    if (rc != KILN_OK) {
        status = cli_check_fail(rc);
        goto out;
    }
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(sig.keyid, id);
    if (signer)
        printf("signature verified: '%s' signed by key '%s' (key id %s, release)\n", file,
               signer->name, id);
    else
        printf("signature verified: '%s' signed by key id %s\n", file, id);
    printf("trusted comment: %s\n", sig.trusted_comment);
out:
    kiln_sign_sig_release(&sig);
    kiln_sign_trust_free(t);
    free(sigpath);
    return status;
}
