/* cmd_trust_init.c - kiln trust init: write a trust policy (version 1) from public key files
 * and channel thresholds, so that nobody has to copy the format out of examples/demo.sh.
 *
 *   kiln trust init --out trust.json --root-key root-a.pub --root-key root-b.pub \
 *       --root-threshold 2 --release-key release.pub --promote-key alice.pub \
 *       --promote-key bob.pub --channel staging:1 --channel production:2
 *
 * A key's name is its file's base name (alice.pub: "alice") or NAME=FILE; a key given under
 * several roles is one entry with those roles. The policy is checked by the same parser every
 * verifier uses before it is written, and an existing file is never replaced. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "sign.h"

/* The public key in a minisign .pub file: its last non-empty line (the first is the
 * untrusted comment). */
static kiln_err read_pubkey(const char *path, char *out, size_t cap) {
    char *text = NULL;
    size_t len = 0;
    KILN_TRY(kiln_read_file(path, 4096, &text, &len));
    if (strstr(text, "secret key")) {
        free(text);
        return kiln_fail(KILN_ERR_USAGE, "'%s' is a secret key file: give its public key (the "
                                         ".pub beside it); a policy holds no secrets", path);
    }
    char *line = NULL, *save = NULL;
    for (char *l = strtok_r(text, "\r\n", &save); l; l = strtok_r(NULL, "\r\n", &save))
        if (*l) line = l;
    kiln_err rc = KILN_OK;
    if (!line || strlen(line) >= cap)
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': no public key line (expected a .pub file from "
                                        "kiln keygen or minisign -G)", path);
    else
        snprintf(out, cap, "%s", line);
    free(text);
    return rc;
}

/* Add (or give a role to) the key of arg, "FILE.pub" or "NAME=FILE.pub". */
static kiln_err add_key(json_t *keys, const char *arg, const char *role) {
    const char *eq = strchr(arg, '='), *path = eq ? eq + 1 : arg;
    char name[128], pub[256];
    if (eq) {
        KILN_FAIL_IF(eq == arg || (size_t)(eq - arg) >= sizeof name, KILN_ERR_USAGE,
                     "--%s-key '%s': expected FILE.pub or NAME=FILE.pub", role, arg);
        memcpy(name, arg, (size_t)(eq - arg));
        name[eq - arg] = 0;
    } else {
        const char *base = strrchr(path, '/');
        snprintf(name, sizeof name, "%s", base ? base + 1 : path);
        size_t n = strlen(name);
        if (n > 4 && !strcmp(name + n - 4, ".pub")) name[n - 4] = 0;
    }
    KILN_TRY(read_pubkey(path, pub, sizeof pub));
    size_t i;
    json_t *k;
    json_array_foreach(keys, i, k) {
        const char *kp = json_string_value(json_object_get(k, "pubkey")),
                   *kn = json_string_value(json_object_get(k, "name"));
        if (strcmp(kp, pub) && strcmp(kn, name)) continue;
        KILN_FAIL_IF(strcmp(kp, pub), KILN_ERR_USAGE,
                     "two keys are named '%s' ('%s' and an earlier one): name one NAME=FILE",
                     name, path);
        KILN_FAIL_IF(strcmp(kn, name), KILN_ERR_USAGE,
                     "'%s' is the key already given as '%s': give it one name", path, kn);
        json_t *roles = json_object_get(k, "roles");
        size_t j;
        json_t *r;
        json_array_foreach(roles, j, r) KILN_FAIL_IF(
            !strcmp(json_string_value(r), role), KILN_ERR_USAGE,
            "key '%s' is given as a %s key twice", name, role);
        KILN_FAIL_IF(json_array_append_new(roles, json_string(role)), KILN_ERR_NOMEM,
                     "out of memory");
        return KILN_OK;
    }
    k = json_pack("{s:s,s:s,s:[s]}", "name", name, "pubkey", pub, "roles", role);
    KILN_FAIL_IF(!k || json_array_append_new(keys, k), KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

/* "NAME:THRESHOLD" into channels. */
static kiln_err add_channel(json_t *channels, const char *arg) {
    const char *colon = strrchr(arg, ':');
    char *end = NULL;
    long th = colon ? strtol(colon + 1, &end, 10) : 0;
    KILN_FAIL_IF(!colon || colon == arg || !end || *end || end == colon + 1 || th < 1 ||
                     th > 100,
                 KILN_ERR_USAGE,
                 "--channel '%s': expected NAME:THRESHOLD (production:2: two promote keys sign "
                 "each of its records)",
                 arg);
    char name[128];
    KILN_FAIL_IF((size_t)(colon - arg) >= sizeof name, KILN_ERR_USAGE,
                 "--channel '%s': the name is too long", arg);
    memcpy(name, arg, (size_t)(colon - arg));
    name[colon - arg] = 0;
    KILN_FAIL_IF(json_object_get(channels, name), KILN_ERR_USAGE, "--channel '%s' given twice",
                 name);
    KILN_FAIL_IF(json_object_set_new(channels, name, json_pack("{s:I}", "threshold", (json_int_t)th)),
                 KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

int cmd_trust_init(int argc, char **argv) {
    const char *outp = NULL;
    cli_list roots = {0}, releases = {0}, promotes = {0}, channels = {0};
    long root_threshold = 0;
    bool accept_unvalidated = false;
    const cli_opt opts[] = {
        {"out", CLI_STR, &outp, "FILE.json", "the policy to write (never replaced)", true},
        {"root-key", CLI_MULTI, &roots, "[NAME=]FILE.pub",
         "a root key: signs the policy's next versions (repeat for several)", false},
        {"root-threshold", CLI_INT, &root_threshold, "N",
         "root signatures a next version needs (default: all the root keys, at most 2)", false},
        {"release-key", CLI_MULTI, &releases, "[NAME=]FILE.pub",
         "a release key: signs archives (repeat for several)", true},
        {"promote-key", CLI_MULTI, &promotes, "[NAME=]FILE.pub",
         "a promote key: signs channel records (repeat for several)", false},
        {"channel", CLI_MULTI, &channels, "NAME:THRESHOLD",
         "a channel and the promote signatures each of its records needs", false},
        {"accept-unvalidated", CLI_FLAG, &accept_unvalidated, NULL,
         "accept archives signed without a passing validation report (tests, not production)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln trust init --out FILE.json --release-key FILE.pub [--root-key FILE.pub ...] "
        "[--root-threshold N]\n"
        "       [--promote-key FILE.pub ...] [--channel NAME:THRESHOLD ...] "
        "[--accept-unvalidated]",
        "Write version 1 of a trust policy: who may sign releases, promotions and the policy's "
        "next versions,\nand how many promote signatures each channel needs. A key's name is "
        "its file's base name\n(alice.pub: alice) or NAME=FILE.pub. Checked as every verifier "
        "checks it before it is written.",
        opts, 0, 0};
    int st;
    if (!cli_parse_args(&spec, argc, argv, NULL, &st)) goto done;
    st = 2;
    json_t *keys = json_array(), *chans = json_object(), *policy = NULL;
    kiln_sign_trust *t = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !keys || !chans, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, kiln_path_exists(outp), KILN_ERR_CONFLICT,
                  "'%s' exists: a trust policy is never replaced (the next version is "
                  "'kiln trust withdraw' or an edit, signed with 'kiln trust sign')",
                  outp);
    for (int i = 0; i < roots.n; i++) KILN_CHECK(rc, out, add_key(keys, roots.v[i], "root"));
    for (int i = 0; i < releases.n; i++)
        KILN_CHECK(rc, out, add_key(keys, releases.v[i], "release"));
    for (int i = 0; i < promotes.n; i++)
        KILN_CHECK(rc, out, add_key(keys, promotes.v[i], "promote"));
    for (int i = 0; i < channels.n; i++) KILN_CHECK(rc, out, add_channel(chans, channels.v[i]));
    KILN_CHECK_IF(rc, out, channels.n && !promotes.n, KILN_ERR_USAGE,
                  "--channel needs at least one --promote-key to sign its records");
    KILN_CHECK_IF(rc, out, root_threshold && !roots.n, KILN_ERR_USAGE,
                  "--root-threshold needs --root-key");
    if (!root_threshold) root_threshold = roots.n < 2 ? roots.n : 2;
    policy = json_pack("{s:s,s:I,s:O,s:O}", "format", "kiln-trust/1", "version", (json_int_t)1,
                       "keys", keys, "channels", chans);
    KILN_CHECK_IF(rc, out, !policy, KILN_ERR_NOMEM, "out of memory");
    if (roots.n)
        KILN_CHECK_IF(rc, out,
                      json_object_set_new(policy, "root_threshold",
                                          json_integer((json_int_t)root_threshold)),
                      KILN_ERR_NOMEM, "out of memory");
    if (accept_unvalidated)
        KILN_CHECK_IF(rc, out, json_object_set_new(policy, "accept_unvalidated", json_true()),
                      KILN_ERR_NOMEM, "out of memory");
    /* What every verifier will make of it, before a byte is written. */
    size_t len = 0;
    char *doc = kiln_json_document(policy, &len);
    KILN_CHECK_IF(rc, out, !doc, KILN_ERR_NOMEM, "out of memory");
    rc = kiln_sign_trust_parse(doc, len, outp, &t);
    free(doc);
    if (rc) goto out;
    KILN_CHECK(rc, out, kiln_json_write_file(outp, policy));
    printf("wrote %s: trust policy version 1, %zu key%s", outp, json_array_size(keys),
           json_array_size(keys) == 1 ? "" : "s");
    if (roots.n) printf(", root threshold %ld", root_threshold);
    const char *name;
    json_t *c;
    json_object_foreach(chans, name, c) printf(", %s needs %lld", name,
                                               (long long)json_integer_value(
                                                   json_object_get(c, "threshold")));
    printf("\n");
    st = 0;
out:
    if (rc) st = cli_fail(rc);
    kiln_sign_trust_free(t);
    json_decref(policy);
    json_decref(keys);
    json_decref(chans);
done:
    free(roots.v);
    free(releases.v);
    free(promotes.v);
    free(channels.v);
    return st;
}
