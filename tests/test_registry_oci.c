/* test_registry_oci.c - the OCI side's small rules (docs/registry.md, "On an OCI registry"):
 * which URLs choose it and what a prefix may be (distribution refuses a path component that
 * begins with '_'), and the fork rule every client keeps (a record at an accepted seq must be
 * the one kept). The protocol itself runs against Debian's docker-registry in
 * tests/e2e/72-oci.sh, 73-oci-release.sh and 74-oci-token.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oci_int.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

KILN_TEST(registry_oci_urls) {
    CHECK("oci:// chooses OCI", reg_oci_url("oci://r.example.com/desk/kiln"));
    CHECK("oci+http:// chooses OCI", reg_oci_url("oci+http://127.0.0.1:5000/p"));
    CHECK("http:// does not", !reg_oci_url("http://127.0.0.1:8080"));
    CHECK("nor NULL", !reg_oci_url(NULL));

    kiln_registry_client_opts c = {.url = "oci://r.example.com:5443/desk/kiln/"};
    reg_oci o;
    CHECK("a URL with a port and a prefix", reg_oci_open(&c, &o) == KILN_OK);
    CHECK("its host", !strcmp(o.host, "r.example.com:5443"));
    CHECK("HTTPS for oci://", !strcmp(o.base, "https://r.example.com:5443"));
    CHECK("the prefix, trailing '/' dropped", !strcmp(o.prefix, "desk/kiln"));
    char *repo = reg_oci_repo(&o, "market");
    CHECK("a model's repository", repo && !strcmp(repo, "desk/kiln/market"));
    free(repo);

    c.url = "oci+http://127.0.0.1:5000";
    CHECK("no prefix", reg_oci_open(&c, &o) == KILN_OK && !strcmp(o.prefix, "") &&
                           !strcmp(o.base, "http://127.0.0.1:5000"));
    repo = reg_oci_repo(&o, "market");
    CHECK("a model's repository without a prefix", repo && !strcmp(repo, "market"));
    free(repo);

    const char *bad[] = {"oci:///desk", "oci://r.example.com/_trust", "oci://r.example.com/Desk",
                         "oci://r.example.com/desk//kiln", "oci://r.example.com/desk-"};
    for (size_t i = 0; i < KILN_ARRAY_LEN(bad); i++) {
        c.url = bad[i];
        CHECK("a URL no OCI registry takes is refused, named",
              reg_oci_open(&c, &o) == KILN_ERR_USAGE && kiln_test_msg_has(bad[i], NULL));
    }
}

KILN_TEST(registry_oci_fork_rule) {
    char *dir = kiln_test_path("state/channels/demo");
    CHECK("state dir", dir && kiln_mkdir_p(dir) == KILN_OK);
    free(dir);
    const char *kept = "{\"record\":\"A\"}";
    json_t *st =
        json_pack("{s:I, s:s, s:s}", "seq", (json_int_t)4, "record", kept, "signature", "");
    char *path = kiln_test_path("state/channels/demo/staging.json"), *text = json_dumps(st, 0);
    CHECK("state written", text && kiln_write_file_atomic(path, text, strlen(text)) == KILN_OK);
    free(text);
    free(path);
    json_decref(st);
    char *state = kiln_test_path("state");
    reg_record rec;
    memset(&rec, 0, sizeof rec);
    rec.seq = 4;
    CHECK("the kept record at its seq",
          reg_record_fork_check(state, "demo", "staging", &rec, kept, strlen(kept)) == KILN_OK);
    const char *other = "{\"record\":\"B\"}";
    CHECK("another record of the accepted seq is a fork",
          reg_record_fork_check(state, "demo", "staging", &rec, other, strlen(other)) ==
                  KILN_ERR_VERIFY &&
              kiln_test_msg_has("a fork", "seq 4"));
    CHECK("a prefix of the kept record is another record too",
          reg_record_fork_check(state, "demo", "staging", &rec, kept, strlen(kept) - 1) ==
              KILN_ERR_VERIFY);
    rec.seq = 5;
    CHECK("a later seq is the other checks' business",
          reg_record_fork_check(state, "demo", "staging", &rec, other, strlen(other)) == KILN_OK);
    CHECK("a channel never accepted has no fork",
          reg_record_fork_check(state, "demo", "production", &rec, other, strlen(other)) ==
              KILN_OK);
    free(state);
}
