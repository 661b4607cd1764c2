/* datasets.c - kiln data pull: a dataset fetched by the sha256 of its bytes, verified (digest,
 * a release key's signature under the client's policy, the comment naming it) before it is
 * renamed into place (docs/registry.md, "Datasets"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"
#include "sign.h"

static bool hex64(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return false;
    return n == 64;
}

/* The name of a dataset the registry holds with digest (the first listed). */
static kiln_err find_name(const kiln_registry_client_opts *c, const char *digest,
                          char name[KILN_REGISTRY_NAME_MAX + 1]) {
    json_t *j = NULL;
    KILN_TRY(kiln_registry_get_json(c, "/v1/datasets", &j));
    size_t i;
    json_t *d;
    bool found = false;
    json_array_foreach(json_object_get(j, "datasets"), i, d) {
        const char *n = json_string_value(json_object_get(d, "name")),
                   *g = json_string_value(json_object_get(d, "digest"));
        if (n && g && !strcmp(g, digest) && strlen(n) <= KILN_REGISTRY_NAME_MAX) {
            snprintf(name, KILN_REGISTRY_NAME_MAX + 1, "%s", n);
            found = true;
            break;
        }
    }
    json_decref(j);
    KILN_FAIL_IF(!found, KILN_ERR_NOTFOUND, "registry '%s' holds no dataset %s", c->url, digest);
    return KILN_OK;
}

kiln_err kiln_registry_data_pull(const kiln_registry_client_opts *c, const char *name,
                                 const char *hex, const char *trust, const char *out,
                                 kiln_registry_data_pulled *res) {
    memset(res, 0, sizeof *res);
    KILN_FAIL_IF(!hex || !hex64(hex), KILN_ERR_USAGE,
                 "a dataset is named by sha256:<64 lowercase hex digits>, not '%s'",
                 hex ? hex : "");
    KILN_FAIL_IF(!trust || !out, KILN_ERR_USAGE, "a dataset pull needs a trust policy and --out");
    KILN_TRY(reg_client_init(c));
    snprintf(res->digest, sizeof res->digest, "sha256:%s", hex);
    if (name) {
        KILN_TRY(kiln_registry_check_name("dataset", name));
        snprintf(res->name, sizeof res->name, "%s", name);
    } else {
        KILN_TRY(find_name(c, res->digest, res->name));
    }
    if (kiln_path_exists(out)) {
        /* The dataset already there (a reproduction run again) is kept; anything else is
         * left as it is. */
        uint8_t d[KILN_SHA256_BYTES];
        char h[KILN_SHA256_HEX];
        KILN_TRY(kiln_sha256_file(out, d));
        kiln_hex(d, sizeof d, h);
        KILN_FAIL_IF(strcmp(h, hex), KILN_ERR_CONFLICT,
                     "'%s' exists and is another file (sha256:%s); a pull writes a new file", out,
                     h);
    }
    kiln_sign_trust *t = NULL;
    json_t *j = NULL;
    char *path = kiln_asprintf("/v1/datasets/%s/sha256/%s", res->name, hex),
         *partial = kiln_asprintf("%s.partial", out), *label = NULL, *dir = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, done, !path || !partial, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, done, kiln_sign_trust_load(trust, &t));
    KILN_CHECK(rc, done, kiln_registry_get_json(c, path, &j));
    const char *sig = json_string_value(json_object_get(j, "signature"));
    json_int_t size = json_integer_value(json_object_get(j, "size"));
    KILN_CHECK_IF(rc, done, !sig || size < 0, KILN_ERR_FORMAT,
                  "registry '%s': the dataset's answer has no signature or size", c->url);
    label = kiln_asprintf("the signature of dataset %s@sha256:%s", res->name, hex);
    KILN_CHECK_IF(rc, done, !label, KILN_ERR_NOMEM, "out of memory");
    if (!kiln_path_exists(out)) {
        KILN_CHECK(rc, done, reg_download(c, hex, (uint64_t)size, partial));
        rc = reg_dataset_verify(t, sig, strlen(sig), label, partial, res->name, hex, res->signed_by,
                                sizeof res->signed_by);
        if (rc) {
            unlink(partial);
            goto done;
        }
        KILN_CHECK_IF(rc, done, rename(partial, out), KILN_ERR_IO, "cannot rename '%s' to '%s'",
                      partial, out);
        dir = kiln_dirname(out);
        if (dir) KILN_CHECK(rc, done, kiln_fsync_dir(dir));
    } else {
        KILN_CHECK(rc, done,
                   reg_dataset_verify(t, sig, strlen(sig), label, out, res->name, hex,
                                      res->signed_by, sizeof res->signed_by));
    }
    res->size = (uint64_t)size;
done:
    kiln_sign_trust_free(t);
    json_decref(j);
    free(path);
    free(partial);
    free(label);
    free(dir);
    return rc;
}
