/* names.c - what both sides of the registry read names and digests by: the naming rule of
 * models, versions and channels, NAME@REF, and "sha256:<hex>" digests. */
#include <stdio.h>
#include <string.h>

#include "registry_common.h"

/* ---- names ---- */

static kiln_err check_chars(const char *what, const char *s, bool version) {
    const char *set = version ? "[A-Za-z0-9._+-], starting with a letter or digit"
                              : "[a-z0-9._-], starting with a letter or digit";
    KILN_FAIL_IF(!s || !*s, KILN_ERR_USAGE, "%s name is empty", what);
    size_t n = strlen(s);
    KILN_FAIL_IF(n > KILN_REGISTRY_NAME_MAX, KILN_ERR_USAGE,
                 "%s name '%.64s...' is longer than %d characters", what, s,
                 KILN_REGISTRY_NAME_MAX);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  (version && c >= 'A' && c <= 'Z') ||
                  (i > 0 && (c == '.' || c == '_' || c == '-' || (version && c == '+')));
        KILN_FAIL_IF(!ok, KILN_ERR_USAGE, "%s name '%s' has a character outside %s at offset %zu",
                     what, s, set, i);
    }
    KILN_FAIL_IF(strstr(s, ".."), KILN_ERR_USAGE, "%s name '%s' contains '..'", what, s);
    return KILN_OK;
}

kiln_err kiln_registry_check_name(const char *what, const char *s) {
    return check_chars(what, s, false);
}

kiln_err reg_check_version_chars(const char *s) {
    return check_chars("version", s, true);
}

/* The naming rule (docs/registry.md, "Names"): a version begins with a digit, or with 'v' or
 * 'V' and a digit; nothing else does. So NAME@REF reads one way only, whatever a registry
 * holds or answers. */
bool kiln_registry_looks_like_version(const char *s) {
    if (!s) return false;
    if (s[0] == 'v' || s[0] == 'V') s++;
    return s[0] >= '0' && s[0] <= '9';
}

kiln_err kiln_registry_check_version(const char *s) {
    KILN_TRY(check_chars("version", s, true));
    KILN_FAIL_IF(!kiln_registry_looks_like_version(s), KILN_ERR_USAGE,
                 "version name '%s' does not look like a version: a version begins with a digit "
                 "or with 'v' and a digit (1.2.0, v2, 2026-01-05); other names are channels'",
                 s);
    return KILN_OK;
}

kiln_err kiln_registry_check_channel(const char *s) {
    KILN_TRY(check_chars("channel", s, false));
    KILN_FAIL_IF(kiln_registry_looks_like_version(s), KILN_ERR_USAGE,
                 "channel name '%s' looks like a version (it begins with a digit or with 'v' and "
                 "a digit): a channel name begins with a letter and is not v<digit>..., so that "
                 "NAME@%s can only mean one thing",
                 s, s);
    return KILN_OK;
}

kiln_err kiln_registry_ref_parse(const char *ref, char model[KILN_REGISTRY_NAME_MAX + 1],
                                 char what[KILN_REGISTRY_NAME_MAX + 1], bool *is_version) {
    *is_version = false;
    KILN_FAIL_IF(!reg_ref_split(ref, model, what), KILN_ERR_USAGE,
                 "'%s' is not NAME@CHANNEL or NAME@VERSION", ref ? ref : "");
    KILN_TRY(kiln_registry_check_name("model", model));
    *is_version = kiln_registry_looks_like_version(what);
    kiln_err rc =
        *is_version ? kiln_registry_check_version(what) : kiln_registry_check_channel(what);
    return rc ? kiln_errprefix(rc, "'%s': ", ref) : KILN_OK;
}

bool reg_ref_split(const char *ref, char model[KILN_REGISTRY_NAME_MAX + 1],
                   char what[KILN_REGISTRY_NAME_MAX + 1]) {
    model[0] = what[0] = 0;
    const char *at = ref ? strchr(ref, '@') : NULL;
    if (!at || at == ref || (size_t)(at - ref) > KILN_REGISTRY_NAME_MAX || !at[1] ||
        strlen(at + 1) > KILN_REGISTRY_NAME_MAX)
        return false;
    snprintf(model, KILN_REGISTRY_NAME_MAX + 1, "%.*s", (int)(at - ref), ref);
    snprintf(what, KILN_REGISTRY_NAME_MAX + 1, "%s", at + 1);
    return true;
}

/* ---- digests ---- */

bool reg_digest_hex(const char *digest, char hex[KILN_SHA256_HEX]) {
    if (!digest || strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 7 + 64) return false;
    for (int i = 0; i < 64; i++) {
        char c = digest[7 + i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    memcpy(hex, digest + 7, 65);
    return true;
}

bool reg_oci_url(const char *url) {
    return url && (!strncmp(url, "oci://", 6) || !strncmp(url, "oci+http://", 11));
}

bool kiln_registry_is_oci(const char *url) {
    return reg_oci_url(url);
}
