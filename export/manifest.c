/* manifest.c - the archive manifest: build it from a model directory, parse it strictly,
 * check a directory against it. The manifest is canonical JSON because its bytes are
 * signed: one content, one text. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export_int.h"

/* ---- the manifest struct ------------------------------------------------------ */

void kiln_manifest_free(kiln_manifest *m) {
    if (!m) return;
    free(m->name);
    free(m->version);
    free(m->created);
    json_decref(m->lineage);
    for (size_t i = 0; m->files && i < m->nfiles; i++)
        free(m->files[i].path);
    free(m->files);
    free(m->text);
    free(m);
}

const kiln_manifest_file *kiln_manifest_find(const kiln_manifest *m, const char *path) {
    size_t lo = 0, hi = m->nfiles;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->files[mid].path, path);
        if (c == 0) return &m->files[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- parse -------------------------------------------------------------------- */

static const char *const manifest_keys[] = {"created", "files",      "format", "lineage",
                                            "name",    "validation", "version"};

static bool is_hex64(const char *s, uint8_t out[KILN_SHA256_BYTES]) {
    if (strlen(s) != 64) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return kiln_unhex(s, out, KILN_SHA256_BYTES);
}

static kiln_err parse_files(kiln_manifest *m, const json_t *files, const char *label) {
    KILN_FAIL_IF(!json_is_array(files), KILN_ERR_FORMAT, "'%s': \"files\" must be an array", label);
    size_t n = json_array_size(files);
    if (n) {
        m->files = kiln_calloc(n, sizeof *m->files);
        if (!m->files) return KILN_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *f = json_array_get(files, i);
        KILN_FAIL_IF(!json_is_object(f) || json_object_size(f) != 3, KILN_ERR_FORMAT,
                     "'%s': files[%zu] must be an object with exactly path, sha256 and size", label,
                     i);
        const json_t *jp = json_object_get(f, "path"), *jh = json_object_get(f, "sha256"),
                     *js = json_object_get(f, "size");
        KILN_FAIL_IF(
            !json_is_string(jp) || !json_is_string(jh) || !json_is_integer(js), KILN_ERR_FORMAT,
            "'%s': files[%zu] must have a string path, a string sha256 and an integer size", label,
            i);
        const char *path = json_string_value(jp);
        KILN_FAIL_IF(strlen(path) != json_string_length(jp) || !kiln_export_path_ok(path, 4096),
                     KILN_ERR_FORMAT, "'%s': files[%zu]: path '%s' is not allowed", label, i, path);
        KILN_FAIL_IF(!strcmp(path, KILN_MANIFEST_NAME), KILN_ERR_FORMAT,
                     "'%s': files[%zu]: '%s' is reserved for the manifest", label, i, path);
        KILN_FAIL_IF(json_integer_value(js) < 0, KILN_ERR_FORMAT, "'%s': files[%zu]: negative size",
                     label, i);
        KILN_FAIL_IF(!is_hex64(json_string_value(jh), m->files[i].sha256), KILN_ERR_FORMAT,
                     "'%s': files[%zu]: sha256 must be 64 lowercase hex digits", label, i);
        if (i > 0) {
            const char *prev = m->files[i - 1].path;
            KILN_FAIL_IF(
                strcmp(prev, path) >= 0, KILN_ERR_FORMAT,
                "'%s': files[%zu]: '%s' is not after '%s' (paths must be sorted and unique)", label,
                i, path, prev);
        }
        m->files[i].path = kiln_strdup(path);
        if (!m->files[i].path) return KILN_ERR_NOMEM;
        m->files[i].size = (uint64_t)json_integer_value(js);
        m->nfiles = i + 1;
    }
    /* A path that is a file and also a directory of another ("a" and "a/b") cannot be
     * unpacked; in sorted order "a/b" need not follow "a" directly ("a.x" sorts between). */
    for (size_t i = 0; i < m->nfiles; i++) {
        const char *p = m->files[i].path;
        for (const char *s = strchr(p, '/'); s; s = strchr(s + 1, '/')) {
            char dir[4097];
            size_t l = (size_t)(s - p);
            memcpy(dir, p, l);
            dir[l] = 0;
            KILN_FAIL_IF(
                kiln_manifest_find(m, dir) || !strcmp(dir, KILN_MANIFEST_NAME), KILN_ERR_FORMAT,
                "'%s': '%s' is listed as a file and as a directory of '%s'", label, dir, p);
        }
    }
    KILN_FAIL_IF(!kiln_manifest_find(m, "card.json"), KILN_ERR_FORMAT, "'%s': lists no card.json",
                 label);
    KILN_FAIL_IF(!kiln_manifest_find(m, "model.safetensors"), KILN_ERR_FORMAT,
                 "'%s': lists no model.safetensors", label);
    return KILN_OK;
}

static kiln_err parse_fields(kiln_manifest *m, const json_t *j, const char *label) {
    KILN_FAIL_IF(!json_is_object(j), KILN_ERR_FORMAT, "'%s': a manifest is a JSON object", label);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val) {
        bool known = false;
        for (size_t i = 0; i < KILN_ARRAY_LEN(manifest_keys); i++)
            known |= !strcmp(key, manifest_keys[i]);
        KILN_FAIL_IF(!known, KILN_ERR_FORMAT, "'%s': unknown key \"%s\"", label, key);
    }
    for (size_t i = 0; i < KILN_ARRAY_LEN(manifest_keys); i++)
        KILN_FAIL_IF(!json_object_get(j, manifest_keys[i]), KILN_ERR_FORMAT,
                     "'%s': missing key \"%s\"", label, manifest_keys[i]);
    const json_t *fmt = json_object_get(j, "format");
    KILN_FAIL_IF(!json_is_string(fmt) || strcmp(json_string_value(fmt), KILN_MANIFEST_FORMAT),
                 KILN_ERR_UNSUPPORTED, "'%s': \"format\" is not \"%s\"", label,
                 KILN_MANIFEST_FORMAT);
    const json_t *name = json_object_get(j, "name"), *ver = json_object_get(j, "version"),
                 *created = json_object_get(j, "created");
    KILN_FAIL_IF(!json_is_string(name) || !kiln_export_name_ok(json_string_value(name)),
                 KILN_ERR_FORMAT, "'%s': \"name\" must match [a-z0-9][a-z0-9._-]{0,63}", label);
    KILN_FAIL_IF(!json_is_string(ver) || !kiln_export_version_ok(json_string_value(ver)),
                 KILN_ERR_FORMAT, "'%s': \"version\" must match [0-9A-Za-z][0-9A-Za-z.+_-]{0,63}",
                 label);
    KILN_FAIL_IF(!json_is_string(created) || strlen(json_string_value(created)) > 64,
                 KILN_ERR_FORMAT, "'%s': \"created\" must be an RFC 3339 string", label);
    if (kiln_export_parse_time(json_string_value(created), &m->created_unix))
        return kiln_errprefix(KILN_ERR_FORMAT, "'%s': \"created\": ", label);
    const json_t *lin = json_object_get(j, "lineage");
    KILN_FAIL_IF(!json_is_object(lin), KILN_ERR_FORMAT, "'%s': \"lineage\" must be an object",
                 label);
    const json_t *val_ = json_object_get(j, "validation");
    KILN_FAIL_IF(!json_is_object(val_) || json_object_size(val_) != 2, KILN_ERR_FORMAT,
                 "'%s': \"validation\" must be an object with exactly passed and sha256", label);
    const json_t *vp = json_object_get(val_, "passed"), *vh = json_object_get(val_, "sha256");
    KILN_FAIL_IF(!vp || !vh, KILN_ERR_FORMAT, "'%s': \"validation\" must have passed and sha256",
                 label);
    if (json_is_null(vp) && json_is_null(vh)) {
        m->validation_present = false;
    } else {
        KILN_FAIL_IF(
            !json_is_boolean(vp) || !json_is_string(vh) ||
                !is_hex64(json_string_value(vh), m->validation_sha256),
            KILN_ERR_FORMAT,
            "'%s': \"validation\": passed must be true or false and sha256 64 lowercase hex "
            "digits, or both null",
            label);
        m->validation_present = true;
        m->validation_passed = json_is_true(vp);
    }
    m->name = kiln_strdup(json_string_value(name));
    m->version = kiln_strdup(json_string_value(ver));
    m->created = kiln_strdup(json_string_value(created));
    if (!m->name || !m->version || !m->created) return KILN_ERR_NOMEM;
    m->lineage = json_incref((json_t *)lin);
    KILN_TRY(parse_files(m, json_object_get(j, "files"), label));
    return KILN_OK;
}

kiln_err kiln_manifest_parse(const void *buf, size_t len, const char *label, kiln_manifest **out) {
    *out = NULL;
    KILN_FAIL_IF(len > KILN_MANIFEST_MAX_BYTES, KILN_ERR_LIMIT,
                 "'%s': %zu bytes, more than the limit of %u", label, len, KILN_MANIFEST_MAX_BYTES);
    json_t *j = NULL;
    KILN_TRY(kiln_json_parse(buf, len, label, &j));
    kiln_err rc = KILN_OK;
    char *canon = NULL;
    kiln_manifest *m = kiln_calloc(1, sizeof *m);
    KILN_CHECK_IF(rc, out, !m, KILN_ERR_NOMEM, "out of memory parsing '%s'", label);
    KILN_CHECK(rc, out, parse_fields(m, j, label));
    canon = kiln_json_canonical(j);
    KILN_CHECK_IF(rc, out, !canon, KILN_ERR_NOMEM, "out of memory parsing '%s'", label);
    KILN_CHECK_IF(rc, out, strlen(canon) != len || memcmp(canon, buf, len) != 0, KILN_ERR_FORMAT,
                  "'%s': not in canonical form (sorted keys, no white space, one encoding)", label);
    m->text = canon;
    m->text_len = len;
    canon = NULL;
    kiln_sha256(m->text, m->text_len, m->sha256);
    *out = m;
    m = NULL;
out:
    free(canon);
    kiln_manifest_free(m);
    json_decref(j);
    return rc;
}

/* ---- build -------------------------------------------------------------------- */

/* Read a small JSON file of the model directory and check it is the one that was hashed. */
static kiln_err load_hashed_json(int rootfd, const char *dir, const kiln_export_entry *e,
                                 const uint8_t sha[KILN_SHA256_BYTES], json_t **out) {
    *out = NULL;
    char *label = kiln_path_join(dir, e->path);
    if (!label) return KILN_ERR_NOMEM;
    kiln_err rc = KILN_OK;
    char *buf = NULL;
    int fd = -1;
    KILN_CHECK_IF(rc, out, e->size > KILN_CARD_MAX_BYTES, KILN_ERR_LIMIT,
                  "'%s': %ju bytes, more than the limit of %u", label, (uintmax_t)e->size,
                  KILN_CARD_MAX_BYTES);
    KILN_CHECK(rc, out, kiln_export_open_regular(rootfd, e->path, label, e->size, &fd));
    buf = kiln_malloc((size_t)e->size + 1);
    KILN_CHECK_IF(rc, out, !buf, KILN_ERR_NOMEM, "out of memory reading '%s'", label);
    size_t got = 0;
    while (got < e->size) {
        ssize_t n = read(fd, buf + got, (size_t)e->size - got);
        if (n < 0 && errno == EINTR) continue;
        KILN_CHECK_IF(rc, out, n < 0, KILN_ERR_IO, "cannot read '%s': %s", label, strerror(errno));
        if (n == 0) break;
        got += (size_t)n;
    }
    uint8_t d[KILN_SHA256_BYTES];
    kiln_sha256(buf, got, d);
    KILN_CHECK_IF(rc, out, got != e->size || memcmp(d, sha, sizeof d) != 0, KILN_ERR_CONFLICT,
                  "'%s': changed while being packed", label);
    KILN_CHECK(rc, out, kiln_json_parse(buf, got, label, out));
out:
    if (fd >= 0) close(fd);
    free(buf);
    free(label);
    return rc;
}

static const kiln_export_entry *find_entry(const kiln_export_entry *l, size_t n, const char *path) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(l[i].path, path)) return &l[i];
    return NULL;
}

kiln_err kiln_manifest_build(const char *model_dir, const char *name, const char *version,
                             kiln_manifest **out) {
    *out = NULL;
    KILN_FAIL_IF(!kiln_export_name_ok(name), KILN_ERR_USAGE,
                 "name '%s' is not allowed: use [a-z0-9][a-z0-9._-]{0,63} without \"..\"", name);
    KILN_FAIL_IF(!kiln_export_version_ok(version), KILN_ERR_USAGE,
                 "version '%s' is not allowed: use [0-9A-Za-z][0-9A-Za-z.+_-]{0,63} without \"..\"",
                 version);
    int rootfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return kiln_fail_errno(KILN_ERR_IO, "cannot open model directory '%s'", model_dir);
    kiln_err rc = KILN_OK;
    kiln_export_entry *list = NULL;
    size_t n = 0;
    uint8_t(*sha)[KILN_SHA256_BYTES] = NULL;
    unsigned char *buf = NULL;
    json_t *card = NULL, *val = NULL, *mj = NULL, *files = NULL;
    char *text = NULL, *label = NULL;

    KILN_CHECK(rc, out, kiln_export_walk(rootfd, model_dir, &list, &n));
    const kiln_export_entry *card_e = find_entry(list, n, "card.json"),
                            *val_e = find_entry(list, n, "validation.json");
    KILN_CHECK_IF(rc, out, !card_e, KILN_ERR_NOTFOUND,
                  "'%s': no card.json (the lineage and the creation time come from it)", model_dir);
    KILN_CHECK_IF(rc, out, !find_entry(list, n, "model.safetensors"), KILN_ERR_NOTFOUND,
                  "'%s': no model.safetensors", model_dir);
    KILN_CHECK_IF(rc, out, find_entry(list, n, KILN_MANIFEST_NAME) != NULL, KILN_ERR_FORMAT,
                  "'%s/%s': the name is reserved for the archive's manifest", model_dir,
                  KILN_MANIFEST_NAME);

    sha = kiln_calloc(n, sizeof *sha);
    buf = kiln_malloc(KILN_EXPORT_BUF);
    files = json_array();
    KILN_CHECK_IF(rc, out, !sha || !buf || !files, KILN_ERR_NOMEM, "out of memory packing '%s'",
                  model_dir);
    for (size_t i = 0; i < n; i++) {
        label = kiln_path_join(model_dir, list[i].path);
        KILN_CHECK_IF(rc, out, !label, KILN_ERR_NOMEM, "out of memory");
        int fd;
        uint64_t got;
        KILN_CHECK(rc, out,
                   kiln_export_open_regular(rootfd, list[i].path, label, list[i].size, &fd));
        rc = kiln_export_hash_fd(fd, label, buf, sha[i], &got);
        close(fd);
        if (rc) goto out;
        KILN_CHECK_IF(rc, out, got != list[i].size, KILN_ERR_CONFLICT,
                      "'%s': changed while being packed", label);
        char hex[KILN_SHA256_HEX];
        kiln_hex(sha[i], KILN_SHA256_BYTES, hex);
        json_t *f = json_pack("{s:s,s:s,s:I}", "path", list[i].path, "sha256", hex, "size",
                              (json_int_t)list[i].size);
        KILN_CHECK_IF(rc, out, !f || json_array_append_new(files, f), KILN_ERR_NOMEM,
                      "out of memory");
        free(label);
        label = NULL;
    }

    KILN_CHECK(rc, out, load_hashed_json(rootfd, model_dir, card_e, sha[card_e - list], &card));
    label = kiln_path_join(model_dir, "card.json");
    KILN_CHECK_IF(rc, out, !label, KILN_ERR_NOMEM, "out of memory");
    const json_t *lineage = json_object_get(card, "lineage"),
                 *created = json_object_get(card, "created");
    KILN_CHECK_IF(rc, out, !json_is_object(card), KILN_ERR_FORMAT, "'%s': must be a JSON object",
                  label);
    KILN_CHECK_IF(rc, out, !json_is_object(lineage), KILN_ERR_FORMAT,
                  "'%s': \"lineage\" is missing or not an object", label);
    KILN_CHECK_IF(rc, out, !json_is_string(created), KILN_ERR_FORMAT,
                  "'%s': \"created\" is missing or not an RFC 3339 string", label);
    int64_t t;
    if ((rc = kiln_export_parse_time(json_string_value(created), &t))) {
        kiln_errprefix(rc, "'%s': \"created\": ", label);
        goto out;
    }
    /* ustar holds 11 octal digits of seconds since 1970. */
    KILN_CHECK_IF(rc, out, t < 0 || t > 077777777777LL, KILN_ERR_FORMAT,
                  "'%s': \"created\" %s is outside 1970..2242", label, json_string_value(created));

    json_t *vj;
    if (val_e) {
        KILN_CHECK(rc, out, load_hashed_json(rootfd, model_dir, val_e, sha[val_e - list], &val));
        const json_t *passed = json_object_get(val, "passed");
        KILN_CHECK_IF(rc, out, !json_is_boolean(passed), KILN_ERR_FORMAT,
                      "'%s/validation.json': \"passed\" is missing or not true/false", model_dir);
        char hex[KILN_SHA256_HEX];
        kiln_hex(sha[val_e - list], KILN_SHA256_BYTES, hex);
        vj = json_pack("{s:b,s:s}", "passed", json_is_true(passed), "sha256", hex);
    } else {
        vj = json_pack("{s:n,s:n}", "passed", "sha256");
    }
    mj = json_pack("{s:O,s:o,s:s,s:O,s:s,s:o,s:s}", "created", created, "files", files, "format",
                   KILN_MANIFEST_FORMAT, "lineage", lineage, "name", name, "validation", vj,
                   "version", version);
    files = NULL; /* "o" stole it, even on failure */
    KILN_CHECK_IF(rc, out, !mj, KILN_ERR_NOMEM, "out of memory building the manifest of '%s'",
                  model_dir);
    text = kiln_json_canonical(mj);
    KILN_CHECK_IF(rc, out, !text, KILN_ERR_NOMEM, "out of memory");
    /* One code path fills the struct: what pack writes is what unpack accepts. */
    if ((rc = kiln_manifest_parse(text, strlen(text), KILN_MANIFEST_NAME, out)) &&
        rc != KILN_ERR_NOMEM)
        kiln_errprefix(rc, "'%s': ", model_dir);
out:
    json_decref(mj);
    json_decref(files);
    json_decref(card);
    json_decref(val);
    free(text);
    free(label);
    free(buf);
    free(sha);
    kiln_export_entries_free(list, n);
    close(rootfd);
    return rc;
}

/* ---- verify a directory ------------------------------------------------------- */

static kiln_err as_verify(kiln_err rc) {
    if (rc != KILN_ERR_FORMAT) return rc;
    char *msg = kiln_strdup(kiln_errmsg());
    if (!msg) return KILN_ERR_NOMEM;
    rc = kiln_fail(KILN_ERR_VERIFY, "%s", msg);
    free(msg);
    return rc;
}

kiln_err kiln_manifest_verify_dir(const kiln_manifest *m, const char *dir) {
    int rootfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open directory '%s'", dir);
    kiln_err rc = KILN_OK;
    kiln_export_entry *list = NULL;
    size_t n = 0, j = 0;
    unsigned char *buf = NULL;
    char *label = NULL;
    KILN_CHECK(rc, out, as_verify(kiln_export_walk(rootfd, dir, &list, &n)));
    buf = kiln_malloc(KILN_EXPORT_BUF);
    KILN_CHECK_IF(rc, out, !buf, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        free(label);
        label = kiln_path_join(dir, list[i].path);
        KILN_CHECK_IF(rc, out, !label, KILN_ERR_NOMEM, "out of memory");
        int fd;
        uint64_t got;
        uint8_t d[KILN_SHA256_BYTES];
        bool is_manifest = !strcmp(list[i].path, KILN_MANIFEST_NAME);
        const kiln_manifest_file *f = is_manifest ? NULL : kiln_manifest_find(m, list[i].path);
        KILN_CHECK_IF(rc, out, !is_manifest && !f, KILN_ERR_VERIFY, "'%s': not in the manifest",
                      label);
        /* Files found in sorted order: a manifest entry skipped over is missing. */
        for (; f && j < m->nfiles && &m->files[j] != f; j++)
            KILN_CHECK_IF(rc, out, true, KILN_ERR_VERIFY,
                          "'%s/%s': missing (listed in the manifest)", dir, m->files[j].path);
        if (f) j++;
        uint64_t want = is_manifest ? m->text_len : f->size;
        KILN_CHECK_IF(rc, out, list[i].size != want, KILN_ERR_VERIFY,
                      "'%s': %ju bytes, the manifest says %ju", label, (uintmax_t)list[i].size,
                      (uintmax_t)want);
        KILN_CHECK(rc, out,
                   as_verify(kiln_export_open_regular(rootfd, list[i].path, label, want, &fd)));
        rc = kiln_export_hash_fd(fd, label, buf, d, &got);
        close(fd);
        if (rc) goto out;
        const uint8_t *exp = is_manifest ? m->sha256 : f->sha256;
        KILN_CHECK_IF(rc, out, got != want || memcmp(d, exp, sizeof d) != 0, KILN_ERR_VERIFY,
                      is_manifest ? "'%s': differs from the trusted manifest"
                                  : "'%s': sha256 differs from the manifest",
                      label);
    }
    KILN_CHECK_IF(rc, out, j < m->nfiles, KILN_ERR_VERIFY,
                  "'%s/%s': missing (listed in the manifest)", dir, m->files[j].path);
out:
    free(label);
    free(buf);
    kiln_export_entries_free(list, n);
    close(rootfd);
    return rc;
}

kiln_err kiln_archive_dir_installed(const char *dir) {
    struct stat sb;
    if (lstat(dir, &sb) != 0) return kiln_fail_errno(KILN_ERR_NOTFOUND, "cannot look at '%s'", dir);
    KILN_FAIL_IF(S_ISLNK(sb.st_mode), KILN_ERR_CONFLICT, "'%s' is a symbolic link", dir);
    KILN_FAIL_IF(!S_ISDIR(sb.st_mode), KILN_ERR_CONFLICT, "'%s' is not a directory", dir);
    int rootfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0) return kiln_fail_errno(KILN_ERR_IO, "cannot open directory '%s'", dir);
    kiln_err rc = KILN_OK;
    kiln_export_entry *list = NULL;
    size_t n = 0;
    kiln_manifest *m = NULL;
    char *text = NULL, why[512];
    size_t len = 0;
    char *mpath = kiln_path_join(dir, KILN_MANIFEST_NAME);
    KILN_CHECK_IF(rc, out, !mpath, KILN_ERR_NOMEM, "out of memory");
    /* Its contents first: anything kiln would not have put there is named. */
    rc = kiln_export_walk(rootfd, dir, &list, &n);
    if (rc == KILN_ERR_NOMEM) goto out;
    snprintf(why, sizeof why, "%s", kiln_errmsg());
    KILN_CHECK_IF(rc, out, rc, KILN_ERR_CONFLICT,
                  "'%s' is not a model directory as kiln installs one: %s", dir, why);
    bool has_manifest = false;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i].path, KILN_MANIFEST_NAME)) has_manifest = true;
    KILN_CHECK_IF(rc, out, !has_manifest, KILN_ERR_CONFLICT,
                  "'%s' is not a model directory as kiln installs one: it has no %s", dir,
                  KILN_MANIFEST_NAME);
    rc = kiln_read_file(mpath, KILN_MANIFEST_MAX_BYTES, &text, &len);
    if (!rc) rc = kiln_manifest_parse(text, len, mpath, &m);
    if (rc == KILN_ERR_NOMEM) goto out;
    snprintf(why, sizeof why, "%s", kiln_errmsg());
    KILN_CHECK_IF(rc, out, rc, KILN_ERR_CONFLICT,
                  "'%s' is not a model directory as kiln installs one: %s", dir, why);
    for (size_t i = 0; i < n; i++)
        KILN_CHECK_IF(rc, out,
                      strcmp(list[i].path, KILN_MANIFEST_NAME) &&
                          !kiln_manifest_find(m, list[i].path),
                      KILN_ERR_CONFLICT,
                      "'%s' is not a model directory as kiln installs one: it holds '%s', which "
                      "its %s does not list",
                      dir, list[i].path, KILN_MANIFEST_NAME);
out:
    kiln_manifest_free(m);
    kiln_export_entries_free(list, n);
    free(text);
    free(mpath);
    close(rootfd);
    return rc;
}

kiln_err kiln_archive_dir_replaceable(const char *dir, const char *who) {
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        if (errno == ENOENT) return KILN_OK;
        return kiln_fail_errno(KILN_ERR_IO, "cannot look at '%s'", dir);
    }
    if (S_ISDIR(sb.st_mode) && kiln_path_dir_state(dir) == KILN_DIR_EMPTY) return KILN_OK;
    kiln_err rc = kiln_archive_dir_installed(dir);
    if (rc != KILN_ERR_CONFLICT) return rc;
    char why[768];
    snprintf(why, sizeof why, "%s", kiln_errmsg());
    return kiln_fail(KILN_ERR_CONFLICT,
                     "%s; %s replaces only a model directory kiln installed (or an empty one), "
                     "and leaves this one as it is: give a new or an empty directory",
                     why, who);
}
