/* cmd_channel.c - kiln channel sign | verify | put | history: signed channel records,
 * made and checked here (sign/sign.h), put into and listed from a registry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

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
        status = cli_check_fail(rc);
        goto out;
    }
    printf("channel record verified: %s\n", path);
    print_record(&r);
    cli_print_signers(res.signers, res.nsigners, res.threshold, "");
out:
    kiln_sign_trust_free(t);
    kiln_sign_record_release(&r);
    return status;
}

int cmd_channel_put(int argc, char **argv) {
    const char *url = NULL, *token = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "a promote token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    cli_spec spec = {
        "kiln channel put REC.json --registry URL [--token T]",
        "Put a signed channel record (from 'kiln channel sign', co-signed with --add).", opts, 1,
        1};
    const char *file;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &file, &rc)) return rc;
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, NULL);
    char *text = NULL;
    size_t len = 0;
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    kiln_err e = kiln_read_file(file, 1u << 20, &text, &len);
    if (!e) e = kiln_sign_record_parse(text, len, file, &r);
    if (!e) e = kiln_registry_put_channel(&c, r.model, r.channel, text, len);
    if (!e)
        printf("%s/%s -> %s seq %llu (%zu signature%s)\n", r.model, r.channel, r.version,
               (unsigned long long)r.seq, r.nsigs, r.nsigs == 1 ? "" : "s");
    kiln_sign_record_release(&r);
    free(text);
    return e ? cli_fail(e) : 0;
}

int cmd_channel_history(int argc, char **argv) {
    const char *url = NULL, *token = NULL, *channel = NULL;
    const cli_opt opts[] = {
        {"channel", CLI_STR, &channel, "C", "the channel", true},
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    cli_spec spec = {"kiln channel history NAME --channel C --registry URL [--token T]",
                     "List a channel's records by seq as the registry reports them (promotions "
                     "and rollbacks; kiln pull verifies the current one).",
                     opts, 1, 1};
    const char *name;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &name, &rc)) return rc;
    char model[KILN_REGISTRY_NAME_MAX + 1];
    snprintf(model, sizeof model, "%s", name);
    if (kiln_registry_check_name("model", model) || kiln_registry_check_name("channel", channel))
        return cli_fail(KILN_ERR_USAGE);
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, NULL);
    char *path = kiln_asprintf("/v1/models/%s/channels/%s/history", model, channel);
    json_t *h = NULL;
    kiln_err e = path ? kiln_registry_get_json(&c, path, &h) : KILN_ERR_NOMEM;
    free(path);
    if (e) return cli_fail(e);
    /* Columns sized to what they hold; the reason, free text, goes last. */
    json_t *recs = json_object_get(h, "records"), *x;
    size_t i;
    int wv = 7, wp = 6, ws = 3, n;
    json_array_foreach(recs, i, x) {
        const json_t *body = json_object_get(json_object_get(x, "record"), "record");
        char seq[24];
        n = snprintf(seq, sizeof seq, "%lld",
                     (long long)json_integer_value(json_object_get(body, "seq")));
        if (n > ws) ws = n;
        if ((n = (int)strlen(cli_jstr(body, "version"))) > wv) wv = n;
        if ((n = (int)strlen(cli_jstr(x, "publisher"))) > wp) wp = n;
    }
    printf("%-*s  %-*s  %-19s  %-4s  %-*s  %-20s  %s\n", ws, "seq", wv, "version", "digest", "sigs",
           wp, "put by", "at", "reason");
    json_array_foreach(recs, i, x) {
        const json_t *file = json_object_get(x, "record"), *body = json_object_get(file, "record");
        printf("%-*lld  %-*s  %-19.19s  %-4zu  %-*s  %-20s  %s\n", ws,
               (long long)json_integer_value(json_object_get(body, "seq")), wv,
               cli_jstr(body, "version"), cli_jstr(body, "digest"),
               json_array_size(json_object_get(file, "signatures")), wp, cli_jstr(x, "publisher"),
               cli_jstr(x, "created"), cli_jstr(body, "reason"));
    }
    json_decref(h);
    return 0;
}
