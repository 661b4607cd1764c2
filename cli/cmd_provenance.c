/* cmd_provenance.c - kiln provenance: registry/client/provenance.c's answer as text (a line per
 * fact, each with where it came from and whether it verified) or as the JSON itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "registry.h"

/* "[verified: how]", "[FAILED: how]", "[registry's word: how]", "[not checked: how]". */
static void tag(const json_t *chk) {
    const char *st = json_string_value(json_object_get(chk, "status"));
    const char *how = json_string_value(json_object_get(chk, "how"));
    if (!st) return;
    const char *word = !strcmp(st, "verified")   ? "verified"
                       : !strcmp(st, "failed")   ? "FAILED"
                       : !strcmp(st, "registry") ? "registry's word"
                                                 : st;
    printf("  [%s%s%s]", word, how && *how ? ": " : "", how ? how : "");
}

static void line_end(const json_t *chk) {
    tag(chk);
    putchar('\n');
}

/* "name KEYID, name KEYID" of [{"name", "keyid"}] (a name null: "KEYID (why)"). */
static void keys(const json_t *arr, const char *why_key) {
    size_t i;
    json_t *k;
    json_array_foreach(arr, i, k) {
        const char *name = json_string_value(json_object_get(k, "name"));
        const char *why = why_key ? json_string_value(json_object_get(k, why_key)) : NULL;
        printf("%s%s%s%s", i ? ", " : "", name ? name : "", name ? " " : "", cli_jstr(k, "keyid"));
        if (why && strcmp(why, "verified")) printf(" (%s)", why);
    }
    if (!json_array_size(arr)) printf("nobody");
}

/* A number as the report or card has it (reals to 6 significant digits). */
static void value(const json_t *v) {
    if (json_is_integer(v))
        printf("%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        printf("%.6g", json_real_value(v));
    else if (json_is_string(v))
        printf("%s", json_string_value(v));
    else if (json_is_boolean(v))
        printf("%s", json_is_true(v) ? "true" : "false");
    else
        printf("null");
}

static void print_trust(const json_t *t) {
    printf("trust       policy version %lld, walked from '%s' (version %lld)",
           cli_jint(t, "version"), cli_jstr(t, "file"), cli_jint(t, "file_version"));
    line_end(json_object_get(t, "check"));
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(t, "walk"), i, s) {
        printf("              v%lld from %s %s, signed by ", cli_jint(s, "version"),
               cli_jstr(s, "from"), cli_jstr(s, "source"));
        size_t j;
        json_t *k;
        json_array_foreach(json_object_get(s, "signed_by"), j, k)
            printf("%s%s %s (%s)", j ? ", " : "", cli_jstr(k, "name"), cli_jstr(k, "keyid"),
                   cli_jstr(k, "quorum"));
        putchar('\n');
        json_array_foreach(json_object_get(s, "changes"), j, k)
            printf("                %s\n", json_string_value(k));
    }
    const json_t *rt = json_object_get(t, "root_threshold");
    if (json_is_integer(rt)) {
        printf("              root quorum %lld of %zu: ", (long long)json_integer_value(rt),
               json_array_size(json_object_get(t, "root_keys")));
        keys(json_object_get(t, "root_keys"), NULL);
        putchar('\n');
    } else {
        printf("              no root keys: the policy has no versions after it\n");
    }
    printf("              release threshold %lld of %zu: ", cli_jint(t, "release_threshold"),
           json_array_size(json_object_get(t, "release_keys")));
    keys(json_object_get(t, "release_keys"), NULL);
    printf("%s\n", json_is_true(json_object_get(t, "accept_unvalidated"))
                       ? "; accepts unvalidated archives"
                       : "");
}

static void print_channel(const json_t *c) {
    if (!json_object_get(c, "seq")) {
        printf("channel     %s", cli_jstr(c, "name"));
        line_end(json_object_get(c, "check"));
        return;
    }
    const char *from = json_string_value(json_object_get(c, "from"));
    printf("channel     %s seq %lld -> %s %s (%s%s%s)\n", cli_jstr(c, "name"), cli_jint(c, "seq"),
           cli_jstr(c, "version"), cli_jstr(c, "digest"), cli_jstr(c, "change"),
           from ? " from " : "", from ? from : "");
    printf("              signed by ");
    keys(json_object_get(c, "signatures"), "status");
    const json_t *th = json_object_get(c, "threshold");
    if (json_is_integer(th)) printf("; the channel needs %lld", (long long)json_integer_value(th));
    line_end(json_object_get(c, "check"));
    printf("              seq %lld", cli_jint(c, "seq"));
    line_end(json_object_get(c, "seq_check"));
    printf("              expires %s%s", cli_jstr(c, "expires"),
           json_is_true(json_object_get(c, "expired")) ? " (EXPIRED)" : "");
    line_end(json_object_get(c, "expiry_check"));
    printf("              reason '%s'\n", cli_jstr(c, "reason"));
    if (json_is_string(json_object_get(c, "put_by"))) {
        printf("              put by %s at %s", cli_jstr(c, "put_by"), cli_jstr(c, "put_at"));
        line_end(json_object_get(c, "put_check"));
    }
    const json_t *h = json_object_get(c, "history");
    size_t n = json_array_size(h);
    if (!n) {
        printf("  history   none before it\n");
        return;
    }
    /* Newest first, as an incident review reads it; a rollback says so. */
    for (size_t i = n; i-- > 0;) {
        const json_t *r = json_array_get(h, i);
        printf("%s", i == n - 1 ? "  history   " : "            ");
        if (!json_is_integer(json_object_get(r, "seq"))) {
            printf("a record");
            line_end(json_object_get(r, "check"));
            continue;
        }
        const char *from = json_string_value(json_object_get(r, "from"));
        printf("seq %lld -> %s (%s%s%s) '%s', signed by ", cli_jint(r, "seq"),
               cli_jstr(r, "version"), cli_jstr(r, "change"), from ? " from " : "",
               from ? from : "", cli_jstr(r, "reason"));
        keys(json_object_get(r, "signatures"), "status");
        printf(", put by %s at %s", cli_jstr(r, "put_by"), cli_jstr(r, "put_at"));
        line_end(json_object_get(r, "check"));
    }
}

static void print_archive(const json_t *a) {
    if (!json_object_get(a, "digest")) {
        printf("archive     ");
        line_end(json_object_get(a, "check"));
        return;
    }
    printf("archive     %s, %lld bytes", cli_jstr(a, "digest"), cli_jint(a, "size"));
    line_end(json_object_get(a, "digest_check"));
    printf("              published by %s at %s", cli_jstr(a, "published_by"),
           cli_jstr(a, "published_at"));
    line_end(json_object_get(a, "publish_check"));
    printf("              manifest sha256:%s", cli_jstr(a, "manifest_sha256"));
    line_end(json_object_get(a, "manifest_check"));
    printf("              release signatures: ");
    keys(json_object_get(a, "signatures"), NULL);
    const json_t *v = json_object_get(a, "verdict");
    if (json_is_string(v)) printf("; trusted comment validation:%s", json_string_value(v));
    line_end(json_object_get(a, "signature_check"));
    const json_t *d = json_object_get(a, "download");
    if (d) {
        printf("              download");
        line_end(json_object_get(d, "check"));
        if (json_object_get(d, "card_check")) {
            printf("              card.json served beside it");
            line_end(json_object_get(d, "card_check"));
        }
        if (json_object_get(d, "validation_text_check")) {
            printf("              validation.json served beside it");
            line_end(json_object_get(d, "validation_text_check"));
        }
    }
}

static void print_lineage(const json_t *l) {
    printf("lineage     run %s, step ", cli_jstr(l, "run_id"));
    value(json_object_get(l, "step"));
    printf(", created %s, code %s", cli_jstr(l, "created"), cli_jstr(l, "code_version"));
    line_end(json_object_get(l, "check"));
    const json_t *ds = json_object_get(l, "dataset_path");
    printf("              dataset sha256:%s%s%s\n", cli_jstr(l, "dataset_sha256"),
           json_is_string(ds) ? ", " : " (its path is not recorded in the card)",
           json_is_string(ds) ? json_string_value(ds) : "");
    const json_t *ck = json_object_get(l, "checkpoint");
    if (json_is_object(ck))
        printf("              checkpoint %s sha256:%s\n", cli_jstr(ck, "file"),
               cli_jstr(ck, "sha256"));
    printf("              metrics ");
    const json_t *m = json_object_get(l, "metrics");
    const char *k;
    json_t *x;
    int i = 0;
    json_object_foreach((json_t *)m, k, x) {
        printf("%s%s ", i++ ? ", " : "", k);
        value(x);
    }
    printf("%s\n", i ? "" : "none recorded");
    const json_t *cfg = json_object_get(l, "config");
    printf("              config ");
    if (json_is_object(cfg)) {
        static const char *const keys_shown[] = {"d_model", "n_layers", "n_heads",    "n_experts",
                                                 "top_k",   "seq_len",  "n_features", "n_outputs"};
        for (size_t j = 0; j < KILN_ARRAY_LEN(keys_shown); j++) {
            printf("%s%s ", j ? ", " : "", keys_shown[j]);
            value(json_object_get(cfg, keys_shown[j]));
        }
        printf(" (%s)", cli_jstr(l, "dtype"));
    } else {
        printf("none");
    }
    line_end(json_object_get(l, "config_check"));
}

/* The version's reproduction records (kiln reproduce --sign), each as verified here. */
static void print_reproductions(const json_t *j) {
    const json_t *rs = json_object_get(j, "reproductions"),
                 *need = json_object_get(j, "reproduced_by");
    size_t i;
    json_t *r;
    json_array_foreach(rs, i, r) {
        const json_t *c = json_object_get(r, "check");
        if (!strcmp(cli_jstr(c, "status"), "verified"))
            printf("%s%s by %s on %s at %s, kiln %s  [verified]\n",
                   i ? "            " : "reproduced  ", cli_jstr(r, "verdict"),
                   cli_jstr(r, "signer"), cli_jstr(r, "host"), cli_jstr(r, "time"),
                   cli_jstr(r, "code_version"));
        else
            printf("%srecord [not verified: %s]\n", i ? "            " : "reproduced  ",
                   cli_jstr(c, "how"));
    }
    if (json_is_object(need))
        printf("%s[FAILED: %s]\n", json_array_size(rs) ? "            " : "reproduced  ",
               cli_jstr(need, "how"));
}

static void print_validation(const json_t *v) {
    printf("validation  %s", cli_jstr(v, "verdict"));
    line_end(json_object_get(v, "verdict_check"));
    const json_t *rs = json_object_get(v, "report_sha256");
    if (json_is_string(rs)) {
        printf("              report validation.json sha256:%s", json_string_value(rs));
        line_end(json_object_get(v, "report_sha256_check"));
    }
    const json_t *rep = json_object_get(v, "report");
    if (json_is_object(rep)) {
        printf("              by kiln %s on %s (sha256:%.12s…, %s), held-out loss ",
               cli_jstr(rep, "kiln_version"), cli_jstr(rep, "data_path"),
               cli_jstr(rep, "data_sha256"),
               json_is_true(json_object_get(rep, "data_is_training_dataset"))
                   ? "the training dataset"
                   : "not the training dataset");
        value(json_object_get(rep, "heldout_loss"));
        printf(" over %lld windows\n", cli_jint(rep, "heldout_windows"));
    }
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(v, "checks"), i, c) {
        printf("              %-24s %-8s", cli_jstr(c, "name"), cli_jstr(c, "status"));
        const json_t *rel = json_object_get(c, "max_rel_err");
        if (json_is_number(rel)) {
            printf(" share outside ");
            value(json_object_get(c, "value"));
            printf(" (max ");
            value(json_object_get(c, "threshold"));
            printf("), max relative error ");
            value(rel);
            printf(" (rtol ");
            value(json_object_get(c, "rtol"));
            printf(")");
        } else if (json_is_string(json_object_get(c, "measure"))) {
            printf(" held-out loss ");
            value(json_object_get(c, "value"));
            printf(" (limit ");
            value(json_object_get(c, "threshold"));
            printf(")");
        }
        const json_t *why = json_object_get(c, "reason");
        if (json_is_string(why)) printf(" %s", json_string_value(why));
        putchar('\n');
    }
    const json_t *b = json_object_get(v, "baseline");
    if (json_is_true(json_object_get(b, "recorded"))) {
        const json_t *ref = json_object_get(b, "ref");
        if (json_is_object(ref)) {
            printf(
                "              baseline %s@%s %s", cli_jstr(ref, "name"), cli_jstr(ref, "version"),
                json_is_string(json_object_get(ref, "digest")) ? cli_jstr(ref, "digest")
                                                               : "(archive digest not recorded)");
            if (json_is_string(json_object_get(ref, "channel")))
                printf(", from channel %s seq %lld", cli_jstr(ref, "channel"),
                       cli_jint(ref, "seq"));
            printf(", weights sha256:%.12s…\n", cli_jstr(ref, "model_sha256"));
        } else {
            printf("              baseline none: validated without one\n");
        }
    } else if (json_is_object(b)) {
        const json_t *ms = json_object_get(b, "model_sha256");
        printf("              baseline not recorded by this report (written before kiln "
               "recorded it)%s%s%s\n",
               json_is_string(ms) ? "; it measured weights sha256:" : "",
               json_is_string(ms) ? json_string_value(ms) : "", json_is_string(ms) ? "" : "");
    }
    printf("              checks");
    line_end(json_object_get(v, "check"));
}

static void print_text(const json_t *j) {
    const json_t *ver = json_object_get(j, "version");
    printf("%s -> %s@%s, checked %s against %s\n", cli_jstr(j, "ref"), cli_jstr(j, "model"),
           json_is_string(ver) ? json_string_value(ver) : "(unresolved)", cli_jstr(j, "checked_at"),
           cli_jstr(j, "registry"));
    /* Over several registries: which answered, and what passing the others over said. */
    cli_print_registries(j, "              ");
    print_trust(json_object_get(j, "trust"));
    const json_t *c = json_object_get(j, "channel");
    if (json_is_object(c)) print_channel(c);
    if (json_object_get(j, "archive")) print_archive(json_object_get(j, "archive"));
    if (json_object_get(j, "lineage")) print_lineage(json_object_get(j, "lineage"));
    if (json_object_get(j, "validation")) print_validation(json_object_get(j, "validation"));
    print_reproductions(j);
    const json_t *probs = json_object_get(j, "problems");
    if (!json_array_size(probs)) {
        printf("result      verified: every check passed (lines marked registry's word or not "
               "checked are not claims of the signers)\n");
        return;
    }
    printf("result      FAILED: %zu check%s did not pass\n", json_array_size(probs),
           json_array_size(probs) == 1 ? "" : "s");
    size_t i;
    json_t *p;
    json_array_foreach(probs, i, p) printf("              - %s\n", json_string_value(p));
}

int cmd_provenance(int argc, char **argv) {
    const char *trust = NULL, *state = NULL;
    cli_registries r = {0}; /* the limits are --download's */
    bool as_json = false, download = false;
    const cli_opt opts[] = {
        {"registry", CLI_MULTI, &r.urls, "URL",
         "the registry; repeat it for mirrors, tried in order (the newest channel record wins)",
         true},
        {"trust", CLI_STR, &trust, "FILE", "the trust policy to check everything under", true},
        {"state", CLI_STR, &state, "DIR",
         "pull state: trust versions accepted, last seqs (default ~/.local/state/kiln)", false},
        {"token", CLI_STR, &r.token, "TOKEN", "a read token (default $KILN_REGISTRY_TOKEN)", false},
        {"json", CLI_FLAG, &as_json, NULL, "print one JSON object (kiln-provenance/1)", false},
        {"download", CLI_FLAG, &download, NULL,
         "download the archive and verify its bytes and every file (the validation report's "
         "checks are read from it)",
         false},
        CLI_TIMEOUT_OPT(&r.timeout),
        CLI_LIMIT_OPTS(&r.max_size, &r.min_rate, &r.deadline),
        {0},
    };
    cli_spec spec = {
        "kiln provenance NAME@CHANNEL|NAME@VERSION --registry URL [--registry MIRROR]... "
        "--trust FILE [--state DIR] [--token T] [--json] [--download] [--timeout 5s]",
        "Say what a channel or version is, who signed and put it there, what it was trained "
        "from and validated against, each fact checked under the trust policy (exit 1 if one "
        "does not verify).",
        opts, 1, 1};
    const char *ref;
    int rc;
    if (!cli_registry_args(&spec, argc, argv, &ref, &r, false, &rc)) return rc;
    kiln_registry_provenance_opts o = {
        .ref = ref, .trust = trust, .state = state, .download = download};
    json_t *out = NULL;
    kiln_err e = kiln_registry_provenance_any(r.cs, r.n, &o, &out);
    cli_registries_release(&r);
    int printed = 0;
    if (out) {
        if (as_json)
            printed = cli_print_json(out, JSON_INDENT(2) | JSON_ENCODE_ANY);
        else
            print_text(out);
        fflush(stdout);
        json_decref(out);
    }
    return e ? cli_fail(e) : printed;
}
