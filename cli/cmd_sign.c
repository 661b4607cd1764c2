/* cmd_sign.c - kiln keygen, sign, verify, channel sign, channel verify: minisign-compatible
 * keys and signatures and signed channel records (sign/sign.h does the work). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

/* Failures of a check (a bad signature, a malformed signature, record or key given to
 * verify) exit 1; usage and I/O problems exit 2. */
static int check_fail(kiln_err rc) {
    cli_fail(rc);
    return rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT ? 1 : 2;
}

/* ---- passwords ------------------------------------------------------------------- */

/* Read one line from the terminal with echo off into guarded memory. */
static kiln_err tty_password(const char *prompt, char *pw, size_t *len) {
    int fd = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY);
    KILN_FAIL_IF(fd < 0, KILN_ERR_USAGE,
                 "no terminal to read the password from; set KILN_PASSWORD_FILE to a file that "
                 "holds it");
    struct termios old, quiet;
    bool restore = tcgetattr(fd, &old) == 0;
    if (restore) {
        quiet = old;
        quiet.c_lflag &= ~(tcflag_t)ECHO;
        quiet.c_lflag |= ECHONL;
        tcsetattr(fd, TCSAFLUSH, &quiet);
    }
    if (write(fd, prompt, strlen(prompt)) < 0) { /* the prompt is a courtesy */
    }
    kiln_err rc = KILN_OK;
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || c == '\n') break;
        if (n >= KILN_SIGN_PASSWORD_MAX) {
            rc = kiln_fail(KILN_ERR_USAGE, "the password is longer than %d bytes",
                           KILN_SIGN_PASSWORD_MAX);
            break;
        }
        pw[n++] = c;
    }
    if (restore) tcsetattr(fd, TCSAFLUSH, &old);
    close(fd);
    if (n && pw[n - 1] == '\r') n--;
    pw[n] = 0;
    *len = n;
    return rc;
}

/* A password in guarded memory (kiln_sign_secret_free it): $KILN_PASSWORD_FILE's first line when
 * set (for automation), else the terminal, asked twice when confirm. */
static kiln_err get_password(const char *prompt, bool confirm, char **out, size_t *len) {
    *out = NULL;
    char *pw = kiln_sign_secret_alloc(KILN_SIGN_PASSWORD_MAX + 1);
    if (!pw) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    const char *file = getenv("KILN_PASSWORD_FILE");
    if (file && *file) {
        char *buf;
        size_t n;
        KILN_CHECK(rc, fail, kiln_read_file(file, 64u << 10, &buf, &n));
        char *nl = memchr(buf, '\n', n);
        size_t l = nl ? (size_t)(nl - buf) : n;
        if (l && buf[l - 1] == '\r') l--;
        if (l > KILN_SIGN_PASSWORD_MAX) {
            rc = kiln_fail(KILN_ERR_USAGE, "'%s': the password is longer than %d bytes", file,
                           KILN_SIGN_PASSWORD_MAX);
        } else {
            memcpy(pw, buf, l);
            pw[l] = 0;
            *len = l;
        }
        kiln_sign_wipe(buf, n);
        free(buf);
        if (rc != KILN_OK) goto fail;
    } else {
        KILN_CHECK(rc, fail, tty_password(prompt, pw, len));
        if (confirm) {
            char *again = kiln_sign_secret_alloc(KILN_SIGN_PASSWORD_MAX + 1);
            size_t alen = 0;
            KILN_CHECK_IF(rc, fail, !again, KILN_ERR_NOMEM, "out of guarded memory");
            rc = tty_password("Password (again): ", again, &alen);
            bool same = rc == KILN_OK && alen == *len && kiln_sign_secret_equal(again, pw, alen);
            kiln_sign_secret_free(again);
            if (rc != KILN_OK) goto fail;
            KILN_CHECK_IF(rc, fail, !same, KILN_ERR_USAGE, "the passwords do not match");
        }
    }
    *out = pw;
    return KILN_OK;
fail:
    kiln_sign_secret_free(pw);
    return rc;
}

kiln_err cli_load_seckey(const char *path, kiln_sign_seckey **out) {
    KILN_TRY(kiln_sign_seckey_load(path, out));
    if (!kiln_sign_seckey_encrypted(*out)) return KILN_OK;
    char *pw, prompt[512];
    size_t len;
    snprintf(prompt, sizeof prompt, "Password for '%s': ", path);
    kiln_err rc = get_password(prompt, false, &pw, &len);
    if (rc == KILN_OK) {
        rc = kiln_sign_seckey_decrypt(*out, pw, len);
        kiln_sign_secret_free(pw);
    }
    if (rc != KILN_OK) {
        kiln_sign_seckey_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- keygen ---------------------------------------------------------------------- */

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
        KILN_CHECK(rc, out, get_password("Password for the new secret key: ", true, &pw, &pwlen));
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

/* ---- sign / verify --------------------------------------------------------------- */

/* A .kiln archive (by its name) is signed and verified as a signed archive
 * (docs/formats.md, "signed archive"); any other file as a plain minisign signature. */
static bool is_archive(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcmp(path + n - 5, ".kiln");
}

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
    if (is_archive(file) && (tc || legacy))
        return cli_usage_error("'%s': an archive's trusted comment is kiln's and its algorithm "
                               "'ED': --trusted-comment and --legacy do not apply",
                               file);
    if (!is_archive(file) && unvalidated)
        return cli_usage_error("--allow-unvalidated applies to .kiln archives only");
    kiln_sign_seckey *sk = NULL;
    char *sigpath = outp ? kiln_strdup(outp) : kiln_asprintf("%s.minisig", file);
    if (!sigpath) return cli_fail(KILN_ERR_NOMEM);
    if (is_archive(file)) {
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

/* "signed by NAME (KEYID), ...: N of T required<what>" for the keys of a policy that signed. */
static void print_signers(const kiln_sign_trust_key *const *signers, size_t n, int threshold,
                          const char *what) {
    printf("signed by");
    for (size_t i = 0; i < n; i++) {
        char id[KILN_SIGN_KEYID_HEX];
        kiln_sign_keyid_hex(signers[i]->pub.keyid, id);
        printf("%s %s (%s)", i ? "," : "", signers[i]->name, id);
    }
    printf(": %zu of %d required%s\n", n, threshold, what);
}

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
        status = check_fail(rc);
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
    print_signers(rep.signers, rep.nsigners, rep.threshold, " release keys");
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
    if (is_archive(file) && !trust)
        return cli_usage_error("'%s': an archive is verified against a trust policy: give --trust",
                               file);
    if (!is_archive(file) && outdir) return cli_usage_error("--out applies to .kiln archives only");
    if (!pub == !trust) return cli_usage_error("give exactly one of --pub and --trust");
    char *sigpath = sigp ? kiln_strdup(sigp) : kiln_asprintf("%s.minisig", file);
    if (!sigpath) return cli_fail(KILN_ERR_NOMEM);
    if (is_archive(file)) {
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
        status = check_fail(rc);
        goto out;
    }
    rc = pub ? kiln_sign_verify_file(&pk, &sig, file)
             : kiln_sign_trust_verify_file(t, &sig, file, KILN_SIGN_ROLE_RELEASE, &signer);
    if (rc != KILN_OK) {
        status = check_fail(rc);
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

/* ---- channel records --------------------------------------------------------------- */

static kiln_err parse_digest(const char *s, uint8_t d[32]) {
    const char *hex = strncmp(s, "sha256:", 7) == 0 ? s + 7 : s;
    KILN_FAIL_IF(
        strlen(hex) != 64 || !kiln_unhex(hex, d, 32), KILN_ERR_USAGE,
        "--digest: '%s' is not a sha256 digest (64 hex digits, optionally after 'sha256:')", s);
    return KILN_OK;
}

static void print_record(const kiln_sign_record *r) {
    char hex[KILN_SHA256_HEX], exp[21];
    kiln_hex(r->digest, 32, hex);
    kiln_format_time(r->expires, exp);
    printf("model %s\nchannel %s\nversion %s\ndigest sha256:%s\nseq %llu\nexpires %s\nreason %s\n",
           r->model, r->channel, r->version, hex, (unsigned long long)r->seq, exp, r->reason);
}

int cmd_channel_sign(int argc, char **argv) {
    const char *model = NULL, *channel = NULL, *version = NULL, *digest = NULL, *expires = NULL,
               *reason = NULL, *key = NULL, *outp = NULL, *add = NULL;
    uint64_t seq = 0;
    const cli_opt opts[] = {
        {"model", CLI_STR, &model, "NAME", "the model", false},
        {"channel", CLI_STR, &channel, "NAME", "the channel (production, staging, ...)", false},
        {"version", CLI_STR, &version, "VERSION", "the version the channel points at", false},
        {"digest", CLI_STR, &digest, "SHA256", "sha256 of the .kiln archive", false},
        {"seq", CLI_U64, &seq, "N", "sequence number, higher than the channel's last", false},
        {"expires", CLI_STR, &expires, "DUR|TIME", "30d, 12h, 90m, 3600s or 2026-12-31T00:00:00Z",
         false},
        {"reason", CLI_STR, &reason, "TEXT", "why (kept in the record)", false},
        {"key", CLI_STR, &key, "BASE.key", "a promote key", true},
        {"out", CLI_STR, &outp, "REC.json", "where to write the record (with --add: in place)",
         false},
        {"add", CLI_STR, &add, "REC.json", "add this key's signature to an existing record", false},
        {0},
    };
    const cli_spec spec = {
        "kiln channel sign --model M --channel C --version V --digest SHA256 --seq N --expires "
        "DUR|TIME --reason TEXT --key K.key --out REC.json\n"
        "       kiln channel sign --add REC.json --key K.key [--out REC2.json]",
        "Create and sign a channel record, or add a signature to one.", opts, 0, 0};
    int st;
    if (!cli_parse_args(&spec, argc, argv, NULL, &st)) return st;
    bool body = model || channel || version || digest || seq || expires || reason;
    if (add && body)
        return cli_usage_error("--add takes the record as it is: give only --key and --out");
    if (!add && !(model && channel && version && digest && seq && expires && reason && outp))
        return cli_usage_error("a new record needs --model, --channel, --version, --digest, "
                               "--seq, --expires, --reason and --out");
    const char *dest = outp ? outp : add;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_sign_seckey *sk = NULL;
    kiln_err rc = KILN_OK;
    if (add) {
        rc = kiln_sign_record_load(add, &r);
    } else {
        uint8_t d[32];
        int64_t exp = 0;
        if (kiln_path_exists(outp)) {
            rc = kiln_fail(KILN_ERR_CONFLICT,
                           "'%s' exists already; use --add to sign it, or another --out", outp);
            goto out;
        }
        rc = parse_digest(digest, d);
        if (rc == KILN_OK) rc = cli_parse_expiry(expires, kiln_unix_time(), &exp);
        if (rc == KILN_OK && exp <= kiln_unix_time())
            rc = kiln_fail(KILN_ERR_USAGE, "--expires: '%s' is in the past", expires);
        if (rc == KILN_OK)
            rc = kiln_sign_record_set(&r, model, channel, version, d, seq, exp, reason);
    }
    if (rc != KILN_OK) goto out;
    KILN_CHECK(rc, out, cli_load_seckey(key, &sk));
    rc = kiln_sign_record_add_signature(&r, sk);
    if (rc != KILN_OK) {
        kiln_errprefix(rc, "'%s': ", add ? add : outp);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_sign_record_save(&r, dest));
    printf("signed channel record %s (%zu signature%s)\n", dest, r.nsigs, r.nsigs == 1 ? "" : "s");
    print_record(&r);
out:
    kiln_sign_seckey_free(sk);
    kiln_sign_record_release(&r);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}

int cmd_channel_verify(int argc, char **argv) {
    const char *trust = NULL, *now_s = NULL;
    uint64_t min_seq = 0;
    const cli_opt opts[] = {
        {"trust", CLI_STR, &trust, "trust.json", "the trust policy", true},
        {"now", CLI_STR, &now_s, "TIME", "check expiry at this RFC 3339 time (default: now)",
         false},
        {"min-seq", CLI_U64, &min_seq, "N", "refuse a seq lower than N (the last accepted)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln channel verify REC.json --trust trust.json [--now TIME] [--min-seq N]",
        "Verify a channel record: signatures by distinct promote keys up to the "
        "channel's threshold,\nexpiry and seq. Exits 1 when verification fails.",
        opts, 1, 1};
    const char *path;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &path, &st)) return st;
    int64_t now = kiln_unix_time();
    if (now_s && kiln_sign_parse_time(now_s, "--now", &now) != KILN_OK)
        return cli_fail(KILN_ERR_USAGE);
    kiln_sign_trust *t = NULL;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_sign_record_result res;
    int status = 0;
    kiln_err rc = kiln_sign_trust_load(trust, &t);
    if (rc != KILN_OK) {
        status = cli_fail(rc); /* the policy is configuration: 2 */
        goto out;
    }
    rc = kiln_sign_record_load(path, &r);
    if (rc == KILN_OK) rc = kiln_sign_record_verify(&r, t, now, min_seq, path, &res);
    if (rc != KILN_OK) {
        status = check_fail(rc);
        goto out;
    }
    printf("channel record verified: %s\n", path);
    print_record(&r);
    print_signers(res.signers, res.nsigners, res.threshold, "");
out:
    kiln_sign_trust_free(t);
    kiln_sign_record_release(&r);
    return status;
}
