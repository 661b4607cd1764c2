/* cmd_trust.c - kiln trust sign | verify | put | update: versions of the trust policy signed
 * by root keys (sign/rotate.c), stored by a registry and walked by clients
 * (registry/server/trustchain.c, registry/client/trustwalk.c). Options and messages follow
 * kiln channel sign / verify / put. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"
#include "sign.h"

static void print_policy(const kiln_sign_trust *t) {
    printf("version %llu\nkeys %zu (%d root, %d promote, %d release), root_threshold %d\n",
           (unsigned long long)kiln_sign_trust_version(t), kiln_sign_trust_key_count(t),
           kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT),
           kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_PROMOTE),
           kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_RELEASE),
           kiln_sign_trust_root_threshold(t));
}

/* The changes' lines, indented; "(none ...)" when only the version moved. */
static void print_changes(const char *changes) {
    if (!*changes) {
        printf("  (no changes besides the version)\n");
        return;
    }
    for (const char *p = changes; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        printf("  %.*s\n", (int)n, p);
        p += n + (nl ? 1 : 0);
    }
}

int cmd_trust_sign(int argc, char **argv) {
    const char *key = NULL, *outp = NULL, *add = NULL;
    const cli_opt opts[] = {
        {"key", CLI_STR, &key, "ROOT.key", "a root key (of this version or of the one before)",
         true},
        {"out", CLI_STR, &outp, "SIGNED.json", "where to write the signed policy (with --add: in "
                                               "place)",
         false},
        {"add", CLI_STR, &add, "SIGNED.json", "add this key's signature to a signed policy",
         false},
        {0},
    };
    const cli_spec spec = {"kiln trust sign POLICY.json --key ROOT.key --out SIGNED.json\n"
                           "       kiln trust sign --add SIGNED.json --key ROOT.key [--out "
                           "SIGNED2.json]",
                           "Sign a version of the trust policy with a root key, or add a root "
                           "key's signature to one.\nA new version needs the root quorum of the "
                           "version before it and its own.",
                           opts, 0, 1};
    char **pos = NULL;
    int npos = 0;
    int st = cli_parse(&spec, argc, argv, &pos, &npos);
    if (st) return st == CLI_HELP_SHOWN ? 0 : st;
    const char *policy = npos ? pos[0] : NULL;
    free(pos);
    if (add && policy)
        return cli_usage_error("--add takes the signed policy as it is: give no POLICY.json");
    if (!add && !(policy && outp))
        return cli_usage_error("a new signed policy needs POLICY.json and --out");
    const char *src = add ? add : policy, *dest = outp ? outp : add;
    char *buf = NULL, *text = NULL;
    size_t len = 0, tlen = 0;
    kiln_sign_seckey *sk = NULL;
    kiln_sign_trust *t = NULL;
    kiln_err rc = KILN_OK;
    if (!add && kiln_path_exists(outp)) {
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "'%s' exists already; use --add to sign it, or another --out", outp);
        goto out;
    }
    KILN_CHECK(rc, out, kiln_read_file(src, KILN_SIGN_TRUST_FILE_LIMIT, &buf, &len));
    /* The document is read before the key, so that a bad file never asks for a password. */
    KILN_CHECK(rc, out, kiln_sign_trust_parse(buf, len, src, &t));
    KILN_CHECK(rc, out, cli_load_seckey(key, &sk));
    rc = add ? kiln_sign_trust_add_signature(buf, len, src, sk, &text, &tlen)
             : kiln_sign_trust_sign(buf, len, src, sk, &text, &tlen);
    if (rc) goto out;
    KILN_CHECK(rc, out, kiln_write_file_atomic(dest, text, tlen));
    kiln_sign_pubkey pk;
    char id[KILN_SIGN_KEYID_HEX];
    KILN_CHECK(rc, out, kiln_sign_seckey_pubkey(sk, &pk));
    kiln_sign_keyid_hex(pk.keyid, id);
    size_t n = kiln_sign_trust_signatures(t) + 1;
    printf("signed trust policy %s (%zu signature%s; this one by key id %s)\n", dest, n,
           n == 1 ? "" : "s", id);
    print_policy(t);
out:
    kiln_sign_seckey_free(sk);
    kiln_sign_trust_free(t);
    free(buf);
    free(text);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}

/* The next version of the policy in buf (plain or signed: its policy), withdrawing digest:
 * the same keys and rules, version + 1, one more "withdrawn" entry. *out is new text (the
 * policy as kiln writes documents); nothing is checked here but the shape. */
static kiln_err withdrawal(const char *buf, size_t len, const char *src, uint64_t version,
                           const char *digest, const char *reason, char **out) {
    json_t *doc = NULL, *w = NULL, *e = NULL;
    KILN_TRY(kiln_json_parse(buf, len, src, &doc));
    json_t *pol = json_object_get(doc, "policy") ? json_object_get(doc, "policy") : doc;
    kiln_err rc = KILN_OK;
    w = json_object_get(pol, "withdrawn");
    if (!w) {
        w = json_array();
        if (!w || json_object_set_new(pol, "withdrawn", w)) w = NULL;
    }
    e = json_pack("{s:s, s:s}", "digest", digest, "reason", reason);
    KILN_CHECK_IF(rc, out,
                  !w || !e || json_array_append_new(w, e) ||
                      json_object_set_new(pol, "version", json_integer((json_int_t)version + 1)),
                  KILN_ERR_NOMEM, "out of memory");
    e = NULL;
    size_t n;
    *out = kiln_json_document(pol, &n);
    KILN_CHECK_IF(rc, out, !*out, KILN_ERR_NOMEM, "out of memory");
out:
    json_decref(e);
    json_decref(doc);
    return rc;
}

int cmd_trust_withdraw(int argc, char **argv) {
    const char *digest = NULL, *reason = NULL, *outp = NULL;
    const cli_opt opts[] = {
        {"digest", CLI_STR, &digest, "sha256:HEX", "the archive's digest (kiln models, provenance)",
         true},
        {"reason", CLI_STR, &reason, "TEXT", "why it is withdrawn (clients say it)", true},
        {"out", CLI_STR, &outp, "NEXT.json", "where to write the next version (a new file)", true},
        {0},
    };
    const cli_spec spec = {
        "kiln trust withdraw POLICY.json --digest sha256:HEX --reason TEXT --out NEXT.json",
        "Write the next version of the trust policy (POLICY.json plain or signed: the version in "
        "force), withdrawing an archive:\nno client installs it and no registry takes it, "
        "whoever signed it. Sign NEXT.json with kiln trust sign.",
        opts, 1, 1};
    const char *src;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &src, &st)) return st;
    char *buf = NULL, *text = NULL, *changes = NULL;
    size_t len = 0;
    kiln_sign_trust *t = NULL, *next = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, kiln_path_exists(outp), KILN_ERR_CONFLICT,
                  "'%s' exists already; give another --out", outp);
    KILN_CHECK(rc, out, kiln_read_file(src, KILN_SIGN_TRUST_FILE_LIMIT, &buf, &len));
    KILN_CHECK(rc, out, kiln_sign_trust_parse(buf, len, src, &t));
    const char *was = kiln_sign_trust_withdrawn(t, digest);
    KILN_CHECK_IF(rc, out, was, KILN_ERR_CONFLICT, "'%s' (version %llu) withdraws %s already: %s",
                  src, (unsigned long long)kiln_sign_trust_version(t), digest, was);
    KILN_CHECK(rc, out,
               withdrawal(buf, len, src, kiln_sign_trust_version(t), digest, reason, &text));
    /* Read back as every client will: the digest's and the reason's rules are the parser's. */
    KILN_CHECK(rc, out, kiln_sign_trust_parse(text, strlen(text), "--digest and --reason", &next));
    changes = kiln_sign_trust_diff(t, next);
    KILN_CHECK_IF(rc, out, !changes, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_write_file_atomic(outp, text, strlen(text)));
    printf("wrote %s: trust policy version %llu, after version %llu ('%s')\nchanges:\n", outp,
           (unsigned long long)kiln_sign_trust_version(next),
           (unsigned long long)kiln_sign_trust_version(t), src);
    print_changes(changes);
    printf("next: the root quorum of both versions signs it (kiln trust sign %s --key ROOT.key "
           "--out SIGNED.json, then --add), and kiln trust put gives it to the registry\n",
           outp);
out:
    kiln_sign_trust_free(t);
    kiln_sign_trust_free(next);
    free(buf);
    free(text);
    free(changes);
    return rc == KILN_OK ? 0 : cli_fail(rc);
}

int cmd_trust_verify(int argc, char **argv) {
    const char *trust = NULL;
    const cli_opt opts[] = {
        {"trust", CLI_STR, &trust, "CURRENT.json", "the version it must follow (plain or signed)",
         true},
        {0},
    };
    const cli_spec spec = {
        "kiln trust verify SIGNED.json --trust CURRENT.json",
        "Check a signed trust policy as the version after CURRENT: the version step, every "
        "signature,\nthe root quorum of both versions. Prints who signed and what changed. "
        "Exits 1 when it fails.",
        opts, 1, 1};
    const char *path;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &path, &st)) return st;
    kiln_sign_trust *cur = NULL, *next = NULL;
    char *buf = NULL, *changes = NULL;
    size_t len = 0;
    int status = 0;
    kiln_sign_trust_update_result res;
    kiln_err rc = kiln_sign_trust_load(trust, &cur);
    if (rc) {
        status = cli_fail(rc); /* the policy is configuration: 2 */
        goto out;
    }
    rc = kiln_read_file(path, KILN_SIGN_TRUST_FILE_LIMIT, &buf, &len);
    if (!rc) rc = kiln_sign_trust_update(cur, buf, len, path, &next, &res);
    if (rc) {
        status = cli_check_fail(rc);
        goto out;
    }
    changes = kiln_sign_trust_diff(cur, next);
    if (!changes) {
        status = cli_fail(KILN_ERR_NOMEM);
        goto out;
    }
    printf("trust policy verified: %s is version %llu, the successor of version %llu (%s)\n", path,
           (unsigned long long)res.to, (unsigned long long)res.from, trust);
    for (size_t i = 0; i < res.nsigs; i++) {
        char tw[64];
        if (res.sigs[i].old_root && res.sigs[i].new_root)
            snprintf(tw, sizeof tw, "versions %llu and %llu", (unsigned long long)res.from,
                     (unsigned long long)res.to);
        else
            snprintf(tw, sizeof tw, "version %llu only",
                     (unsigned long long)(res.sigs[i].old_root ? res.from : res.to));
        printf("signature %zu: %s (%s), root key of %s\n", i + 1, res.sigs[i].name,
               res.sigs[i].keyid, tw);
    }
    printf("root quorum of version %llu: %zu of %d required\n", (unsigned long long)res.from,
           res.nold, res.old_threshold);
    printf("root quorum of version %llu: %zu of %d required\n", (unsigned long long)res.to,
           res.nnew, res.new_threshold);
    printf("changes:\n");
    print_changes(changes);
out:
    kiln_sign_trust_free(cur);
    kiln_sign_trust_free(next);
    free(buf);
    free(changes);
    return status;
}

int cmd_trust_put(int argc, char **argv) {
    const char *url = NULL, *token = NULL;
    const cli_opt opts[] = {
        {"registry", CLI_STR, &url, "URL", "the registry", true},
        {"token", CLI_STR, &token, "T", "an admin token (default $KILN_REGISTRY_TOKEN)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln trust put SIGNED.json --registry URL [--token T]",
        "Give a registry the next version of its trust policy (from 'kiln trust sign'). The "
        "registry checks\nit against the version it holds and uses it for every check from then "
        "on; clients walk to it.",
        opts, 1, 1};
    const char *file;
    int st;
    if (!cli_parse_args(&spec, argc, argv, &file, &st)) return st;
    kiln_registry_client_opts c;
    cli_client_opts(&c, url, token, NULL);
    char *text = NULL;
    size_t len = 0;
    uint64_t v = 0;
    kiln_err rc = kiln_read_file(file, KILN_SIGN_TRUST_FILE_LIMIT, &text, &len);
    if (!rc) rc = kiln_registry_trust_put(&c, text, len, file, &v);
    free(text);
    if (rc) return cli_fail(rc);
    printf("trust policy version %llu stored by %s (in force there now)\n", (unsigned long long)v,
           url);
    return 0;
}

typedef struct walked {
    size_t from_state, from_registry;
} walked;

static void print_step(void *ctx, const kiln_registry_trust_step *s) {
    walked *w = ctx;
    if (s->from_state) {
        w->from_state++;
        printf("trust version %llu: accepted before (%s)\n", (unsigned long long)s->version,
               s->source);
        return;
    }
    w->from_registry++;
    printf("trust version %llu accepted from %s, signed by", (unsigned long long)s->version,
           s->source);
    for (size_t i = 0; i < s->res->nsigs; i++)
        printf("%s %s", i ? "," : "", s->res->sigs[i].name);
    printf("\n");
    print_changes(s->changes);
}

int cmd_trust_update(int argc, char **argv) {
    const char *trust = NULL, *state = NULL;
    cli_registries r = {0};
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &r.urls, "URL",
         "the registry; repeat it for mirrors (each that answers is walked)", true},
        {"trust", CLI_STR, &trust, "FILE", "the client's trust policy (its root of trust)", true},
        {"state", CLI_STR, &state, "DIR",
         "where accepted versions are kept (default ~/.local/state/kiln)", false},
        {"token", CLI_STR, &r.token, "T", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        CLI_TIMEOUT_OPT(&r.timeout),
        {0},
    };
    const cli_spec spec = {
        "kiln trust update --registry URL [--registry MIRROR]... --trust FILE [--state DIR] "
        "[--token T] [--timeout 5s]",
        "Walk the trust policy forward: from FILE through the versions accepted before (in "
        "DIR/trust)\nand those the registry has since, each checked against the one before and "
        "saved to DIR/trust.\nkiln pull does the same first. Exits 1 when a version does not "
        "verify.",
        opts, 0, 0};
    int st;
    if (!cli_registry_args(&spec, argc, argv, NULL, &r, false, &st)) return st;
    walked w = {0};
    kiln_sign_trust *t = NULL;
    kiln_err rc = kiln_registry_trust_walk_any(r.cs, r.n, trust, state, print_step, &w,
                                               cli_print_note, NULL, &t);
    cli_registries_release(&r);
    if (rc) return cli_fail(rc);
    if (kiln_sign_trust_role_count(t, KILN_SIGN_ROLE_ROOT) == 0) {
        kiln_sign_trust_free(t);
        return cli_fail(kiln_fail(KILN_ERR_VERIFY,
                                  "'%s' has no root keys, so no signed version can follow it: "
                                  "replace it by hand with the newest signed version",
                                  trust));
    }
    printf("trust policy at version %llu (%zu new from the registry)\n",
           (unsigned long long)kiln_sign_trust_version(t), w.from_registry);
    kiln_sign_trust_free(t);
    return 0;
}
